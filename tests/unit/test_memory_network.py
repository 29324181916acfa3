"""The in-memory network lists its connections for ``partition``; closed ones are forgotten as it
grows, so a long simulation (or a process running many) does not hold every connection it made."""

import asyncio

from lattica._identity import KeyPair
from lattica.transports.memory import MemoryNetwork, _Pipe


def test_closed_connections_are_forgotten_as_the_list_grows():
    loop = asyncio.new_event_loop()
    try:
        net = MemoryNetwork()
        a, b = KeyPair.generate().peer_id, KeyPair.generate().peer_id
        kept = []
        for i in range(1000):
            mine, theirs = _Pipe(loop), _Pipe(loop)
            net.add_pipe(mine, theirs, a, b)
            if i % 10 == 0:
                kept.append(mine)  # one in ten stays open
            else:
                mine.close()
                theirs.close()
        listed = len(net._pipes)
        assert listed <= 2 * len(kept) + 64, listed  # not all 1,000
        assert all(any(t[0] is p for t in net._pipes) for p in kept)  # the open ones all stay listed
    finally:
        loop.close()
