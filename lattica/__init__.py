"""Lattica: a pure-Python peer-to-peer actor framework for decentralized AI."""

from typing import Any

from lattica import dht, errors
from lattica._api import (
    aget_actor,
    akill,
    exit_actor,
    get_actor,
    init,
    kill,
    link,
    monitor,
    nat_status,
    node,
    nodes,
    shutdown,
    unlink,
)
from lattica._future import Future, get, wait
from lattica._identify import PeerInfo
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica._node import Node
from lattica._remote import actor, public
from lattica._runtime import ActorRef, current_actor, current_caller, require_caller

__version__ = "0.1.0"
__all__ = [
    "ActorRef",
    "Future",
    "Supervisor",
    "current_actor",
    "KeyPair",
    "Multiaddr",
    "Node",
    "PeerId",
    "PeerInfo",
    "actor",
    "aget_actor",
    "current_caller",
    "akill",
    "dht",
    "errors",
    "exit_actor",
    "link",
    "unlink",
    "monitor",
    "nat_status",
    "nodes",
    "public",
    "require_caller",
    "get",
    "get_actor",
    "init",
    "kill",
    "node",
    "shutdown",
    "wait",
    "content",
    "crdt",
    "kad",
    "pubsub",
    "rendezvous",
    "shards",
    "__version__",
]


def __getattr__(name: str) -> Any:  # PEP 562: ``lattica.content`` loads on first use
    if name in ("content", "crdt", "kad", "pubsub", "rendezvous", "shards"):
        import importlib  # (the content plane and hashlib load when first used, not at start)

        return importlib.import_module(f"lattica.{name}")
    if name == "Supervisor":
        from lattica.supervisor import Supervisor  # (a starting node runs no supervisor: loaded when first named)

        return Supervisor
    raise AttributeError(f"module 'lattica' has no attribute {name!r}")
