"""Lattica: a pure-Python peer-to-peer actor framework for decentralized AI."""

from . import errors
from .identify import PeerInfo
from .identity import KeyPair, PeerId
from .multiaddr import Multiaddr
from .node import Node

__version__ = "0.1.0"
__all__ = ["errors", "KeyPair", "Multiaddr", "Node", "PeerId", "PeerInfo", "__version__"]
