"""Ed25519 keys, key files and signatures over canonical JSON (SPEC §17.11).

A *signing key* file holds a private key (mode 0600, refused if group or
others may read it); a *public key* file holds its public half.  Both are
small JSON objects; a key's id is the SHA-256 (hex) of its 32 raw public
bytes.  What is signed is always :func:`canonical` bytes of a JSON object
whose ``format`` member says what it is, so a signature over one kind of
document can never be presented as a signature over another.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ...errors import BadArgumentError, StorageError
from ...format import strictjson
from ...io.atomic import atomic_file
from ...io.filekind import document_refusal, os_message
from ...limits import MAX_DOCUMENT_BYTES
from ..storage.smallfile import read_regular

PRIVATE_FORMAT = "wdelta-signing-key"
PUBLIC_FORMAT = "wdelta-public-key"
KEY_ROLES = ("root", "revisions")  # what ``keygen --role`` may label a key file for
_HEX64 = frozenset("0123456789abcdef")


def canonical(doc: dict[str, Any]) -> bytes:
    """The signed bytes of ``doc``: members sorted, no whitespace, ASCII only.

    The schemas of every signed object allow only ASCII strings without
    escapes, integers and nested objects, so these bytes are unambiguous.
    """
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_id(public: bytes) -> str:
    """SHA-256 (64 lowercase hex) of a 32-byte raw Ed25519 public key."""
    return hashlib.sha256(public).hexdigest()


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key: ``raw`` 32 bytes, ``keyid`` its SHA-256 hex."""

    raw: bytes

    @property
    def keyid(self) -> str:
        return key_id(self.raw)

    def verify(self, signature_hex: str, payload: bytes) -> bool:
        """True if ``signature_hex`` (128 hex digits) signs ``payload`` with this key."""
        try:
            sig = bytes.fromhex(signature_hex)
            Ed25519PublicKey.from_public_bytes(self.raw).verify(sig, payload)
        except (ValueError, InvalidSignature):
            return False
        return True

    def to_json(self) -> dict[str, str]:
        return {"format": PUBLIC_FORMAT, "type": "ed25519", "public": self.raw.hex()}


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key (from its 32-byte seed); signatures are deterministic."""

    seed: bytes

    @property
    def public(self) -> PublicKey:
        raw = self._key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return PublicKey(raw)

    def _key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)

    def sign(self, payload: bytes) -> str:
        """The Ed25519 signature of ``payload``, 128 lowercase hex digits."""
        return self._key().sign(payload).hex()

    def to_json(self) -> dict[str, str]:
        return {"format": PRIVATE_FORMAT, "type": "ed25519", "keyid": self.public.keyid,
                "private": self.seed.hex()}  # fmt: skip


def generate() -> SigningKey:
    """A new random signing key."""
    return SigningKey(os.urandom(32))


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A small JSON object from ``path``; anything else is a bad argument."""
    try:
        data = read_regular(path, MAX_DOCUMENT_BYTES, lambda why: BadArgumentError(
            f"{path} is {why}: not a {what}"))  # fmt: skip
    except FileNotFoundError as exc:
        raise StorageError(os_message(path, exc)) from exc
    if (impostor := document_refusal(path, data, what)) is not None:
        raise BadArgumentError(impostor)
    try:
        raw = strictjson.loads(data, BadArgumentError, f"{path}")
    except BadArgumentError as exc:
        raise BadArgumentError(f"{path} is not a {what} (not JSON: {exc})") from exc
    if not isinstance(raw, dict):
        raise BadArgumentError(f"{path} is not a {what} (not a JSON object)")
    return raw


def _hex_member(raw: dict[str, Any], name: str, path: Path, what: str) -> bytes:
    value = raw.get(name)
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX64:
        raise BadArgumentError(f"{path} is not a {what}: {name!r} is not 64 lowercase hex digits")
    return bytes.fromhex(value)


def _kind(raw: dict[str, Any]) -> str:
    value = raw.get("format")
    if value == PRIVATE_FORMAT:
        return "a private signing key"
    if value == PUBLIC_FORMAT:
        return "a public key"
    if isinstance(raw.get("signed"), dict):
        return "a trust root or signature"
    return f"format {value!r}" if isinstance(value, str) else "an unknown JSON object"


def load_signing_key(path: Path) -> SigningKey:
    """The private key in ``path``; refused if group or others can read the file."""
    raw = read_json(path, "signing key file")
    if raw.get("format") != PRIVATE_FORMAT:
        raise BadArgumentError(f"{path} is {_kind(raw)}, not a private signing key")
    mode = path.stat().st_mode
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BadArgumentError(
            f"{path}: a private key readable by others (mode {stat.S_IMODE(mode):04o}) "
            "is refused; run chmod 600 on it"
        )
    key = SigningKey(_hex_member(raw, "private", path, "signing key file"))
    if raw.get("keyid") != key.public.keyid:
        raise BadArgumentError(f"{path}: its keyid does not match its private key")
    return key


def load_revision_key(path: Path) -> SigningKey:
    """A private key to sign revisions with; a key labelled as a root key is refused."""
    check_role(path, "revisions", "--sign")
    return load_signing_key(path)


def load_public_key(path: Path) -> PublicKey:
    """The public key in ``path`` (a private key file is refused: pass its .pub)."""
    raw = read_json(path, "public key file")
    if raw.get("format") != PUBLIC_FORMAT:
        raise BadArgumentError(f"{path} is {_kind(raw)}, not a public key")
    return PublicKey(_hex_member(raw, "public", path, "public key file"))


def check_role(path: Path, role: str, flag: str) -> None:
    """Refuse a key file labelled for another role than ``role`` (``keygen --role``):
    a root key passed to sign revisions would then sit on an online host."""
    try:
        label = read_json(path, "key file").get("role")
    except BadArgumentError:
        return  # not a key file at all: its loader says so, in its own words
    if label is None or label == role:
        return
    if label not in KEY_ROLES:
        raise BadArgumentError(f"{path}: unknown key role {label!r}, not one of {KEY_ROLES}")
    hint = "; keep root keys offline and sign revisions with a revisions key" * (label == "root")
    raise BadArgumentError(f"{path} is a {label} key; {flag} takes {role} keys{hint}")


def write_json(path: Path, doc: dict[str, Any], *, private: bool = False) -> None:
    """Write ``doc`` atomically to a new file ``path`` (mode 0600 when ``private``)."""
    data = (json.dumps(doc, indent=2) + "\n").encode()
    with atomic_file(path, overwrite=False) as fd:
        if private:
            os.fchmod(fd, 0o600)  # before the key is written, not after
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


def kind_of(path: Path) -> str:
    """What a JSON file is, for error messages (``a private signing key``, ...)."""
    return _kind(read_json(path, "JSON document"))
