"""The ``crdt`` service (docs/crdt.md): documents replicated between nodes, every change in a
signed envelope checked before it is applied.

- ``service``: CrdtService (the open documents, the store)
- ``replica``: one open document (Replica) and the actor its other replicas call (ReplicaActor)
"""

from lattica.actors.crdt.service import CrdtService

__all__ = ["CrdtService"]
