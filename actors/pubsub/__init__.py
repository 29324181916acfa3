"""The ``pubsub`` service (docs/pubsub.md): a GossipSub router on the node, signed messages,
validators and subscriptions.

- ``service``: PubSubService (the router's glue: peers, topic discovery, queues, checks,
  delivery) and PubSubActor
- ``bundle``: a signed bundle of an author's messages (what it signs, its items)
- ``wire``: the batch's wire form, parsed strictly
"""

from lattica.actors.pubsub.service import PubSubActor, PubSubService, pubsub_ref

__all__ = ["PubSubActor", "PubSubService", "pubsub_ref"]
