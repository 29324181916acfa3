"""Who a peer is to this node: the node itself, a **member** of its mesh, or a **stranger** (any
other authenticated PeerId), and the mesh credentials that decide it.

A mesh is named by its admission key (Ed25519). Whoever holds the key certifies members: a
certificate is the key's signature over (mesh, PeerId, expiry). A node presents its certificates in
identify; a peer whose certificate verifies under the key of a mesh we belong to is a member, as is
a PeerId listed in ``members``; everyone else is a stranger. An open mesh (every authenticated peer
a member) is a choice made by name, never the default. Sans-IO: the clock is passed in.
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from lattica._identity import KeyPair, PeerId, b58encode, verify_signature
from lattica.errors import CertificateError, KeyFileError, LatticaError

__all__ = [
    "SELF",
    "MEMBER",
    "STRANGER",
    "Certificate",
    "MeshKey",
    "MemberNotary",
    "Trust",
    "Verdict",
    "load_trust",
    "read_credential",
    "default_mesh_path",
    "mesh_name",
]

SELF, MEMBER, STRANGER = "self", "member", "stranger"

OPEN = "open"  # the ``mesh`` setting that admits every authenticated peer
ENV = "LATTICA_MESH"  # key text, certificate text, a file holding either, or "open"
KEY_PREFIX = "lattica-mesh-key-1:"
CERT_PREFIX = "lattica-mesh-cert-1:"
SELF_CERT_TTL = 365 * 86400.0  # a key holder certifies itself at every start
INVITE_TTL = 30 * 86400.0
MAX_PRESENTED = 4  # certificates a peer may present (one per mesh it belongs to)
_DOMAIN = b"lattica mesh certificate v1\x00"
_VERSION = 2  # 2: the flags byte (administrator)
_FIXED = 1 + 1 + 32 + 8 + 64  # version, flags, mesh key, expiry, signature; the PeerId follows
_ADMIN = 1  # flag: the holder administers the mesh (a key holder's own certificate, or delegated)
MAX_CERT_BYTES = _FIXED + 64


def mesh_name(public: bytes) -> str:
    """A short printable name for the mesh of admission key ``public`` (for messages)."""
    return "mesh-" + b58encode(public)[:10]


@dataclass(frozen=True)
class Certificate:
    """The admission key of ``mesh`` says ``peer`` is a member until ``expires`` (unix seconds);
    ``admin``: also an administrator, who may stop or rewire any member's actors (a key holder's
    own certificate is one; an invitation is not, unless issued with ``admin=True``)."""

    mesh: bytes
    peer: PeerId
    expires: int
    signature: bytes
    admin: bool = False

    @staticmethod
    def signed_part(mesh: bytes, peer: PeerId, expires: int, admin: bool = False) -> bytes:
        return _DOMAIN + bytes([_ADMIN if admin else 0]) + mesh + expires.to_bytes(8, "big") + peer.to_bytes()

    def to_bytes(self) -> bytes:
        flags = _ADMIN if self.admin else 0
        return (
            bytes([_VERSION, flags])
            + self.mesh
            + self.expires.to_bytes(8, "big")
            + self.signature
            + self.peer.to_bytes()
        )

    @classmethod
    def from_bytes(cls, data: Any) -> Certificate:
        """Parse (not verify) a certificate; raises CertificateError if it is malformed."""
        if (
            type(data) is not bytes
            or not _FIXED < len(data) <= MAX_CERT_BYTES
            or data[0] != _VERSION
            or data[1] & ~_ADMIN
        ):
            raise CertificateError("malformed mesh certificate")
        try:
            peer = PeerId.from_bytes(data[_FIXED:])
        except LatticaError:
            raise CertificateError("mesh certificate names no valid PeerId") from None
        return cls(data[2:34], peer, int.from_bytes(data[34:42], "big"), data[42:106], bool(data[1] & _ADMIN))

    def to_text(self) -> str:
        return CERT_PREFIX + base64.urlsafe_b64encode(self.to_bytes()).decode().rstrip("=")

    @classmethod
    def from_text(cls, text: str) -> Certificate:
        return cls.from_bytes(_unb64(text, CERT_PREFIX, "mesh certificate"))

    def problem(self, peer: PeerId, meshes: Iterable[bytes], now: float, signature_checked: bool = False) -> str | None:
        """Why this certificate does not admit ``peer`` to one of ``meshes`` (None: it does);
        ``signature_checked``: these exact bytes verified before, only the rest is re-checked."""
        if self.mesh not in meshes:
            return f"its certificate is for {mesh_name(self.mesh)}, not ours"
        if self.peer != peer:
            return f"its certificate was issued to {self.peer.short()}, not to it"
        if self.expires <= now:
            return f"its certificate expired at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.expires))}"
        if not signature_checked and not verify_signature(
            self.mesh, self.signature, self.signed_part(self.mesh, self.peer, self.expires, self.admin)
        ):
            return "its certificate's signature does not verify"
        return None


def _unb64(text: str, prefix: str, what: str) -> bytes:
    text = text.strip()
    if not text.startswith(prefix):
        raise CertificateError(f"not a {what} (expected text starting with {prefix!r})")
    body = text[len(prefix) :]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except ValueError:
        raise CertificateError(f"{what} text is not valid base64") from None


class MeshKey:
    """The admission key of a mesh: whoever holds it certifies members (itself included)."""

    __slots__ = ("_key", "public")

    def __init__(self, key: KeyPair) -> None:
        self._key = key
        self.public: bytes = key.public_key

    @classmethod
    def generate(cls) -> MeshKey:
        return cls(KeyPair.generate())

    @property
    def name(self) -> str:
        return mesh_name(self.public)

    def issue(
        self, peer: PeerId | str, ttl: float = INVITE_TTL, now: float | None = None, admin: bool = False
    ) -> Certificate:
        """A certificate admitting ``peer`` for ``ttl`` seconds (as an administrator if ``admin``)."""
        peer = PeerId.from_string(peer) if isinstance(peer, str) else peer
        expires = int((time.time() if now is None else now) + ttl)
        sig = self._key.sign(Certificate.signed_part(self.public, peer, expires, admin))
        return Certificate(self.public, peer, expires, sig, admin)

    def to_text(self) -> str:
        return KEY_PREFIX + base64.urlsafe_b64encode(self._key.seed()).decode().rstrip("=")

    @classmethod
    def from_text(cls, text: str) -> MeshKey:
        seed = _unb64(text, KEY_PREFIX, "mesh key")
        if len(seed) != 32:
            raise CertificateError("a mesh key is 32 bytes")
        return cls(KeyPair.from_seed(seed))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key with mode 0600; refuses to overwrite (another mesh's key would be lost).
        Written whole to a temporary file first and linked into place, so a process starting at
        the same moment never reads a half-written key."""
        path = os.fspath(path)
        folder, name = os.path.split(path)
        if folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, (self.to_text() + "\n").encode())
            finally:
                os.close(fd)
            os.link(tmp, path)  # fails if the file exists: never overwrites
        except OSError as e:
            raise KeyFileError(f"cannot create mesh key file {path}: {e.strerror or e}") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> MeshKey:
        """The key in ``path``; if there is none yet, a new one saved there (as Erlang's cookie
        file: every node this user starts on this machine is then in one mesh)."""
        try:
            return cls.from_text(_read_text(path))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise KeyFileError(f"cannot read mesh key file {path}: {e.strerror}") from None
        try:
            key = cls.generate()
            key.save(path)
            return key
        except KeyFileError:
            if os.path.exists(path):  # another process created it first: use theirs
                return cls.from_text(_read_text(path))
            raise


def _read_text(path: str | os.PathLike[str]) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


_VERIFIED_CACHE = 4096


class Verdict(NamedTuple):
    """What a peer is to us: its circle, why, whether it administers our mesh, and until when
    (unix seconds: the expiry of the certificate that admits it)."""

    circle: str
    why: str
    admin: bool = False
    until: float = math.inf


# certificates (exact bytes) whose signature verified, with the reason they admit: a peer's every
# connection, to every node of this process, costs one check; bounded, and only certificates some
# mesh key signed get in
_VERIFIED: dict[bytes, str] = {}
_VERIFIED_LOCK = threading.Lock()


class Trust:
    """This node's admission policy: the meshes whose certificates admit a peer, PeerIds admitted
    by name, or everyone (open); and the certificates it presents to peers itself."""

    def __init__(
        self,
        me: PeerId,
        meshes: Iterable[bytes] = (),
        certificates: Iterable[Certificate] = (),
        members: Iterable[PeerId] = (),
        open: bool = False,
    ) -> None:
        self.me = me
        self.meshes: frozenset[bytes] = frozenset(meshes)
        self.certificates = tuple(certificates)
        self.members: frozenset[PeerId] = frozenset(members)
        self.open = open
        self.presented: list[bytes] = [c.to_bytes() for c in self.certificates]

    def judge(self, peer: PeerId, presented: Any, now: float) -> Verdict:
        """What ``peer`` is to us, given what it presented (certificate bytes) in identify:
        ``(circle, why, admin)``; ``why`` says what made it a member, or why it is a stranger."""
        if peer == self.me:
            return Verdict(SELF, "this node", True)
        if not self.open and peer in self.members:
            return Verdict(MEMBER, "listed as a member")
        best: Verdict | None = None
        why = "its mesh certificates are malformed"
        if not presented:
            why = "it presented no mesh certificate"
        elif type(presented) is list and len(presented) <= MAX_PRESENTED:
            for raw in presented:
                try:
                    cert = Certificate.from_bytes(raw)
                except CertificateError:
                    continue
                known = _VERIFIED.get(raw)
                problem = cert.problem(peer, self.meshes, now, signature_checked=known is not None)
                if problem is None:
                    if known is None:
                        known = f"certified by {mesh_name(cert.mesh)}" + (" as an administrator" if cert.admin else "")
                        with _VERIFIED_LOCK:  # nodes of one process judge on their own threads
                            if len(_VERIFIED) >= _VERIFIED_CACHE:
                                _VERIFIED.pop(next(iter(_VERIFIED)), None)
                            _VERIFIED[raw] = known
                    if cert.admin:
                        return Verdict(MEMBER, known, True, cert.expires)
                    if best is None or cert.expires > best.until:
                        best = Verdict(MEMBER, known, False, cert.expires)
                else:
                    why = problem
        if best is not None:
            return best
        if self.open:
            return Verdict(MEMBER, "the mesh is open")
        return Verdict(STRANGER, why)

    @property
    def admin(self) -> bool:
        """This node administers a mesh it belongs to (it holds an administrator's certificate)."""
        return any(c.admin and c.peer == self.me for c in self.certificates)

    def certificate(self, now: float, mesh: bytes | None = None) -> Certificate | None:
        """Our live certificate of ``mesh`` or, without one, of the first mesh we belong to (what
        scoped DHT keys are kept under); None if we hold none (an open mesh: the plain keys)."""
        if self.open and mesh is None:
            return None
        meshes = self.meshes if mesh is None else (mesh,)
        return next((c for c in self.certificates if c.mesh in meshes and c.peer == self.me and c.expires > now), None)

    def describe(self) -> str:
        """One line for humans (``lattica doctor``)."""
        if self.open:
            return "open mesh: every authenticated peer is a member"
        parts = [mesh_name(m) for m in sorted(self.meshes)]
        if self.members:
            parts.append(f"{len(self.members)} listed peer(s)")
        return "members: " + (", ".join(parts) if parts else "none but this node")


class MemberNotary:
    """Seals this node's membership statements (``lattica._membership``) with its identity key and
    its mesh certificates, and admits another's only when the statement is signed by the key its
    PeerId names and the certificates make it a member of our mesh (or it is ourselves)."""

    _CACHE = 4096

    def __init__(self, keypair: KeyPair, trust: Trust) -> None:
        self._keypair = keypair
        self._trust = trust
        self._checked: dict[tuple[Any, ...], float] = {}  # (member, statement, signature, certs) -> admitted until

    def seal(self, statement: bytes) -> list[Any]:
        return [self._keypair.sign(statement), self._trust.presented]

    def admits(self, member_id: str, statement: bytes, proof: Any) -> bool:
        """Whether the statement is the member's own and its certificates admit it now (wall
        clock: certificates expire in unix time, whatever clock the membership runs on)."""
        now = time.time()
        if type(proof) is not list or len(proof) != 2 or type(proof[0]) is not bytes or type(proof[1]) is not list:
            return False
        certs = proof[1]
        if len(certs) > MAX_PRESENTED or not all(type(c) is bytes and len(c) <= MAX_CERT_BYTES for c in certs):
            return False
        key = (member_id, statement, proof[0], *certs)
        until = self._checked.get(key)
        if until is None:
            until = self._check(member_id, statement, proof[0], certs, now)
            if len(self._checked) >= self._CACHE:
                del self._checked[next(iter(self._checked))]
            self._checked[key] = until
        return now < until

    def administers(self, member_id: str, proof: Any) -> bool:
        """Whether the certificates sealed into a member's statement (``proof``, as ``admits``
        took it) make it an administrator of our mesh: a fact placement may weigh, unlike what
        a member says of itself."""
        if member_id == str(self._trust.me):
            return self._trust.admin
        if type(proof) is not list or len(proof) != 2 or type(proof[1]) is not list:
            return False
        try:
            peer = PeerId.from_string(member_id)
        except LatticaError:
            return False
        return self._trust.judge(peer, proof[1], time.time()).admin

    def _check(self, member_id: str, statement: bytes, signature: bytes, certs: list[Any], now: float) -> float:
        """Until when the statement admits its member (0.0: it does not)."""
        try:
            peer = PeerId.from_string(member_id)
        except LatticaError:
            return 0.0
        public = peer.public_key()
        if public is None or not verify_signature(public, signature, statement):
            return 0.0
        verdict = self._trust.judge(peer, certs, now)
        return verdict.until if verdict.circle in (SELF, MEMBER) else 0.0


def default_mesh_path() -> str:
    """Where a node that is given no mesh finds (or creates) its user's mesh key."""
    return os.path.join(os.path.expanduser("~"), ".lattica", "mesh.key")


#: One ``mesh`` setting: a MeshKey, a Certificate, their text, a file holding either, or ``"open"``.
Credential = MeshKey | Certificate | str | os.PathLike[str]


def load_trust(
    me: PeerId,
    mesh: Credential | list[Credential] | tuple[Credential, ...] | None = None,
    members: Iterable[PeerId | str] = (),
) -> Trust:
    """The Trust of a node from its ``mesh`` setting: a MeshKey, a Certificate, their text, a file
    holding either, ``"open"``, or a list of those; None means the ``LATTICA_MESH`` environment
    variable if set, else the user's key file (:func:`default_mesh_path`, created on first use)."""
    if mesh is None:
        mesh = os.environ.get(ENV) or default_mesh_path()
    listed = [PeerId.from_string(p) if isinstance(p, str) else p for p in members]
    items = list(mesh) if isinstance(mesh, (list, tuple)) else [mesh]
    meshes: list[bytes] = []
    certs: list[Certificate] = []
    open_ = False
    for item in items:
        cred = read_credential(item)
        if isinstance(cred, str):  # the only text read_credential returns is OPEN
            open_ = True
        elif isinstance(cred, MeshKey):
            meshes.append(cred.public)
            certs.append(cred.issue(me, SELF_CERT_TTL, admin=True))  # who holds the key runs the mesh
        else:
            if cred.peer != me:
                raise CertificateError(f"this mesh certificate admits {cred.peer}, not this node ({me})")
            meshes.append(cred.mesh)
            certs.append(cred)
    return Trust(me, meshes, certs[:MAX_PRESENTED], listed, open_)


def read_credential(item: Credential) -> MeshKey | Certificate | str:
    """A ``mesh`` setting item as a MeshKey, a Certificate or ``"open"`` (files are read)."""
    if isinstance(item, (MeshKey, Certificate)):
        return item
    if isinstance(item, os.PathLike):
        return _credential_file(os.fspath(item))
    if not isinstance(item, str):
        raise TypeError(
            f"mesh: a MeshKey, a Certificate, their text, a file path or {OPEN!r}, not {type(item).__name__}"
        )
    text = item.strip()
    if text == OPEN:
        return OPEN
    if text.startswith(KEY_PREFIX):
        return MeshKey.from_text(text)
    if text.startswith(CERT_PREFIX):
        return Certificate.from_text(text)
    return _credential_file(os.path.expanduser(text))


def _credential_file(path: str) -> MeshKey | Certificate:
    default = os.path.abspath(path) == os.path.abspath(default_mesh_path())
    if default or not os.path.exists(path):
        if not default:
            raise KeyFileError(f"mesh file {path} does not exist (create one with `lattica mesh new {path}`)")
        return MeshKey.load_or_create(path)
    try:
        text = _read_text(path).strip()
    except OSError as e:
        raise KeyFileError(f"cannot read mesh file {path}: {e.strerror}") from None
    if text.startswith(CERT_PREFIX):
        return Certificate.from_text(text)
    return MeshKey.from_text(text)
