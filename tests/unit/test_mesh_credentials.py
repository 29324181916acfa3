"""Mesh credentials and the admission rule (sans-IO): a certificate from our mesh's key for that
very peer, unexpired and correctly signed, makes a member; anything else leaves a stranger, with
the reason; listed PeerIds and an open mesh are members; key and certificate files and text."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattica._identity import KeyPair
from lattica.errors import KeyFileError
from lattica.trust import (
    MEMBER,
    SELF,
    STRANGER,
    Certificate,
    CertificateError,
    MeshKey,
    Trust,
    load_trust,
)

NOW = 1_800_000_000.0


def _peer():
    return KeyPair.generate().peer_id


def test_a_certificate_from_our_mesh_for_that_peer_admits_it():
    mesh, me, peer = MeshKey.generate(), _peer(), _peer()
    trust = Trust(me, [mesh.public])
    cert = mesh.issue(peer, ttl=60, now=NOW)
    assert trust.judge(peer, [cert.to_bytes()], NOW) == (MEMBER, f"certified by {mesh.name}", False, cert.expires)
    admin = mesh.issue(peer, ttl=60, now=NOW, admin=True)
    assert trust.judge(peer, [admin.to_bytes()], NOW) == (
        MEMBER,
        f"certified by {mesh.name} as an administrator",
        True,
        admin.expires,
    )
    assert trust.judge(peer, [cert.to_bytes(), admin.to_bytes()], NOW).admin  # the strongest counts
    assert trust.judge(me, [], NOW)[0] == SELF


@pytest.mark.parametrize(
    "case, why",
    [
        ("none", "presented no mesh certificate"),
        ("other mesh", "not ours"),
        ("other peer", "was issued to"),
        ("expired", "expired at"),
        ("forged", "signature does not verify"),
        ("made admin", "signature does not verify"),
        ("garbage", "malformed"),
        ("too many", "malformed"),
    ],
)
def test_anything_else_leaves_a_stranger_and_says_why(case, why):
    mesh, me, peer = MeshKey.generate(), _peer(), _peer()
    trust = Trust(me, [mesh.public])
    good = mesh.issue(peer, ttl=60, now=NOW)
    presented = {
        "none": [],
        "other mesh": [MeshKey.generate().issue(peer, 60, NOW).to_bytes()],
        "other peer": [mesh.issue(_peer(), 60, NOW).to_bytes()],
        "expired": [mesh.issue(peer, 60, NOW - 120).to_bytes()],
        "forged": [Certificate(good.mesh, good.peer, good.expires + 3600, good.signature).to_bytes()],
        "made admin": [Certificate(good.mesh, good.peer, good.expires, good.signature, admin=True).to_bytes()],
        "garbage": [b"\x01" + os.urandom(40), "text", 7],
        "too many": [good.to_bytes()] * 5,
    }[case]
    circle, reason, admin, _ = trust.judge(peer, presented, NOW)
    assert circle == STRANGER and why in reason


def test_listed_peers_and_an_open_mesh_admit_without_certificates():
    me, listed, other = _peer(), _peer(), _peer()
    assert Trust(me, members=[listed]).judge(listed, None, NOW)[0] == MEMBER
    assert Trust(me, members=[listed]).judge(other, None, NOW)[0] == STRANGER
    assert Trust(me, open=True).judge(other, None, NOW)[0] == MEMBER


def test_certificates_and_keys_round_trip_as_text():
    mesh, peer = MeshKey.generate(), _peer()
    cert = mesh.issue(peer, 60, NOW)
    assert Certificate.from_text(cert.to_text()) == cert
    assert MeshKey.from_text(mesh.to_text()).public == mesh.public
    with pytest.raises(CertificateError):
        Certificate.from_text(mesh.to_text())  # a key is not a certificate
    with pytest.raises(CertificateError):
        MeshKey.from_text("lattica-mesh-key-1:!!!")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_parse_to_a_certificate_or_a_certificate_error(data):
    try:
        Certificate.from_bytes(data)
    except CertificateError:
        pass


def test_a_key_holder_certifies_itself_and_an_invited_node_presents_its_certificate(tmp_path):
    mesh = MeshKey.generate()
    owner, guest = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    path = tmp_path / "mesh.key"
    mesh.save(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(KeyFileError):
        mesh.save(path)  # never overwrites a mesh key
    t_owner = load_trust(owner, str(path))
    invite = tmp_path / "invite"
    invite.write_text(mesh.issue(guest).to_text())
    t_guest = load_trust(guest, invite)
    # each admits the other on what it presents
    now = time.time()
    assert t_owner.judge(guest, t_guest.presented, now)[0] == MEMBER
    assert t_guest.judge(owner, t_owner.presented, now)[0] == MEMBER
    with pytest.raises(CertificateError, match="not this node"):
        load_trust(owner, invite)  # the guest's invitation does not admit anyone else
    assert load_trust(owner, "open").open
    with pytest.raises(KeyFileError, match="does not exist"):
        load_trust(owner, str(tmp_path / "missing.key"))


def test_without_a_setting_the_environment_then_the_users_key_file_decide(tmp_path, monkeypatch):
    me = _peer()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LATTICA_MESH", raising=False)
    first = load_trust(me)
    assert (tmp_path / ".lattica" / "mesh.key").exists()  # created on first use...
    assert load_trust(_peer()).meshes == first.meshes  # ...and shared by every node of this user
    other = MeshKey.generate()
    monkeypatch.setenv("LATTICA_MESH", other.to_text())
    assert load_trust(me).meshes == {other.public}


def test_a_membership_statement_counts_only_while_its_certificate_is_valid_by_the_wall_clock():
    """Membership runs on the event loop's clock (seconds since boot); certificates expire in unix
    time. The notary judges them by the wall clock itself, so a member whose certificate expired
    is refused whatever clock the membership runs on."""
    from lattica._membership import ALIVE, statement
    from lattica.trust import MemberNotary

    mesh, me, member = MeshKey.generate(), KeyPair.generate(), KeyPair.generate()
    ours = MemberNotary(me, Trust(me.peer_id, [mesh.public]))
    said = statement(str(member.peer_id), 3, ALIVE, {"cpu": 2})
    for ttl, admitted in ((3600, True), (-1, False)):
        cert = mesh.issue(member.peer_id, ttl=ttl)
        proof = MemberNotary(member, Trust(member.peer_id, [mesh.public], [cert])).seal(said)
        assert ours.admits(str(member.peer_id), said, proof) is admitted
    soon = mesh.issue(member.peer_id, ttl=1)
    proof = MemberNotary(member, Trust(member.peer_id, [mesh.public], [soon])).seal(said)
    assert ours.admits(str(member.peer_id), said, proof)
    time.sleep(max(0.0, soon.expires - time.time()) + 0.05)
    assert not ours.admits(str(member.peer_id), said, proof)  # (the cached verdict ends with it)
