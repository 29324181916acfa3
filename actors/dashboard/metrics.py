"""This node's metrics for Prometheus (``/metrics``), read from its own state when scraped: calls
and their latency, actors, connections by path, the DHT, the relay, content and pub-sub."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lattica._metrics import Family, render

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.services import NodeServices

__all__ = ["scrape", "MAX_CLASSES"]

MAX_CLASSES = 200  # actor classes labelled one by one; the rest are summed under "other"


def scrape(rt: Calls, services: NodeServices) -> str:
    """The text exposition of this node's metrics."""
    return render(_families(rt, services))


def _families(rt: Calls, svc: NodeServices) -> list[Family]:
    node = {"peer_id": str(rt.peer_id)}
    fams = [
        Family(
            "lattica_call_latency_seconds",
            "histogram",
            "Calls this node made, from the call to its answer",
            [(node, rt.call_latency)],
        )
    ]

    per_class: dict[str, list[int]] = {}  # class -> [actors, calls, errors, mailbox]
    states: dict[str, int] = {}
    for a in list(rt.actors.values()):
        name = f"{a.cls.__module__}.{a.cls.__qualname__}"
        if name not in per_class and len(per_class) >= MAX_CLASSES:
            name = "other"
        row = per_class.setdefault(name, [0, 0, 0, 0])
        row[0] += 1
        row[1] += a.calls
        row[2] += a.errors
        row[3] += len(a.waiting)
        states[a.state] = states.get(a.state, 0) + 1
    fams.append(
        Family(
            "lattica_actors",
            "gauge",
            "Actors on this node by state",
            [({**node, "state": s}, n) for s, n in sorted(states.items())],
        )
    )
    for i, (metric, kind, text) in enumerate(
        (
            ("lattica_actor_calls_total", "counter", "Calls served, by actor class"),
            ("lattica_actor_errors_total", "counter", "Error answers, by actor class"),
            ("lattica_actor_mailbox", "gauge", "Calls waiting in mailboxes, by actor class"),
        ),
        start=1,
    ):
        fams.append(
            Family(metric, kind, text, [({**node, "class": c}, row[i]) for c, row in sorted(per_class.items())])
        )

    paths: dict[tuple[str, str, str], int] = {}
    for info in rt.host.peers():
        key = (info.transport, "relayed" if "/p2p-circuit" in str(info.remote_addr) else "direct", info.direction)
        paths[key] = paths.get(key, 0) + 1
    fams.append(
        Family(
            "lattica_connections",
            "gauge",
            "Connected peers by transport, path and direction",
            [({**node, "transport": t, "path": p, "direction": d}, n) for (t, p, d), n in sorted(paths.items())],
        )
    )

    dht = svc.dht
    if dht is not None:
        fams.append(
            Family("lattica_dht_routing_table_peers", "gauge", "Peers in the DHT routing table").add(
                len(dht.table), **node
            )
        )
        fams.append(
            Family("lattica_dht_records", "gauge", "Records this node holds for the DHT").add(
                dht.store.record_count, **node
            )
        )
        fams.append(Family("lattica_dht_rejected_total", "counter", "DHT stores refused").add(dht.rejected, **node))
    relay = svc.relay
    if relay is not None:
        fams.append(
            Family("lattica_relay_reservations", "gauge", "Relay reservations held here").add(
                len(relay.reservations), **node
            )
        )
        fams.append(
            Family("lattica_relay_circuits", "gauge", "Relayed circuits open now").add(
                sum(relay.circuits.values()), **node
            )
        )
        fams.append(
            Family("lattica_relay_circuits_total", "counter", "Circuits relayed since start").add(
                relay.total_circuits, **node
            )
        )
        fams.append(
            Family("lattica_relay_bytes_total", "counter", "Bytes relayed since start").add(relay.bytes_relayed, **node)
        )
    content = svc.content
    if content is not None:
        fams.append(
            Family("lattica_content_served_bytes_total", "counter", "Block bytes served to peers").add(
                content.served_bytes, **node
            )
        )
        fams.append(
            Family("lattica_content_served_blocks_total", "counter", "Blocks served to peers").add(
                content.served_blocks, **node
            )
        )
        fams.append(
            Family("lattica_content_transfers", "gauge", "Fetches running").add(len(content.transfers()), **node)
        )
    pubsub = svc.pubsub
    if pubsub is not None:
        fams.append(
            Family("lattica_pubsub_published_total", "counter", "Messages published here").add(pubsub.published, **node)
        )
        fams.append(
            Family("lattica_pubsub_delivered_total", "counter", "Messages delivered to local subscribers").add(
                pubsub.delivered, **node
            )
        )
        fams.append(
            Family("lattica_pubsub_rejected_total", "counter", "Messages refused (invalid, unsigned, unwanted)").add(
                pubsub.rejected, **node
            )
        )
        fams.append(
            Family("lattica_pubsub_topics", "gauge", "Topics with a mesh here").add(len(pubsub.topics()), **node)
        )
    return fams
