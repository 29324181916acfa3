"""The ``crdt`` service (docs/crdt.md): documents replicated between nodes, every change in a
signed envelope checked before it is applied.

- ``service``: CrdtService (the open documents, the store)
- ``replica``: one open document (Replica): its pycrdt document, local changes, peers' envelopes
- ``sync``: a replica's anti-entropy with its replica peers (AntiEntropy)
- ``checkpoints``: a replica's checkpoints, proposed and taken (Checkpoints)
- ``storage``: a replica's glue to the store (Storage)
- ``actor``: the actor its other replicas call (ReplicaActor)
- ``wire``: what replicas exchange (names, limits, summaries, parsing)
"""

from lattica.actors.crdt.service import CrdtService

__all__ = ["CrdtService"]
