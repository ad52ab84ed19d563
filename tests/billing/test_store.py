"""BillingStore on SQLite and PostgreSQL: tenants, validation, audit, keys (hash-only, revocation, formats)."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from sqlalchemy import text

from billing import BillingStore, KeyNotFound, TenantExists, TenantNotFound
from billing.keys import KEY_PREFIX, generate_secret, is_well_formed


def test_tenant_create_get_update_and_audit(store: BillingStore) -> None:
    tenant = store.create_tenant("acme", weight=2.0, tokens_per_minute=1000, max_queued_requests=5)
    assert store.get_tenant("acme") == tenant
    assert store.get_tenant(tenant.id) == tenant
    assert store.get_tenant("nobody") is None
    with pytest.raises(TenantExists):
        store.create_tenant("acme")
    updated = store.update_tenant(tenant.id, actor="alice", weight=3.0, tokens_per_day=None, priority_class=0)
    assert (updated.weight, updated.priority_class) == (3.0, 0)
    assert updated.updated_at >= tenant.updated_at
    assert store.get_tenant("acme") == updated
    entry = store.list_audit(limit=1)[0]
    assert (entry.actor, entry.action, entry.tenant_id) == ("alice", "tenant.update", tenant.id)
    assert entry.before is not None and entry.after is not None
    assert (entry.before["weight"], entry.after["weight"]) == (2.0, 3.0)
    assert [e.action for e in store.list_audit(limit=10)] == ["tenant.update", "tenant.create"]
    with pytest.raises(TenantNotFound):
        store.update_tenant("nobody", weight=1.0)
    store.create_tenant("beta")
    with pytest.raises(TenantExists):
        store.update_tenant("beta", name="acme")
    assert [t.name for t in store.list_tenants()] == ["acme", "beta"]


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"weight": 0}, "weight"),
        ({"weight": -1.5}, "weight"),
        ({"weight": float("nan")}, "weight"),
        ({"tokens_per_minute": -1}, "tokens_per_minute"),
        ({"tokens_per_day": 1.5}, "tokens_per_day"),
        ({"max_queued_requests": -3}, "max_queued_requests"),
        ({"priority_class": -1}, "priority_class"),
        ({"priority_class": True}, "priority_class"),
    ],
)
def test_bad_tenant_fields_are_refused(store: BillingStore, fields: dict, fragment: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=fragment):
        store.create_tenant("bad", **fields)
    assert store.get_tenant("bad") is None
    good = store.create_tenant("good")
    with pytest.raises(ValueError, match=fragment):
        store.update_tenant(good.id, **fields)
    with pytest.raises(ValueError, match="unknown tenant field"):
        store.update_tenant(good.id, colour="red")
    with pytest.raises(ValueError, match="name"):
        store.create_tenant("   ")


def test_keys_are_stored_only_as_hashes(store: BillingStore) -> None:
    tenant = store.create_tenant("acme")
    secret, info = store.create_key("acme", name="ci")
    assert secret.startswith(KEY_PREFIX) and is_well_formed(secret)
    assert info.prefix == secret[: len(info.prefix)] and len(info.prefix) < len(secret) - 20
    assert info.tenant_id == tenant.id
    with store.db.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM api_keys")).mappings().all()
    assert len(rows) == 1
    stored = " ".join(str(v) for v in rows[0].values())
    assert secret not in stored and secret[len(info.prefix) :] not in stored
    assert rows[0]["key_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    verified = store.verify_key(secret)
    assert verified is not None and verified[0].id == tenant.id and verified[1].id == info.id
    assert verified[1].last_used_at is not None


def test_secrets_have_enough_entropy() -> None:
    secrets = {generate_secret() for _ in range(2000)}
    assert len(secrets) == 2000
    body_chars = 62 ** (len(next(iter(secrets))) - len(KEY_PREFIX))
    assert body_chars.bit_length() >= 129
    # Every position of the body varies, so the encoding does not waste the entropy.
    for pos in range(len(KEY_PREFIX), len(KEY_PREFIX) + 43):
        assert len({s[pos] for s in secrets}) > 20


def test_revoked_unknown_malformed_and_disabled_are_refused(store: BillingStore) -> None:
    store.create_tenant("acme")
    secret, info = store.create_key("acme")
    other, _ = store.create_key("acme", name="second")
    assert store.verify_key(secret) is not None
    revoked = store.revoke_key(info.id)
    assert revoked.revoked_at is not None
    assert store.verify_key(secret) is None
    assert store.verify_key(other) is not None
    assert store.revoke_key(info.id).revoked_at == revoked.revoked_at  # idempotent
    with pytest.raises(KeyNotFound):
        store.revoke_key("no-such-key")
    assert store.verify_key(generate_secret()) is None  # well-formed but unknown
    for bad in (
        "",
        "Bearer " + other,
        other + "x",
        other[:-1],
        other.upper(),
        "sk-" + other[4:],
        other[:10] + "!" + other[11:],
        " " + other,
        None,
        42,
    ):
        assert store.verify_key(bad) is None  # type: ignore[arg-type]
    store.update_tenant("acme", disabled=True)
    assert store.verify_key(other) is None
    store.update_tenant("acme", disabled=False)
    assert store.verify_key(other) is not None
    assert [k.revoked for k in store.list_keys("acme")] == [True, False]
    with pytest.raises(TenantNotFound):
        store.create_key("nobody")


def test_verification_compares_in_constant_time(store: BillingStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.create_tenant("acme")
    secret, _ = store.create_key("acme")
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("billing.keys.hmac.compare_digest", spy)
    assert store.verify_key(secret) is not None
    assert calls and calls[-1][0] == calls[-1][1] == hashlib.sha256(secret.encode()).hexdigest().encode()
