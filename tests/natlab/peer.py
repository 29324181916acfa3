"""One lab node in its own process (run inside a lab namespace), driven by JSON lines.

    python -u peer.py --ip 10.1.0.2 [--relay] [--bootstrap ADDR ...]

Prints ``{"event": "ready", "peer_id": ..., "addrs": [...]}`` once listening, then answers one
JSON line per command read from stdin:

* ``{"cmd": "status"}`` -> the node's nat_status fields and its relay's counters
* ``{"cmd": "call", "peer": "<PeerId>"}`` -> spawn a Counter on that peer (found by PeerId alone),
  call it, and report the path the call took (``tcp``, ``quic`` or ``relay``) and how long it took
* ``{"cmd": "connect", "addr": A}`` -> ``{"ok": true}`` once connected to the peer at multiaddr A
* ``{"cmd": "autonat_ask", "peers": [P, ...], "transport": "tcp"|"quic"}`` -> ``{"answers": [...]}``:
  what each libp2p AutoNAT server answered about our address of that transport (``version``,
  ``asked``, ``outcome``, ``reason``)
* ``{"cmd": "members"}`` -> the membership view: ``{"members": [{"peer_id", "state"}, ...]}``; ``{"cmd": "members_debug"}``
  -> the membership table inside (incarnations, seals, connections, watchers), for failure reports
* ``{"cmd": "subscribe", "topic": T}``; ``{"cmd": "publish", "topic": T, "data": D}`` -> the
  peers it went to; ``{"cmd": "received", "topic": T}`` -> ``{"got": [data, ...], "via": [...]}``
  (what arrived since subscribing); ``{"cmd": "pubsub", "topic": T}`` -> the topic's mesh with
  the path to each mesh peer
* ``{"cmd": "crdt_open", "name": N}``; ``{"cmd": "crdt_set", "name": N, "key": K, "value": V}``
  (a map set in the document's root map "m"); ``{"cmd": "crdt_get", "name": N}`` -> ``{"m": ...,
  "peers": {peer: [paths]}, "stats": ...}``
* ``{"cmd": "stage", "stage": S, "stages": N}`` -> a replica of pipeline stage S of N
  (lattica/mesh/inference.py) on this node, registered as a shard
* ``{"cmd": "generate", "prompt": [...], "n": N}`` -> ``{"tokens": [...], "ms": [...]}``: N tokens
  through the pipeline's stubs, the time each took
* ``{"cmd": "trainer"}`` -> the RL trainer (lattica/mesh/weightsync.py) on this node, named
  ``trainer``; ``{"cmd": "worker", "trainer": "<PeerId>", "name": W, "cluster": C}`` -> a
  PolicyWorker here following that trainer; ``{"cmd": "sync", "workers": N, "versions": V,
  "mib": M}`` (on the trainer's node) -> ``{"rows": [...]}``: V policies of M MiB published, per
  version the seconds until all N workers run it and the bytes this node uploaded
* ``{"cmd": "put_policy", "mib": M, "seed": S}`` -> ``{"cid": ...}``; ``{"cmd": "time_fetch",
  "cid": C}`` -> ``{"seconds": ...}``: one fetch of it by this node alone
* ``{"cmd": "quit"}``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))

import lattica  # noqa: E402
import lattica.logging  # noqa: E402
import sample_actors as sa  # noqa: E402
from lattica._multiaddr import Multiaddr  # noqa: E402
from lattica.actors.nat.relay import RelayConfig  # noqa: E402
from lattica.config import ContentConfig, CrdtConfig, NatConfig, PubSubConfig  # noqa: E402
from lattica.nat import _holepunch as holepunch  # noqa: E402


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _call(node: lattica.Node, peer: lattica.PeerId, settle: float) -> dict:
    """Dial by PeerId, spawn and call; if the dial gave a relayed connection, wait up to
    ``settle`` s for the direct one (hole punching) and call again. Times are from the dial."""
    t0 = time.perf_counter()
    first = (await node._host.get_connection(peer)).transport
    ref = sa.Counter.options(node=peer).remote(1)
    await ref.incr.remote()
    value = await ref.get.remote()
    ms = (time.perf_counter() - t0) * 1e3
    direct_ms = None
    while first == "relay" and time.perf_counter() - t0 < settle:
        conn = node._host.conns.get(peer)
        if conn is not None and conn.transport != "relay":
            direct_ms = round((time.perf_counter() - t0) * 1e3, 1)
            break
        await asyncio.sleep(0.005)
    await ref.incr.remote()
    value = await ref.get.remote() - 1
    conn = node._host.conns.get(peer)
    return {
        "ok": value == 2,
        "first": first,
        "path": conn.transport if conn else None,
        "remote": str(conn.remote_addr) if conn else None,
        "ms": round(ms, 1),
        "direct_ms": direct_ms,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ip", required=True)
    p.add_argument("--relay", action="store_true")
    p.add_argument(
        "--relay-in-stream", action="store_true", help="as a relay, never splice circuits onto their own sockets"
    )
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument(
        "--reserve",
        action="append",
        default=[],
        help="relays to reserve on once private (default: the bootstrap peers)",
    )
    p.add_argument(
        "--no-dht-bootstrap",
        action="store_true",
        help="only connect to the bootstrap peers (no lookups that meet other nodes)",
    )
    p.add_argument("--log", help="log level for lattica's logs on stderr (debugging)")
    p.add_argument("--keepalive", type=float, default=None, help="keepalive interval in seconds (TCP and QUIC)")
    p.add_argument("--quic-only", action="store_true", help="listen on QUIC only")
    p.add_argument("--tcp-only", action="store_true", help="listen on TCP only")
    p.add_argument(
        "--mdns",
        choices=["on", "off"],
        default="off",
        help="LAN discovery (off unless asked: lab hosts share a segment)",
    )
    p.add_argument(
        "--membership",
        choices=["on", "off"],
        default=os.environ.get("LATTICA_LAB_MEMBERSHIP", "off"),
        help="membership gossip (off: the lab tests the NAT ladder; membership has its own tests)",
    )
    p.add_argument(
        "--libp2p-topic",
        action="append",
        default=[],
        help="a pub-sub topic shared with libp2p GossipSub nodes (published as they do, open to them)",
    )
    p.add_argument(
        "--dcutr-only",
        action="store_true",
        help="punch with libp2p's DCUtR only, as a libp2p node would (our own protocol is not offered)",
    )
    p.add_argument(
        "--autonat-servers",
        type=int,
        default=None,
        help="peers its reachability rounds ask (0: none, only the autonat_ask command asks)",
    )
    args = p.parse_args()
    if args.log:
        lattica.logging.configure(args.log)
    listen = [f"/ip4/{args.ip}/tcp/4001", f"/ip4/{args.ip}/udp/4001/quic-v1"]
    if args.quic_only or args.tcp_only:
        listen = [a for a in listen if ("/quic" in a) == args.quic_only]
    options = {}
    if args.keepalive is not None:
        ka = {"keepalive_interval": args.keepalive, "keepalive_timeout": 3 * args.keepalive}
        options = {"tcp": ka, "quic": {"keepalive_interval": args.keepalive}}
    relay = RelayConfig(splice=False) if args.relay_in_stream else args.relay
    node = lattica.Node(
        listen,
        relay=relay,
        relays=args.reserve or args.bootstrap,
        allow=["sample_actors.*"],
        transport_options=options,
        mdns=args.mdns == "on",
        membership=args.membership == "on",
        crdt=CrdtConfig(path="memory"),
        content=ContentConfig(blocks="memory"),
        pubsub=PubSubConfig(libp2p_topics=tuple(args.libp2p_topic), open_topics=tuple(args.libp2p_topic)),
        nat=NatConfig() if args.autonat_servers is None else NatConfig(servers=args.autonat_servers),
    ).start()
    if args.dcutr_only:
        node._host.handlers.pop(holepunch.PROTOCOL)  # (before any peer identifies us)
    _say({"event": "ready", "peer_id": str(node.peer_id), "addrs": [str(a) for a in node.addrs]})
    for addr in args.bootstrap:
        try:
            node.connect(addr)
        except lattica.errors.LatticaError as e:
            _say({"event": "bootstrap-failed", "addr": addr, "error": str(e)})
    if args.bootstrap and not args.no_dht_bootstrap:
        try:
            lattica.dht.bootstrap(node=node).result(30)
        except lattica.errors.LatticaError as e:
            _say({"event": "bootstrap-failed", "error": str(e)})
    subs: dict = {}
    docs: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "status":
                st = dataclasses.asdict(node.nat_status())
                st["conns"] = {str(p): [c.transport for c in cs] for p, cs in node._host.conns_of.items()}
                if node._host.services.relay is not None:
                    st["relay"] = node.run(_relay_status(node), timeout=5)
                _say(st)
            elif cmd["cmd"] == "call":
                _say(
                    node.run(
                        _call(node, lattica.PeerId.from_string(cmd["peer"]), float(cmd.get("settle", 0))),
                        timeout=float(cmd.get("timeout", 20)),
                    )
                )
            elif cmd["cmd"] == "connect":  # (a peer found by address, e.g. a /p2p-circuit one)
                node.connect(cmd["addr"], timeout=float(cmd.get("timeout", 20)))
                _say({"ok": True})
            elif cmd["cmd"] == "autonat_ask":
                peers = [lattica.PeerId.from_string(p) for p in cmd["peers"]]
                _say({"answers": node.run(_autonat_ask(node, peers, cmd["transport"]), timeout=60)})
            elif cmd["cmd"] == "ping":
                _say(
                    {
                        "ok": True,
                        "rtt": node.ping(
                            lattica.PeerId.from_string(cmd["peer"]), timeout=float(cmd.get("timeout", 10))
                        ),
                    }
                )
            elif cmd["cmd"] == "members":
                _say({"members": [{"peer_id": str(m["peer_id"]), "state": m["state"]} for m in node.nodes()]})
            elif cmd["cmd"] == "members_debug":  # what a failing membership test prints
                _say(node.run(_members_debug(node), timeout=5))
            elif cmd["cmd"] == "holepunch":
                _say(node.run(_punch_status(node), timeout=5))
            elif cmd["cmd"] == "subscribe":
                subs[cmd["topic"]] = (lattica.pubsub.subscribe(cmd["topic"], node=node), [], [])
                _say({"ok": True})
            elif cmd["cmd"] == "publish":
                _say({"ok": True, "sent_to": lattica.pubsub.publish(cmd["topic"], cmd["data"], node=node).result(10)})
            elif cmd["cmd"] == "received":
                sub, got, via = subs[cmd["topic"]]
                while (msg := sub.get_nowait()) is not None:
                    # (a libp2p topic's messages are the author's bytes: shown as text)
                    got.append(msg.data.decode(errors="replace") if isinstance(msg.data, bytes) else msg.data)
                    via.append(str(msg.via))
                _say({"got": got, "via": via})
            elif cmd["cmd"] == "pubsub":
                mesh = lattica.pubsub.peers(cmd["topic"], node=node)
                _say({"mesh": {str(p): [c.transport for c in node._host.conns_of.get(p, ())] for p in mesh}})
            elif cmd["cmd"] == "crdt_open":
                docs[cmd["name"]] = lattica.crdt.open(cmd["name"], node=node)
                _say({"ok": True})
            elif cmd["cmd"] == "crdt_set":
                doc = docs[cmd["name"]]
                with doc.transaction():
                    doc.map("m")[cmd["key"]] = cmd["value"]
                _say({"ok": True})
            elif cmd["cmd"] == "crdt_get":
                doc = docs[cmd["name"]]
                _say(
                    {
                        "m": doc.to_py().get("m", {}),
                        "stats": doc.stats(),
                        "peers": {str(p): [c.transport for c in node._host.conns_of.get(p, ())] for p in doc.peers()},
                    }
                )
            elif cmd["cmd"] == "stage":
                _say(node.run(_stage(node, int(cmd["stage"]), int(cmd["stages"])), timeout=30))
            elif cmd["cmd"] == "generate":
                _say(_generate(node, cmd["prompt"], int(cmd["n"])))
            elif cmd["cmd"] in ("trainer", "worker", "sync", "put_policy", "time_fetch"):
                _say(_weightsync(node, cmd))
            elif cmd["cmd"] == "quit":
                break
        except Exception as e:  # noqa: BLE001 -- reported to the test, which decides
            _say({"ok": False, "error": f"{type(e).__name__}: {e}"})
    node.stop()


async def _stage(node: lattica.Node, stage: int, stages: int) -> dict:
    from lattica.mesh.inference import SERVICE, PipelineStage  # (only nodes that serve a stage)

    ref = PipelineStage.remote(stage, stages, 0, 5.0)
    await ref._spawn
    await lattica.shards.serve(ref, SERVICE, {"stage": stage}, node=node)
    return {"ok": True, "actor": ref.name}


_STUBS: dict = {}


def _generate(node: lattica.Node, prompt: list, n: int) -> dict:
    import numpy as np  # (only the node that generates)

    from lattica.mesh.inference import CONTEXT, SERVICE  # (likewise)

    first = _STUBS.get(node.peer_id)
    if first is None:  # (one stub, kept: what it measured makes its picks and its hedges)
        first = _STUBS[node.peer_id] = lattica.shards.stub(SERVICE, {"stage": 0}, timeout=10.0, within=60.0, node=node)
    tokens, ms = list(prompt), []
    for _ in range(n):
        t0 = time.perf_counter()
        tokens.append(int(first.forward.remote(np.array(tokens[-CONTEXT:])).result(90)))
        ms.append(round((time.perf_counter() - t0) * 1e3, 1))
    return {"tokens": tokens[len(prompt) :], "ms": ms}


def _weightsync(node: lattica.Node, cmd: dict) -> dict:
    import numpy as np  # (only the nodes of the weight sync test)

    from lattica._context import set_default_node
    from lattica.mesh import weightsync as ws

    set_default_node(node)  # (the helpers spawn and publish through the user API)
    if cmd["cmd"] == "trainer":
        ref = node.run(_spawn(ws.Trainer.options(name="trainer")), timeout=30)
        return {"ok": True, "actor": ref.name}
    if cmd["cmd"] == "worker":
        trainer = lattica.get_actor("trainer", node=cmd["trainer"], timeout=20)
        ref = node.run(
            _spawn(ws.PolicyWorker.options(name=cmd["name"]), trainer, cmd["name"], cmd["cluster"]), timeout=30
        )
        return {"ok": True, "actor": ref.name}
    if cmd["cmd"] == "sync":
        trainer = lattica.get_actor("trainer")
        rows = ws.sync_versions(
            node,
            trainer,
            int(cmd["workers"]),
            int(cmd["versions"]),
            int(cmd["mib"]) << 20,
            timeout=float(cmd.get("timeout", 90)),
        )
        return {"rows": rows}
    if cmd["cmd"] == "put_policy":
        policy = (
            np.random.default_rng(int(cmd["seed"])).standard_normal((int(cmd["mib"]) << 20) // 4).astype(np.float32)
        )
        return {"cid": lattica.content.put_weights({"policy": policy}, chunk_size=ws.CHUNK, node=node).result(60)}
    t0 = time.perf_counter()
    lattica.content.get_weights(cmd["cid"], node=node).result(60)
    return {"seconds": round(time.perf_counter() - t0, 3)}


async def _spawn(cls, *args):
    ref = cls.remote(*args)
    await ref._spawn
    return ref


async def _autonat_ask(node: lattica.Node, peers: list[lattica.PeerId], transport: str) -> list[dict]:
    """Ask each of ``peers`` (libp2p AutoNAT servers: v2 if one serves it, else v1), at once, to
    dial us back at our ``transport`` address as it sees us: QUIC as it observed our listening
    socket, TCP at our listening port on the IP it observed."""
    client = node._host.services.nat.libp2p_autonat

    async def ask(peer: lattica.PeerId) -> dict:
        info = node._host.info[node._host.conns[peer]]
        seen = info.observed_addr.without_peer_id()
        addr = seen if transport == "quic" else Multiaddr.from_host_port(seen.host_port()[0], 4001, "tcp")
        version = 2 if "/libp2p/autonat/2/dial-request" in info.protocols else 1
        v = await client.ask(peer, [addr])
        return {"version": version, "asked": str(addr), "outcome": v.outcome.value, "reason": v.reason}

    return list(await asyncio.gather(*(ask(p) for p in peers)))


async def _members_debug(node) -> dict:
    core = node._host.services.membership.core
    conns = {str(p): [c.transport for c in cs if not c.is_closed] for p, cs in node._host.conns_of.items()}
    return {
        "me": [core.me.id, core.me.incarnation, len(core.me.info.get("addrs", []))],
        "members": {
            m.id: {
                "state": m.state,
                "inc": m.incarnation,
                "sealed": m.proof is not None,
                "conns": conns.get(m.id, []),
                "addrs": m.info.get("addrs", []),
            }
            for m in core.members.values()
        },
        "rumors": dict(core._rumors),
        "watched": core.watched(),
        "sent_to": sorted(core._sent_to),
    }


async def _punch_status(node: lattica.Node) -> dict:
    return node._host.services.holepunch.status()


async def _relay_status(node: lattica.Node) -> dict:
    return node._host.services.relay.status()


if __name__ == "__main__":
    main()
