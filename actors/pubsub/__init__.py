"""The ``pubsub`` service (docs/pubsub.md): a GossipSub router on the node, signed messages,
validators and subscriptions.

- ``service``: PubSubService (the router's glue: peers, queues, checks, delivery) and PubSubActor
- ``wire``: the batch's wire form, parsed strictly, and what an author signs
"""

from lattica.actors.pubsub.service import PubSubActor, PubSubService, pubsub_ref

__all__ = ["PubSubActor", "PubSubService", "pubsub_ref"]
