"""Checkpoint copies cannot be poisoned (issue 17 must-have 4), with real nodes on loopback: a
member that did not write a copy cannot overwrite it (its own copy of the name goes in a slot of
its own; a stamp of 1e308 is refused), read it or drop it while its writer lives, nor squat the
name ahead of its writer; a copy must be signed by the node that sends it, with a sane
stamp; and what the holder returns carries the writer's signature."""

from __future__ import annotations

import time

import pytest

import lattica
from helpers import call_as, wait_for
from lattica.actors.checkpoints import checkpoints_ref, read_copies, sign_copy
from lattica.errors import CheckpointRejected
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def three():
    """``holder`` and ``writer`` hold the mesh key; ``member`` was invited."""
    key = MeshKey.generate()
    km = lattica.KeyPair.generate()
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=key) as holder, lattica.Node([], mesh=key) as writer, \
            lattica.Node([], keypair=km, mesh=key.issue(km.peer_id)) as member:
        writer.connect(holder.addrs[0])
        member.connect(holder.addrs[0])
        assert wait_for(lambda: len(holder.peers()) == 2 and all(p.circle == "member" for p in holder.peers()))
        yield holder, writer, member


def _keep(node, holder, name, stamp, blob, signer=None):
    sig = sign_copy((signer or node)._host.keypair, name, stamp, blob)
    return call_as(node, checkpoints_ref(holder.peer_id), "keep", name, stamp, blob, sig, node._host.trust.presented)


def test_a_member_cannot_poison_read_or_drop_anothers_copy(three):
    holder, writer, member = three
    stamp = time.time()
    assert _keep(member, holder, "sup/w0", stamp - 1, b"squatted") is True  # ahead of the writer: its own slot
    assert _keep(writer, holder, "sup/w0", stamp, b"honest state") is True  # not blocked by it
    assert _keep(member, holder, "sup/w0", stamp + 1, b"poison") is True  # replaces only its own
    with pytest.raises(CheckpointRejected, match="ahead"):
        _keep(member, holder, "sup/w0", 1e308, b"poison")  # the stamp that used to win forever
    ref = checkpoints_ref(holder.peer_id)
    assert [c[1] for c in call_as(member, ref, "fetch", "sup/w0")] == [b"poison"]  # its own, never the writer's
    call_as(member, ref, "drop", "sup/w0")  # drops its own only
    with pytest.raises(CheckpointRejected, match="writers are alive"):
        call_as(member, ref, "fetch", "sup/w0")  # nothing of its own left: the writer's is not its to read
    with pytest.raises(CheckpointRejected, match="writers are alive"):
        call_as(member, ref, "drop", "sup/w0")
    (copy,) = read_copies(call_as(writer, ref, "fetch", "sup/w0"), "sup/w0")
    stamp_, blob, who, _ = copy
    assert blob == b"honest state" and who == writer.peer_id and stamp_ == stamp


def test_a_copy_signed_by_someone_else_is_refused(three):
    holder, writer, member = three
    with pytest.raises(CheckpointRejected, match="not signed"):
        _keep(member, holder, "sup/w1", time.time(), b"x", signer=writer)  # writer's key, member's connection
