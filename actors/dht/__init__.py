"""The ``dht`` system actor: a Kademlia node over authenticated actor calls.

Peers call :class:`DhtActor`; local code reaches :class:`DhtService` as ``runtime.dht``. The
service is built in layers, one module each, every module importing only the ones listed
before it:

- ``actor``: what peers may call: :class:`DhtActor` (answers from local state only), the
  protocol's fixed method table (:func:`dht_ref`) and the size limits of answers.
- ``state``: what the node's DHT holds (configuration, routing table, record store, addresses
  of table peers, misbehaving peers), how the table learns peers, requests to peers' actors.
- ``lookups``: the lookup driver, iterative lookups (:class:`lattica.dht._kademlia.Lookup`) over those
  requests, and what runs on them: closest nodes, get, providers, peer records, storing on the
  k closest; :class:`LookupStats`.
- ``upkeep``: what the node keeps alive in the DHT (its puts, provider announcements, peer
  record and actor names, re-published), bootstrap and refresh of the routing table,
  persistence of the store, and the background loop that runs them.
- ``service``: :class:`DhtService`, those layers in one object, subscribed and started.

``DhtConfig`` lives in :mod:`lattica.config` and is re-exported here.
"""

from __future__ import annotations

from lattica.actors.dht.actor import DhtActor, dht_ref
from lattica.actors.dht.lookups import LookupStats
from lattica.actors.dht.service import DhtService
from lattica.actors.dht.upkeep import NAME_PREFIX, name_key
from lattica.config import DhtConfig

__all__ = ["DhtConfig", "DhtActor", "DhtService", "dht_ref", "name_key", "NAME_PREFIX", "LookupStats"]
