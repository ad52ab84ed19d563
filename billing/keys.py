"""API key secrets: generation with a recognisable prefix, sha256 hashing, format checks, constant-time compare.

A secret looks like `fsk_` followed by 43 base62 characters (256 bits from `secrets`); only its sha256 hex
digest is stored, plus the first 12 characters as a display prefix so operators can tell keys apart.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

KEY_PREFIX = "fsk_"
SECRET_BYTES = 32  # 256 bits of entropy; the issue asks for at least 128
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# ceil(256 / log2(62)) = 43 base62 digits always suffice; left-pad so every key has one length.
BODY_LENGTH = 43
DISPLAY_PREFIX_LENGTH = len(KEY_PREFIX) + 8
_KEY_RE = re.compile(rf"^{KEY_PREFIX}[0-9A-Za-z]{{{BODY_LENGTH}}}$")


def _base62(n: int) -> str:
    digits = []
    while n:
        n, rem = divmod(n, 62)
        digits.append(_ALPHABET[rem])
    return "".join(reversed(digits)).rjust(BODY_LENGTH, "0")


def generate_secret() -> str:
    """A fresh API key secret: `fsk_` + 43 base62 characters encoding 256 random bits."""
    return KEY_PREFIX + _base62(int.from_bytes(secrets.token_bytes(SECRET_BYTES), "big"))


def is_well_formed(secret: object) -> bool:
    """True when `secret` has the exact shape of a fairserve key (cheap check before any lookup)."""
    return isinstance(secret, str) and _KEY_RE.fullmatch(secret) is not None


def hash_secret(secret: str) -> str:
    """The stored form of a secret: its sha256 hex digest (secrets are high-entropy, so no salt is needed)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def display_prefix(secret: str) -> str:
    """The part of a secret that may be shown and stored in clear: `fsk_` plus 8 characters."""
    return secret[:DISPLAY_PREFIX_LENGTH]


def hashes_match(stored_hash: str, secret: str) -> bool:
    """Constant-time comparison of a stored hash with the hash of a presented secret."""
    return hmac.compare_digest(stored_hash.encode("ascii"), hash_secret(secret).encode("ascii"))
