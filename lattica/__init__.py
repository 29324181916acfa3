"""Lattica: a pure-Python peer-to-peer actor framework for decentralized AI."""

from . import errors
from .identity import KeyPair, PeerId
from .multiaddr import Multiaddr

__version__ = "0.1.0"
__all__ = ["errors", "KeyPair", "PeerId", "Multiaddr", "__version__"]
