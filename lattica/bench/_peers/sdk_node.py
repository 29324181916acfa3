"""An SDK node (the GradientHQ Lattica SDK, rust-libp2p 0.54) with its Kademlia and Bitswap, run
as ``sdk_peer.py kad`` by the SDK venv's interpreter and driven from asyncio over JSON lines
(issue 49's interop peer). The wire facts (record values, CIDs, protocols) are in sdk_peer.py's
docstring."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

from . import SDK_PEER
from .jsonlines import JsonLinesPeer, PeerError


class SdkError(PeerError):
    """An operation the SDK node answered with ``{"ok": false}``, or a driver that stopped."""


@dataclasses.dataclass(frozen=True)
class SdkValue:
    """A value read from the SDK's DHT: the bytes stored and their expiration (unix time)."""

    value: bytes
    expiration: float


class SdkNode(JsonLinesPeer):
    """One running SDK node on 127.0.0.1 (TCP and QUIC): its PeerId, its addresses, a method
    per operation of ``sdk_peer.py kad`` (one at a time), and ``stop()``."""

    error = SdkError
    what = "the SDK node"

    @classmethod
    async def start(
        cls,
        sdk_python: pathlib.Path,
        bootstraps: Sequence[str] = (),
        timeout: float = 30.0,
        relays: Sequence[str] = (),
    ) -> SdkNode:
        """Start an SDK node dialing ``bootstraps`` (multiaddrs ending in ``/p2p/<PeerId>``),
        with ``relays`` as its relay servers (it reserves on them), and wait for its PeerId and
        addresses; ``sdk_python`` is the SDK venv's interpreter, used as given (resolving its
        symlink would lose the venv)."""
        argv = [str(sdk_python), str(SDK_PEER), "kad", *(f"relay:{r}" for r in relays), *bootstraps]
        return await cls.launch(argv, timeout)

    def addr(self, transport: str = "tcp") -> str:
        """Its address on ``transport`` ("tcp" or "quic"), with its PeerId."""
        return next(a for a in self.addrs if ("/quic-v1" in a) == (transport == "quic"))

    async def store(
        self, key: str, value: bytes, expiration: float, subkey: str | None = None, timeout: float = 30.0
    ) -> None:
        """Put ``value`` (bytes as they are, no pickle) under ``key`` (or ``key``'s ``subkey``)
        until ``expiration`` (unix time), replicated with quorum one."""
        await self._call("store", timeout, key=key, value=value.hex(), expiration=expiration, subkey=subkey)

    async def get(self, key: str, timeout: float = 30.0) -> SdkValue | dict[str, SdkValue] | None:
        """The value under ``key``, the values of its subkeys when it has some, or None (not
        found, expired, or any error: the SDK tells them apart no further)."""
        answer = await self._call("get", timeout, key=key)
        if "subkeys" in answer:
            return {k: SdkValue(bytes.fromhex(v["value"]), v["expiration"]) for k, v in answer["subkeys"].items()}
        if answer["value"] is None:
            return None
        return SdkValue(bytes.fromhex(answer["value"]), answer["expiration"])

    async def provide(self, key: str, timeout: float = 30.0) -> None:
        """Announce this node as a provider of ``key`` (its UTF-8 bytes)."""
        await self._call("provide", timeout, key=key)

    async def providers(self, key: str, timeout: float = 30.0) -> list[str]:
        """The PeerIds the first answer of a provider lookup of ``key`` names (SdkError when the
        SDK has not answered within ``timeout``: with no peer it never does)."""
        return list((await self._call("providers", timeout, key=key))["providers"])

    async def put_block(self, data: bytes, timeout: float = 30.0) -> str:
        """Store ``data`` in the node's blockstore; its CID (v1, raw, sha2-256, base32)."""
        return str((await self._call("put_block", timeout, data=data.hex()))["cid"])

    async def get_block(self, cid: str, timeout: float = 30.0) -> bytes:
        """The block ``cid``, from the blockstore or over Bitswap; SdkError when none came within
        ``timeout`` (which the SDK rounds up to whole seconds)."""
        return bytes.fromhex((await self._call("get_block", timeout, cid=cid))["data"])

    async def get_blocks(self, cids: Sequence[str], threads: int = 16, timeout: float = 300.0) -> dict[str, Any]:
        """``get_block`` of every CID, ``threads`` at once, timed by the driver: ``{"seconds",
        "bytes", "blocks", "from": {PeerId or "local": blocks}, "verified"}`` (the blocks stay
        in the driver; SdkError if any was not fetched within ``timeout``, the whole call's)."""
        return await self._call("get_blocks", timeout, cids=list(cids), threads=threads)

    async def gets(self, keys: Sequence[str], timeout: float = 300.0) -> tuple[list[float], list[bool]]:
        """The SDK's ``get`` of each key in turn, each timed by the driver: the milliseconds of
        each and whether it found a value."""
        answer = await self._call("gets", timeout, keys=list(keys))
        return list(answer["ms"]), list(answer["found"])

    async def peers(self, timeout: float = 30.0) -> list[str]:
        """The SDK's address book: peers identified as ``/lattica/1.0.0``, kept after they leave."""
        return list((await self._call("peers", timeout))["peers"])

    async def rpc(self, peer: str, method: str, data: bytes = b"", how: str = "call", timeout: float = 30.0) -> Any:
        """Call ``method`` on ``peer`` with the SDK's raw client (``how``: "call", "stream" or
        "iter"): the answer's bytes, or a list of items for "iter"."""
        got = await self._call("rpc", timeout, peer=peer, method=method, data=data.hex(), how=how)
        return [bytes.fromhex(i) for i in got["items"]] if how == "iter" else bytes.fromhex(got["data"])

    async def addresses(self, peer: str, timeout: float = 30.0) -> list[str]:
        """What the SDK knows of ``peer``'s addresses."""
        return list((await self._call("addresses", timeout, peer=peer))["addrs"])

    async def rpc_pickled(self, peer: str, method: str, timeout: float = 30.0) -> bytes:
        """Call ``method`` on ``peer`` with a pickled request, as the SDK's stub does for an
        untyped method."""
        return bytes.fromhex((await self._call("rpc_pickled", timeout, peer=peer, method=method))["data"])

    async def connect(self, peer_id: str, timeout: float = 30.0) -> None:
        """Dial ``peer_id`` at addresses the node already knows (it cannot be given one); an
        error when it knows none or is already connected."""
        await self._call("connect", timeout, peer_id=peer_id)
