"""Pub-sub (issue 19, in progress): topics over a GossipSub-style mesh.

So far the sans-IO core: ``lattica.pubsub.router`` (meshes, fanout, gossip, seen and message
caches, validation hand-off) and ``lattica.pubsub.score`` (peer scores). The ``pubsub`` system
service that runs a router on the node, signs and checks messages and offers
``subscribe``/``publish`` is the next step (docs/pubsub.md).
"""
