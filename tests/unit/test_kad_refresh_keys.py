"""libp2p Kademlia's bucket-refresh keys: pre-images whose hashed ids land in the far buckets."""

from __future__ import annotations

import random

from lattica.actors.dht.libp2p import bucket_preimages
from lattica.dht._kademlia import key_id


def test_every_far_bucket_gets_keys_that_land_in_it() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        local = rng.getrandbits(256)
        found = bucket_preimages(local, rng)
        assert sorted(found) == list(range(242, 256))
        for index, keys in found.items():
            assert 1 <= len(keys) <= 8
            assert all((key_id(key) ^ local).bit_length() - 1 == index for key in keys)
