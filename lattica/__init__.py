"""Lattica: a pure-Python peer-to-peer actor framework for decentralized AI."""

from . import dht, errors
from .actor import actor
from .api import aget_actor, akill, get_actor, init, kill, monitor, nat_status, node, nodes, shutdown
from .future import Future, get, wait
from .identify import PeerInfo
from .identity import KeyPair, PeerId
from .multiaddr import Multiaddr
from .node import Node
from .runtime import ActorRef, current_caller

__version__ = "0.1.0"
__all__ = [
    "ActorRef", "Future", "KeyPair", "Multiaddr", "Node", "PeerId", "PeerInfo", "actor", "aget_actor", "current_caller", "akill", "dht", "errors", "monitor", "nat_status", "nodes",
    "get", "get_actor", "init", "kill", "node", "shutdown", "wait", "__version__",
]
