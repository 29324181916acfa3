"""The budget for partially received rpc messages (lattica._runtime.partials), sans sockets."""

import asyncio

import pytest

from lattica._identity import KeyPair
from lattica._protobuf import uvarint
from lattica._runtime.partials import BudgetedSplitter, PartialMessages
from lattica.config import InboundBudget
from lattica.errors import FrameTooLarge, MessageBudgetExceeded

A, B = KeyPair.generate().peer_id, KeyPair.generate().peer_id


def frame(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(n)


def test_held_bytes_are_counted_per_peer_and_given_back():
    account = PartialMessages(InboundBudget(per_peer=100, per_node=150, deadline=60))
    loop = asyncio.new_event_loop()
    try:
        s1 = BudgetedSplitter(1000, account, A, loop, lambda why: None)
        s2 = BudgetedSplitter(1000, account, B, loop, lambda why: None)
        assert s1.feed(frame(10)) and account.total == 0  # complete frames cost nothing
        assert s1.feed(frame(500)[:84]) == []
        assert account.total == 84 and account.by_peer == {A: 84}  # (the length prefix too)
        with pytest.raises(MessageBudgetExceeded, match="exceed 100 bytes"):
            s1.feed(bytes(30))  # A would hold 114 > per_peer
        assert account.total == 84  # nothing changed by the refused feed
        s2.feed(frame(500)[:64])
        with pytest.raises(MessageBudgetExceeded, match="this node's 150 bytes"):
            s2.feed(bytes(20))  # 84 + 84 > per_node (B's own 84 is within per_peer)
        s1.close()
        assert account.total == 64 and account.by_peer == {B: 64}
        s2.close()
        assert account.total == 0 and account.by_peer == {}
    finally:
        loop.close()


def test_a_message_that_does_not_complete_in_time_is_reported_and_its_successor_gets_a_new_deadline():
    account = PartialMessages(InboundBudget(per_peer=10_000, per_node=10_000, deadline=0.2))
    late = []

    async def main():
        s = BudgetedSplitter(1000, account, A, asyncio.get_running_loop(), late.append)
        s.feed(frame(100)[:50])
        await asyncio.sleep(0.12)
        s.feed(frame(100)[50:] + frame(100)[:50])  # the first completes, a second starts
        await asyncio.sleep(0.12)  # 0.24 s after the first began, 0.12 s into the second
        assert late == []
        await asyncio.sleep(0.15)
        assert len(late) == 1 and "did not complete within 0.2 s" in late[0]
        s.close()
        s2 = BudgetedSplitter(1000, account, A, asyncio.get_running_loop(), late.append)
        s2.feed(frame(100)[:50])
        s2.close()  # a closed channel's timer is gone
        await asyncio.sleep(0.3)
        assert len(late) == 1

    asyncio.run(main())
    assert account.total == 0


def test_a_longer_message_gets_longer_in_proportion_to_its_declared_length():
    """deadline 0.2 s + length / 1,000 B/s: a 300-byte message may take 0.5 s; a message whose
    length prefix is not in yet is looked at again at the base deadline."""
    account = PartialMessages(InboundBudget(per_peer=10_000, per_node=10_000, deadline=0.2, min_rate=1000))
    late = []

    async def main():
        loop = asyncio.get_running_loop()
        s = BudgetedSplitter(10_000, account, A, loop, late.append)
        s.feed(frame(300)[:2])  # not even its length yet
        await asyncio.sleep(0.1)
        s.feed(frame(300)[2:100])
        await asyncio.sleep(0.25)  # 0.35 s in: past the base deadline, within 0.5 s
        assert late == []
        await asyncio.sleep(0.3)
        assert len(late) == 1 and "did not complete within 0.5 s" in late[0]
        s.close()

    asyncio.run(main())
    assert account.total == 0


def test_strangers_share_a_small_part_and_cannot_crowd_out_members():
    account = PartialMessages(InboundBudget(per_peer=1000, per_node=1000, deadline=60, per_stranger=100, strangers=150))
    loop = asyncio.new_event_loop()
    try:
        s1 = BudgetedSplitter(10_000, account, A, loop, lambda why: None)
        s1.stranger = True
        s1.feed(frame(500)[:84])
        with pytest.raises(MessageBudgetExceeded, match="exceed 100 bytes"):
            s1.feed(bytes(30))  # a stranger's own share
        s2 = BudgetedSplitter(10_000, account, B, loop, lambda why: None)
        s2.stranger = True
        with pytest.raises(MessageBudgetExceeded, match="strangers'"):
            s2.feed(frame(500)[:84])  # 84 + 84 > the strangers' 150
        member = BudgetedSplitter(10_000, account, B, loop, lambda why: None)
        member.feed(frame(5000)[:800])  # members still have the rest of the node's budget
        assert account.total == 884 and account.strangers == 84
        s1.close()
        member.close()
        assert account.total == 0 and account.strangers == 0
    finally:
        loop.close()


class _Reader:
    """Just what ``read_delimited`` reads of a stream: ``read`` and ``readexactly``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.r = asyncio.StreamReader(loop=loop)

    async def read(self, n: int) -> bytes:
        return await self.r.read(n)

    async def readexactly(self, n: int) -> bytes:
        return await self.r.readexactly(n)


def test_a_length_prefixed_message_is_held_on_the_account_until_it_is_all_there():
    """``read_delimited`` (GossipSub's and Bitswap's streams): the body is charged to the peer,
    as a stranger's when it is one, while it arrives and given back once read; a length over
    the limit is refused before the body is read; a body that stalls past the budget's deadline
    is a TimeoutError, and so is a length that does not come within ``idle``."""
    account = PartialMessages(InboundBudget(per_stranger=100, deadline=0.2, min_rate=1000))

    async def run() -> None:
        s = _Reader(asyncio.get_running_loop())
        reading = asyncio.ensure_future(account.read_delimited(s, A, 1000, "thing", lambda p: p == A))
        s.r.feed_data(uvarint(60) + bytes(10))
        await asyncio.sleep(0.01)
        assert account.by_peer == {A: 60} and account.strangers == 60  # (the declared length)
        s.r.feed_data(bytes(50))
        assert await reading == bytes(60)
        assert account.total == 0 and account.strangers == 0
        s.r.feed_data(uvarint(101))
        with pytest.raises(MessageBudgetExceeded):  # (over a stranger's 100)
            await account.read_delimited(s, A, 1000, "thing", lambda p: True)
        s.r.feed_data(uvarint(2000))
        with pytest.raises(FrameTooLarge, match="a thing of 2000 bytes"):
            await account.read_delimited(s, B, 1000, "thing", lambda p: False)
        s.r.feed_data(uvarint(20) + bytes(5))
        with pytest.raises(TimeoutError):
            await account.read_delimited(s, B, 1000, "thing", lambda p: False)
        assert account.total == 0
        with pytest.raises(TimeoutError):
            await account.read_delimited(_Reader(asyncio.get_running_loop()), B, 1000, "thing", bool, idle=0.05)

    asyncio.run(run())
