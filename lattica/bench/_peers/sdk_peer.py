"""A rust-libp2p peer for the interop tests and ``lattica bench libp2p``: the GradientHQ Lattica
SDK (rust-libp2p 0.54), run as a script by the SDK's own interpreter (a venv of its own: its
package is also named ``lattica``; never imported by ours).

``sdk_peer.py dial <multiaddr>``: start an SDK node on 127.0.0.1 that dials the address as its
bootstrap peer, wait until it has identified that peer and measured a ping, print one JSON line
(its PeerId, what identify told it, the ping's round trip) and stop.

``sdk_peer.py listen``: start an SDK node on 127.0.0.1, print one JSON line (its PeerId and
addresses), and on each line read from stdin (a PeerId) print what it knows of that peer; stop at
the end of stdin.

``sdk_peer.py serve``: start an SDK node on 127.0.0.1 serving the ``Echo`` service on its RPC
(``/rpc/req-resp/1.0.0``, see lattica/bench/_peers/sdk_rpc.py): ``Echo.echo`` answers with the
request's bytes, ``Echo.sink`` with one byte. Print one JSON line (its PeerId and addresses), serve
until stdin ends, then print one JSON line with the size and sha256 of each request it echoed.

``sdk_peer.py bench <multiaddr> <count>``: ``count`` times, a fresh SDK node dials the address as
its bootstrap peer; print one JSON line with, for each, the milliseconds from ``build()`` returning
until the peer is among its connected peers, and the round trip of the first ping rust-libp2p's
ping behaviour measured on that connection (the SDK exposes no dial-and-wait, no ping on demand
and no raw streams: these are what it lets one time).

``sdk_peer.py sink <multiaddr> <size>``: a fresh SDK node dials the address as its bootstrap peer
and, through its Python API (``Echo(node).get_stub(peer).sink``), calls ``Echo.sink`` there once
with one byte (unmeasured) and once with ``size`` random bytes; print one JSON line with the
seconds of the second call, from the stub's call to its answer.

``sdk_peer.py kad [relay:<multiaddr> ...] [bootstrap multiaddr ...]``: start an SDK node on
127.0.0.1 (TCP and QUIC) with these bootstrap peers (and, for each ``relay:`` one, that relay
server: the SDK reserves on it and publishes its relayed address on ``p2p-circuit-broadcast``), its key, blockstore and DHT folder in a temporary folder removed at the end;
print one JSON line (its PeerId and addresses), then answer each JSON line read from stdin with
one JSON line, ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``, until stdin ends (then
it closes the node and exits). Its Kademlia speaks ``/lattica/1.0.0`` (the SDK's protocol, not
``/ipfs/kad/1.0.0``), its Bitswap ``/ipfs/bitswap/1.2.0``. The operations (``timeout``, seconds,
optional on each: a call the SDK has not answered by then is answered ``{"ok": false}``, 30 s
unless told; the SDK's ``get_providers`` never returns when the node has no peer):

- ``{"op": "store", "key": str, "value": hex, "expiration": float, "subkey": str|null}``: the
  raw ``store_with_subkey`` (no pickle): a record under the key's UTF-8 bytes (``key#subkey``
  with a subkey, plus a ``key#index`` record listing the subkeys) whose value is bincode's
  ``ValueWithTime {value: Vec<u8>, expiration_time: f64}`` (a varint length, the bytes, the f64
  little-endian), put with quorum one (a quorum failure, no known peer or a timeout is success).
- ``{"op": "get", "key": str}``: the raw ``get_with_subkey``: ``{"value": hex|null,
  "expiration": float}``, or ``{"subkeys": {subkey: {"value": hex, "expiration": float}}}`` when
  a ``key#index`` record exists; the bytes as stored, never unpickled (expired values and any
  error read as not found).
- ``{"op": "provide", "key": str}`` / ``{"op": "providers", "key": str}``: ``start_providing``
  and ``get_providers`` (``{"providers": [PeerId]}``, the first batch the lookup finds) on the
  key's UTF-8 bytes (not a multihash).
- ``{"op": "put_block", "data": hex}``: ``{"cid": str}`` (CIDv1, raw, sha2-256, base32), into the
  blockstore only (nothing announced in the DHT); ``{"op": "get_block", "cid": str, "timeout":
  float}``: ``{"data": hex, "from": PeerId|null}`` (null: it was local), asking the connected
  peers over Bitswap (the SDK waits whole seconds, at least one; a block nobody has is an error
  then, not a hang).
- ``{"op": "get_blocks", "cids": [str], "threads": int, "timeout": float}``: ``get_block`` of
  every CID, ``threads`` of them at once (a thread pool; the SDK's call lets go of the GIL), timed
  here from the first call to the last answer: ``{"seconds": float, "bytes": int, "blocks": int,
  "from": {PeerId or "local": blocks}, "verified": int}`` (the bytes stay here; ``verified``: the
  blocks whose sha2-256 is their CID's digest, checked after the clock stops). ``timeout`` is the
  whole operation's; any block not fetched makes the answer an error.
- ``{"op": "gets", "keys": [str]}``: the raw ``get_with_subkey`` of each key in turn, each timed
  here: ``{"ms": [float], "found": [bool]}`` (found: a value or subkeys came back).
- ``{"op": "peers"}``: ``{"peers": [PeerId]}``, the SDK's address book: the peers identify
  showed with protocol version ``/lattica/1.0.0`` on a direct connection, kept after they
  disconnect (a peer with another protocol version is disconnected). The routing table is not
  exposed (no ``table``).
- ``{"op": "connect", "peer_id": str}``: the SDK dials a PeerId whose addresses it already knows
  (from Kademlia); the Python API cannot dial an address after start (only bootstraps do), and
  dialing a connected peer is an error.
- ``{"op": "rpc", "peer": str, "method": "Service.method", "data": hex, "how": "call" | "stream" |
  "iter"}``: the SDK's raw RPC client (``get_client(peer)``: ``call`` over
  ``/rpc/req-resp/1.0.0``, ``call_stream`` and ``call_stream_iter`` over ``/rpc/stream/1.0.0``)
  with the bytes as they are: ``{"data": hex}``, or ``{"items": [hex]}`` for ``iter``.
- ``{"op": "addresses", "peer": str}``: ``{"addrs": [str]}``, what the SDK's swarm knows of the
  peer's addresses (``get_peer_addresses``; e.g. a relayed one read on ``p2p-circuit-broadcast``).
- ``{"op": "rpc_pickled", "peer": str, "method": "Service.method"}``: what the SDK's stub sends for
  a method without protobuf types (a pickled ``{"a": 1}``): ``{"data": hex}`` or the error.

In this mode the node serves ``Echo`` (below): ``echo`` and ``sink``, ``count`` (a streaming
method: ``int(request)`` items ``b"0"``, ``b"1"``, ...) and ``legacy`` (no protobuf types, called
without data: the SDK pickles its answer, as services without ``*_pb2`` types do).

The RPC's data is typed with ``Raw``, a class holding bytes as they are: the SDK treats any class
with ``SerializeToString``/``ParseFromString`` as protobuf and hands it the bytes, so nothing is
pickled on either side (and nobody unpickles)."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# the SDK's lattica (this script runs under the SDK's interpreter), not ours: looked up by name
sdk: Any = importlib.import_module("lattica")

LISTEN = ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]
echoed: list[dict] = []  # what Echo.echo answered, for serve's last line


class Raw:
    """Raw bytes passed for a protobuf message: the SDK's ``is_protobuf_class`` only asks for
    these two methods, and then neither pickles nor unpickles."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return self.data

    def ParseFromString(self, data: bytes) -> None:  # noqa: N802 (protobuf's name)
        self.data = bytes(data)


class Echo(sdk.ConnectionHandler):
    """The service ``serve`` offers on ``/rpc/req-resp/1.0.0`` (and ``sink`` calls)."""

    @sdk.rpc_method
    def echo(self, request: Raw) -> Raw:
        """The request's bytes back; their size and sha256 kept for serve's report."""
        _raw(request)
        echoed.append({"size": len(request.data), "sha256": hashlib.sha256(request.data).hexdigest()})
        return request

    @sdk.rpc_method
    def sink(self, request: Raw) -> Raw:
        """One byte back, whatever came (the throughput bench's responder)."""
        _raw(request)
        return Raw(b"k")

    @sdk.rpc_stream_iter
    def count(self, request: Raw):
        """``int(request)`` items, each its index in decimal (a streaming method: the SDK sends
        each item's bytes as they are)."""
        _raw(request)
        for i in range(int(request.data or b"0")):
            yield str(i).encode()

    @sdk.rpc_method
    def legacy(self):
        """No protobuf types: the SDK pickles this answer (called with no data)."""
        return {"legacy": True}


def _raw(request: object) -> None:
    """Refuse a request the SDK did not hand over as raw bytes (it fell back to unpickling)."""
    if not isinstance(request, Raw):
        raise TypeError(f"expected raw bytes, got {type(request).__name__}")


def _node(
    listen: list[str], bootstraps: list[str] | None = None, home: str | None = None, relays: list[str] | None = None
) -> Any:
    """An SDK node on ``listen``, dialing ``bootstraps``; no mDNS, UPnP or AutoNAT. With ``home``,
    its key, blockstore and DHT folder go there (else the SDK leaves a fresh ``<uuid>.key`` and
    ``<uuid>.storage`` in the temporary folder at every start)."""
    builder = sdk.Lattica.builder().with_listen_addrs(listen)
    if bootstraps:
        builder = builder.with_bootstraps(bootstraps)
    if relays:
        builder = builder.with_relay_servers(relays)
    if home is not None:
        builder = builder.with_key_path(f"{home}/key").with_storage_path(f"{home}/blocks")
        builder = builder.with_dht_db_path(f"{home}/dht")
    return builder.with_mdns(False).with_upnp(False).with_autonat(False).build()


def _known(info) -> dict:
    return {
        "agent_version": info.agent_version,
        "protocol_version": info.protocol_version,
        "listen_addrs": list(info.listen_addresses),
        "protocols": list(info.protocols),
    }


def _listening_ports(proto: str = "tcp") -> list[int]:
    """The TCP ports this process listens on, or its UDP sockets' (the SDK does not tell its
    listen addresses)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open(f"/proc/self/net/{proto}") as f:
        next(f)
        for line in f:
            parts = line.split()
            ip, port = parts[1].split(":")
            # (listening: TCP's LISTEN state; a UDP socket bound to 127.0.0.1, where we listen)
            if (parts[3] == "0A" or (proto == "udp" and ip == "0100007F")) and parts[9] in inodes:
                ports.append(int(port, 16))
    return ports


def _hello(node: Any) -> None:
    """Once the node listens on TCP and QUIC, print its PeerId and addresses as one JSON line."""
    deadline = time.time() + 10
    while not ((tcp := _listening_ports()) and (udp := _listening_ports("udp"))) and time.time() < deadline:
        time.sleep(0.02)
    addrs = [f"/ip4/127.0.0.1/tcp/{p}/p2p/{node.peer_id()}" for p in tcp]
    addrs += [f"/ip4/127.0.0.1/udp/{p}/quic-v1/p2p/{node.peer_id()}" for p in udp]
    print(json.dumps({"peer_id": node.peer_id(), "addrs": addrs}), flush=True)


def listen() -> None:
    node = _node(LISTEN)
    _hello(node)
    for line in sys.stdin:
        peer = line.strip()
        info = node.get_peer_info(peer)
        print(
            json.dumps({"identify": _known(info) if info else None, "rtt_ms": info.rtt_ms if info else None}),
            flush=True,
        )
    node.close()


def serve() -> None:
    node = _node(LISTEN)
    Echo(node)
    _hello(node)
    sys.stdin.read()
    print(json.dumps({"echoed": echoed}), flush=True)
    node.close()


def _own_stdout() -> None:
    """Keep stdout for our JSON lines: the SDK's tracing (with RUST_LOG) writes to file
    descriptor 1, which now goes to stderr; ``sys.stdout`` writes to a copy of the original."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(fd, "w", buffering=1)


def _in_time(call: Callable[[], dict], timeout: float) -> dict:
    """``call()`` in a thread of its own, given up after ``timeout`` seconds (some SDK calls
    never return, e.g. ``get_providers`` with no peer); the thread stays behind, blocked in the
    SDK, until the node closes."""
    box: dict = {}

    def run() -> None:
        try:
            box["answer"] = call()
        except Exception as e:  # (the SDK raises RuntimeError, ValueError, even RuntimeWarning)
            box["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {"ok": False, "error": f"the SDK did not answer within {timeout} s"}
    if "error" in box:
        return {"ok": False, "error": box["error"]}
    return {"ok": True, **box["answer"]}


def _kad_op(node: Any, request: dict) -> Callable[[], dict]:
    """The SDK call answering ``request`` (see the module's docstring), through the raw Rust
    object: the Python wrapper's ``store``/``get`` pickle and unpickle."""
    raw = node._lattica_instance
    op = request["op"]
    if op == "store":
        key, value, subkey = request["key"], bytes.fromhex(request["value"]), request.get("subkey")
        expiration = float(request.get("expiration") or time.time() + 600)
        return lambda: raw.store_with_subkey(key, value, expiration, subkey) or {}
    if op == "get":
        return lambda: _got(raw.get_with_subkey(request["key"]))
    if op == "provide":
        return lambda: raw.start_providing(request["key"]) or {}
    if op == "providers":
        return lambda: {"providers": list(raw.get_providers(request["key"]))}
    if op == "put_block":
        return lambda: {"cid": raw.put_block(bytes.fromhex(request["data"]))}
    if op == "get_block":
        seconds = _block_seconds(request)
        return lambda: _block(*raw.get_block(request["cid"], timeout_secs=seconds))
    if op == "get_blocks":
        seconds = _block_seconds(request)
        return lambda: _get_blocks(raw, list(request["cids"]), int(request.get("threads", 8)), seconds)
    if op == "gets":
        return lambda: _gets(raw, list(request["keys"]))
    if op == "peers":
        return lambda: {"peers": list(raw.get_all_peers())}
    if op == "connect":
        return lambda: raw.connect(request["peer_id"]) or {}
    if op == "addresses":
        return lambda: {"addrs": [str(a) for a in node.get_peer_addresses(request["peer"])]}
    if op == "rpc":
        return lambda: _rpc(node, request)
    if op == "rpc_pickled":
        import pickle  # (what the SDK's stub sends: made here, never loaded)

        data = pickle.dumps({"a": 1})
        seconds = math.ceil(float(request.get("timeout", 30)))
        return lambda: {
            "data": bytes(node.get_client(request["peer"]).call(request["method"], data).result(seconds)).hex()
        }
    raise ValueError(f"unknown op {op!r}")


def _rpc(node: Any, request: dict) -> dict:
    """``rpc`` (see the module's docstring): the raw client, bytes in and out."""
    client = node.get_client(request["peer"])
    method, data, how = request["method"], bytes.fromhex(request.get("data", "")), request.get("how", "call")
    if how == "iter":
        return {"items": [bytes(item).hex() for item in client.call_stream_iter(method, data)]}
    answer = client.call_stream(method, data) if how == "stream" else client.call(method, data)
    seconds = math.ceil(float(request.get("timeout", 30)))  # (the SDK's future waits whole seconds)
    return {"data": bytes(answer.result(seconds) if hasattr(answer, "result") else answer).hex()}


def _got(result: Any) -> dict:
    """``get_with_subkey``'s answer as JSON: ``(value, expiration)``, ``{subkey: (value,
    expiration)}`` or None."""
    if result is None:
        return {"value": None}
    if isinstance(result, dict):
        return {"subkeys": {k: {"value": bytes(v).hex(), "expiration": e} for k, (v, e) in result.items()}}
    value, expiration = result
    return {"value": bytes(value).hex(), "expiration": expiration}


def _block(sender: str | None, data: bytes) -> dict:
    return {"data": bytes(data).hex(), "from": sender}


def _get_blocks(raw: Any, cids: list[str], threads: int, seconds: int) -> dict:
    """``get_blocks`` (see the module's docstring): every CID fetched, ``threads`` at once."""
    with ThreadPoolExecutor(max(1, threads)) as pool:
        t0 = time.perf_counter()
        got = list(pool.map(lambda cid: raw.get_block(cid, timeout_secs=seconds), cids))
        elapsed = time.perf_counter() - t0
    senders: dict[str, int] = {}
    verified = 0
    for cid, (sender, data) in zip(cids, got):
        senders[sender or "local"] = senders.get(sender or "local", 0) + 1
        verified += _digest(cid) == hashlib.sha256(bytes(data)).digest()
    return {
        "seconds": elapsed,
        "bytes": sum(len(data) for _, data in got),
        "blocks": len(got),
        "from": senders,
        "verified": verified,
    }


def _digest(cid: str) -> bytes | None:
    """The sha2-256 digest a base32 CIDv1 names (None for another hash or encoding)."""
    if not cid.startswith("b"):
        return None
    body = cid[1:].upper()
    raw = base64.b32decode(body + "=" * (-len(body) % 8))
    if len(raw) < 36 or raw[0] != 1 or raw[-34:-32] != b"\x12\x20":
        return None
    return raw[-32:]


def _gets(raw: Any, keys: list[str]) -> dict:
    """``gets`` (see the module's docstring): each key's ``get_with_subkey``, timed."""
    ms, found = [], []
    for key in keys:
        t0 = time.perf_counter()
        try:
            got = raw.get_with_subkey(key)
        except Exception:  # (the SDK raises for a key nobody holds, as for any failure)
            got = None
        ms.append((time.perf_counter() - t0) * 1e3)
        found.append(got is not None)
    return {"ms": ms, "found": found}


def _block_seconds(request: dict) -> int:
    """The whole seconds (at least one) the SDK's ``get_block`` waits for a ``timeout``."""
    return max(1, math.ceil(float(request.get("timeout", 30))))


def _patience(request: dict) -> float:
    """How long we wait for the SDK's answer: ``timeout``, or for ``get_block`` a little longer
    than the SDK's own wait, so that its error (the block not found) is what the caller sees."""
    if request["op"] in ("get_block", "get_blocks"):
        return _block_seconds(request) + 5.0
    return float(request.get("timeout", 30))


def kad(args: list[str]) -> None:
    _own_stdout()
    relays = [a[len("relay:") :] for a in args if a.startswith("relay:")]
    bootstraps = [a for a in args if not a.startswith("relay:")]
    with tempfile.TemporaryDirectory(prefix="sdk-kad-") as home:
        node = _node(LISTEN, bootstraps, home, relays)
        Echo(node)
        _hello(node)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                answer = _in_time(_kad_op(node, request), _patience(request))
            except Exception as e:  # (a bad line: not JSON, an unknown op, a missing field)
                answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(answer), flush=True)
        node.close()
    sys.stdout.flush()
    os._exit(0)  # (not the interpreter's shutdown: threads given up on may still sit in the SDK)


def dial(addr: str, wait: float = 15.0) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    node = _node(LISTEN, [addr])
    out: dict = {"peer_id": node.peer_id()}
    deadline = time.time() + wait
    info = None
    rtt = None
    while time.time() < deadline:
        info = node.get_peer_info(peer)
        try:
            rtt = node.get_peer_rtt(peer)  # (seconds, once a ping came back)
        except RuntimeError:
            rtt = None
        if info is not None and info.protocols and rtt:
            break
        time.sleep(0.05)
    if info is not None:
        out["identify"] = _known(info)
        out["rtt_ms"] = rtt * 1e3 if rtt else None
    out["peers"] = node.get_all_peers()
    node.close()
    return out


def bench(addr: str, count: int) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    connect_ms: list[float] = []
    rtt_ms: list[float] = []
    for _ in range(count):
        node = _node(LISTEN[:1], [addr])
        t0 = time.perf_counter()
        deadline = t0 + 10
        while peer not in node.get_all_peers() and time.perf_counter() < deadline:
            time.sleep(0.0002)
        connect_ms.append((time.perf_counter() - t0) * 1e3)
        rtt = None
        while not rtt and time.perf_counter() < deadline:
            try:
                rtt = node.get_peer_rtt(peer)  # (seconds, once a ping came back)
            except RuntimeError:
                time.sleep(0.0002)
        if rtt:
            rtt_ms.append(rtt * 1e3)
        node.close()
    return {"connect_ms": connect_ms, "rtt_ms": rtt_ms}


def sink(addr: str, size: int) -> dict:
    peer = addr.rsplit("/p2p/", 1)[1]
    node = _node(LISTEN[:1], [addr])
    deadline = time.perf_counter() + 10
    while peer not in node.get_all_peers() and time.perf_counter() < deadline:
        time.sleep(0.001)
    stub = Echo(node).get_stub(peer)
    payload = Raw(os.urandom(size))
    stub.sink(Raw(b"w")).result(timeout=60)  # warm-up: the stub's first call
    t0 = time.perf_counter()
    answer = stub.sink(payload).result(timeout=180)
    seconds = time.perf_counter() - t0
    node.close()
    if not isinstance(answer, Raw) or answer.data != b"k":
        raise RuntimeError(f"Echo.sink answered {answer!r}")
    return {"seconds": seconds, "size": size}


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        print(json.dumps(bench(sys.argv[2], int(sys.argv[3]))), flush=True)
    elif sys.argv[1] == "sink":
        print(json.dumps(sink(sys.argv[2], int(sys.argv[3]))), flush=True)
    elif sys.argv[1] == "dial":
        print(json.dumps(dial(sys.argv[2])), flush=True)
    elif sys.argv[1] == "listen":
        listen()
    elif sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "kad":
        kad(sys.argv[2:])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
