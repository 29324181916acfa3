"""The ``pubsub`` service (docs/pubsub.md): a GossipSub router on the node, signed messages,
validators and subscriptions.

- ``service``: PubSubService (the router's glue: subscriptions, publishing, peers, delivery)
  and PubSubActor
- ``sending``: the queues to peers and the calls that drain them
- ``validation``: the checks on a peer's bundle, and validators' verdicts
- ``discovery``: finding a topic's subscribers through the DHT
- ``strangers``: strangers' batches on open topics (budgets, turns)
- ``bundle``: a signed bundle of an author's messages (what it signs, its items)
- ``wire``: the batch's wire form, parsed strictly
"""

from lattica.actors.pubsub.service import PubSubActor, PubSubService, pubsub_ref

__all__ = ["PubSubActor", "PubSubService", "pubsub_ref"]
