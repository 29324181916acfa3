"""Benchmarks shipped with the package (``lattica bench ...``): they print figures, assert nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lattica.errors import NodeClosed

if TYPE_CHECKING:
    from lattica._host import Host
    from lattica._node import Node
    from lattica._runtime import Runtime


def host_of(node: Node) -> Host:
    """The host of a started ``node`` (NodeClosed if it is not running)."""
    host = node.host
    if host is None:
        raise NodeClosed("the node is not running")
    return host


def runtime_of(node: Node) -> Runtime:
    """The actor runtime of a started ``node`` (NodeClosed if it is not running)."""
    host = node.host
    if host is None or host.runtime is None:
        raise NodeClosed("the node is not running")
    return host.runtime
