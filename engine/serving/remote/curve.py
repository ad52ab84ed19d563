"""CurveZMQ between an engine and its gateways: one key file per deployment, or nobody else gets in.

Without it an engine's TCP port takes work from anyone who reaches it: a Submit names its own tenant, so
a process on the same network could bill any tenant's fair share, skip the gateway's quotas, and read the
outputs of what it sent in clear. With `--cluster-key FILE` on the engine and on its gateways:

- the engine's ROUTER is a CURVE server and its ZAP handler (pyzmq's ThreadAuthenticator) admits only
  the gateway key derived from the file, so a peer without the file is refused during the ZMTP
  handshake, before any frame reaches the engine loop;
- every frame both ways is encrypted and authenticated (Curve25519, as CurveZMQ specifies).

Why CURVE and not a token in `Hello`: a token would travel in clear and be checked by our own code,
after the frame was read; the handshake does both jobs inside libzmq. Why one file and not a key pair
per process: the operator copies one secret to the machines of one deployment, as with any cluster
secret. The engine's and the gateways' key pairs are both derived from it (BLAKE2b with distinct
personalisations), so neither side's secret is the other's. The file holds 32 random bytes in Z85
(40 characters), is created 0600 by the engine when missing, and is never printed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

log = logging.getLogger("fairserve.engine.remote")

# A peer whose handshake the other side refused: a wrong key, no key against a keyed engine, or the reverse.
HANDSHAKE_REFUSED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class ClusterKeyError(ValueError):
    """The key file is missing, unreadable or not a key."""


def _derive(secret: bytes, role: bytes) -> tuple[bytes, bytes]:
    """(public, secret) Z85 key pair for `role`, from the deployment's 32-byte secret."""
    role_secret = z85.encode(hashlib.blake2b(secret, digest_size=32, person=b"fs:" + role).digest())
    return zmq.curve_public(role_secret), role_secret


@dataclass(frozen=True, repr=False)
class ClusterKey:
    """The two key pairs of one deployment (repr hides them: they must not reach a log)."""

    engine_public: bytes
    engine_secret: bytes
    gateway_public: bytes
    gateway_secret: bytes

    def __repr__(self) -> str:
        return "ClusterKey(...)"

    @classmethod
    def from_secret(cls, text: str) -> ClusterKey:
        """The key pairs for a deployment secret as stored in a key file (Z85, 40 characters)."""
        text = text.strip()
        if len(text) != 40:
            raise ClusterKeyError(
                "a cluster key is 40 Z85 characters (create one with `fairserve engine "
                "--cluster-key NEW_FILE`)"
            )
        try:
            raw = z85.decode(text)
        except (ValueError, KeyError, IndexError) as exc:
            raise ClusterKeyError(f"a cluster key is Z85 text: {exc}") from exc
        return cls(*_derive(raw, b"engine"), *_derive(raw, b"gateway"))

    @classmethod
    def load(cls, path: Path) -> ClusterKey:
        """Read a key file; ClusterKeyError names what is wrong with it."""
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ClusterKeyError(f"cannot read the cluster key {path}: {exc}") from exc
        return cls.from_secret(text)


def create_key_file(path: Path) -> bool:
    """Write a fresh key file (mode 0600) unless one exists; True when this call wrote it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(z85.encode(secrets.token_bytes(32)).decode() + "\n")
    return True


class _OnlyGateways:
    """ZAP callback: admit the deployment's gateway key, refuse (and say so once per key) the rest."""

    def __init__(self, gateway_public: bytes) -> None:
        self._gateway_public = gateway_public
        self._refused: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        if secrets.compare_digest(key, self._gateway_public):
            return True
        if key not in self._refused and len(self._refused) < 1024:  # bounded: a scanner must not grow it
            self._refused.add(key)
            log.warning("refused a peer whose key is not this deployment's (its public key %s)", key.decode())
        return False


def serve_securely(ctx: zmq.Context[Any], sock: zmq.Socket[Any], key: ClusterKey) -> ThreadAuthenticator:
    """Make `sock` (not yet bound) a CURVE server that admits only this deployment's gateways."""
    auth = ThreadAuthenticator(ctx, log=logging.getLogger("fairserve.engine.remote.zap"))
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_OnlyGateways(key.gateway_public))
    sock.curve_secretkey = key.engine_secret
    sock.curve_publickey = key.engine_public
    sock.curve_server = True
    return auth


def connect_securely(sock: zmq.Socket[Any], key: ClusterKey) -> None:
    """Make `sock` (not yet connected) a CURVE client of the deployment's engines."""
    sock.curve_serverkey = key.engine_public
    sock.curve_publickey = key.gateway_public
    sock.curve_secretkey = key.gateway_secret
