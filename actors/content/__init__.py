"""The ``content`` service (docs/content.md): the system actor that serves blocks by CID and the
fetch sessions that get them from every peer holding them.

- ``service``: ContentService (the blockstore, publishing, swarms) and ContentActor (what peers call)
- ``fetch``: one fetch of a root (providers, the scheduler, the walker, the swarm)
- ``jobs``: the hashing and disk work, run on worker threads
- ``wire``: the actor's ref, provider keys, CID lists and the protocol's limits
"""

from lattica.actors.content.service import ContentActor, ContentConfig, ContentService
from lattica.actors.content.wire import content_ref, provider_key

__all__ = ["ContentActor", "ContentService", "ContentConfig", "content_ref", "provider_key"]
