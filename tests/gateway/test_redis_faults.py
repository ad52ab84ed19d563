"""Redis faults over real HTTP against `fairserve serve` processes: a private redis-server killed, restarted and
frozen (SIGSTOP). Nothing answers 500; requests without an Idempotency-Key are served; keyed ones get 503
`idempotency_unavailable`; quotas fail open (header, counter) or closed (503 `quota_unavailable`); /readyz
names the degraded dependency; the breaker closes again once Redis answers."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from billing import BillingStore, Database, default_db_url
from tests.billing.services import private_redis
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess
from tests.redis_server import RedisServer

METERED_TPM = 10**9  # a quota that never denies: every request still reserves and settles in Redis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of this module's own, on a free port."""
    yield from private_redis(tmp_path_factory.mktemp("redis"))


def _seed(data_dir: Path) -> dict[str, str]:
    """A tenant with a quota and one without, before the server starts; returns their keys."""
    db = Database(default_db_url(data_dir))
    db.upgrade()
    store = BillingStore(db)
    keys = {}
    for name, tpm in (("metered", METERED_TPM), ("free", None)):
        tenant = store.create_tenant(name, tokens_per_minute=tpm)
        keys[name] = store.create_key(tenant.id)[0]
    db.dispose()
    return keys


def _serve(tmp: Path, redis: RedisServer, *args: str) -> tuple[ServeProcess, dict[str, str]]:
    keys = _seed(tmp)
    # A 1 s deadline rather than the default 0.25 s: on a loaded 2-core machine a healthy call must not trip it.
    proc = ServeProcess(
        tmp, "--redis", redis.url, "--redis-timeout", "1", "--no-engine-process", "--max-num-seqs", "8", *args
    )
    keys["metrics_token"] = proc.banner["metrics_token"]
    return proc, keys


def _post(c: httpx.Client, key: str, idem: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if idem is not None:
        headers["Idempotency-Key"] = idem
    return c.post(
        "/v1/completions",
        json={"model": "fairserve-tiny", "prompt": "faults", "max_tokens": 2},
        headers=headers,
    )


def _metric(c: httpx.Client, name: str, labels: str, token: str) -> float:
    scrape = c.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", scrape, re.M)
    assert match, f"{name}{{{labels}}} not exported"
    return float(match.group(1))


def _degraded(c: httpx.Client) -> list[str]:
    ready = c.get("/readyz")
    assert ready.status_code == 200, ready.text  # degraded is not unready
    return list(ready.json()["degraded"])


def _recovered(c: httpx.Client, redis: RedisServer, key: str) -> None:
    """Redis is back: the background probe closes the breaker and keyed requests are served again."""
    wait_for(lambda: _degraded(c) == [], 90, "the breaker to close after Redis came back")
    again = _post(c, key, idem=uuid.uuid4().hex)
    assert again.status_code == 200, (again.text, c.get("/readyz").text)


def _model_name(c: httpx.Client, key: str) -> str:
    return str(c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"])


def test_killed_and_frozen_redis_degrade_without_500_fail_open(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    proc, keys = _serve(tmp_path / "open", redis_server)
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            assert _model_name(c, keys["metered"]) == "fairserve-tiny"
            healthy = _post(c, keys["metered"], idem=uuid.uuid4().hex)
            assert healthy.status_code == 200 and "x-quota-status" not in healthy.headers
            assert _degraded(c) == []
            assert _metric(c, "fairserve_backend_circuit_open", 'backend="redis"', keys["metrics_token"]) == 0

            redis_server.kill()
            _check_degraded(c, keys, ("ConnectionError",))
            redis_server.start()
            _recovered(c, redis_server, keys["metered"])

            wait_for(lambda: _quiet(redis_server), 30, "the last keyed request's record to be finished")
            redis_server.freeze()
            try:
                # The first call after the freeze reaches Redis and times out; Redis runs its SET NX on thaw.
                stale = uuid.uuid4().hex
                first = _post(c, keys["free"], idem=stale)
                assert first.status_code == 503 and first.json()["error"]["code"] == "idempotency_unavailable"
                _check_degraded(
                    c, keys, ("TimeoutError", "ConnectionError")
                )  # a connect timing out is either
            finally:
                redis_server.thaw()
            _recovered(c, redis_server, keys["metered"])
            # The record that timed-out claim left behind is released: a retry runs, it does not attach to
            # an owner that never existed and wait out the 15-minute lease.
            with httpx.Client(base_url=proc.url, timeout=30) as quick:
                retried = wait_for(
                    lambda: _fresh_run(quick, keys["free"], stale), 30, "the stale claim released"
                )
            assert "idempotent-replayed" not in retried.headers
            _stream_through_a_freeze(c, redis_server, keys["free"], keys["metrics_token"])
            trips = _metric(
                c, "fairserve_backend_circuit_trips_total", 'backend="redis"', keys["metrics_token"]
            )
            assert trips == 3, (trips, "".join(proc.output)[-4000:])  # killed, frozen, frozen mid-stream
            assert _metric(c, "fairserve_backend_circuit_open", 'backend="redis"', keys["metrics_token"]) == 0
        assert "Traceback" not in "".join(proc.output), "".join(proc.output)[-4000:]
    finally:
        proc.stop()


def _stream_through_a_freeze(
    c: httpx.Client, redis_server: RedisServer, key: str, metrics_token: str
) -> None:
    """A keyed stream whose Redis freezes mid-way is answered in full; its record, which could not be finished
    then, is finished once Redis is back, so a retry replays it instead of attaching to nobody or running twice."""
    wait_for(lambda: _quiet(redis_server), 30, "the last keyed request's record to be finished")
    body = {
        "model": "fairserve-tiny",
        "prompt": "through the freeze",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": uuid.uuid4().hex}
    lines: list[str] = []
    try:
        with c.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
            for line in resp.iter_lines():
                if line:
                    lines.append(line)
                    if len(lines) == 2:
                        redis_server.freeze()
        assert resp.status_code == 200 and lines[-1] == "data: [DONE]"
        wait_for(
            lambda: (
                _metric(c, "fairserve_idempotency_backend_unavailable_total", 'op="finish"', metrics_token)
                >= 1
            ),
            30,
            "the finish to fail against the frozen Redis",
        )
    finally:
        redis_server.thaw()
    wait_for(lambda: _degraded(c) == [], 90, "the breaker to close after Redis came back")
    with httpx.Client(base_url=str(c.base_url), timeout=30) as quick:
        replay = wait_for(lambda: _replayed(quick, body, headers), 30, "the record finished after the thaw")
    assert [line for line in replay.text.splitlines() if line] == lines


def _replayed(c: httpx.Client, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response | None:
    try:
        resp = c.post("/v1/completions", json=body, headers=headers)
    except httpx.TimeoutException:  # attached to the record left in flight: not finished yet
        return None
    assert resp.status_code == 200, resp.text
    return resp if resp.headers.get("idempotent-replayed") == "true" else None


def _quiet(server: RedisServer) -> bool:
    """No idempotency record is in flight: the gateway's bookkeeping after its last reply is done, so the
    next Redis call after a freeze is the one the test sends."""
    client = redis.Redis.from_url(server.url)
    try:
        records = [
            client.get(k) for k in client.scan_iter(match="fairserve:idem:*") if not k.endswith(b":events")
        ]
        return all(json.loads(r)["state"] == "finished" for r in records if r is not None)
    finally:
        client.close()


def _fresh_run(c: httpx.Client, key: str, idem: str) -> httpx.Response | None:
    """The response when the key runs afresh; None while the stale record still holds it (the follower gives
    up at the client timeout)."""
    try:
        resp = _post(c, key, idem=idem)
    except httpx.TimeoutException:
        return None
    assert resp.status_code == 200, resp.text
    return resp


def _check_degraded(c: httpx.Client, keys: dict[str, str], errors: tuple[str, ...]) -> None:
    """While Redis is away: plain requests served (quota failing open, said and counted), keyed ones 503."""
    before = _metric(
        c,
        "fairserve_quota_backend_unavailable_total",
        'op="reserve",outcome="allowed"',
        keys["metrics_token"],
    )
    plain = [_post(c, keys["metered"]) for _ in range(8)] + [_post(c, keys["free"]) for _ in range(4)]
    assert [r.status_code for r in plain] == [200] * 12, [r.text for r in plain if r.status_code != 200]
    assert all(r.headers["x-quota-status"].startswith("unenforced") for r in plain[:8])
    assert all("x-quota-status" not in r.headers for r in plain[8:])  # no quota, nothing unenforced
    keyed = _post(c, keys["free"], idem=uuid.uuid4().hex)
    assert keyed.status_code == 503, keyed.text
    assert keyed.json()["error"]["code"] == "idempotency_unavailable"
    assert keyed.json()["error"]["param"] == "Idempotency-Key" and int(keyed.headers["retry-after"]) >= 1
    assert (
        _metric(
            c,
            "fairserve_quota_backend_unavailable_total",
            'op="reserve",outcome="allowed"',
            keys["metrics_token"],
        )
        >= before + 8
    )
    assert (
        _metric(c, "fairserve_idempotency_backend_unavailable_total", 'op="claim"', keys["metrics_token"])
        >= 1
    )
    assert _metric(c, "fairserve_backend_circuit_open", 'backend="redis"', keys["metrics_token"]) == 1
    ready = c.get("/readyz").json()
    assert ready["ready"] is True and ready["degraded"] == ["redis"]
    redis = ready["dependencies"]["redis"]
    assert redis["state"] == "open" and redis["quota_on_failure"] == "open" and redis["last_error"] in errors
    assert "metered" not in c.get("/readyz").text and "free" not in c.get("/readyz").text  # no tenant data


def test_quota_fails_closed_when_set(tmp_path: Path, redis_server: RedisServer) -> None:
    proc, keys = _serve(tmp_path / "closed", redis_server, "--quota-on-redis-failure", "closed")
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            assert _post(c, keys["metered"]).status_code == 200
            redis_server.freeze()
            try:
                refused = [_post(c, keys["metered"]) for _ in range(3)]
                assert [r.status_code for r in refused] == [503] * 3, [r.text for r in refused]
                assert all(r.json()["error"]["code"] == "quota_unavailable" for r in refused)
                assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
                assert _post(c, keys["free"]).status_code == 200  # a tenant without quota needs no Redis
                assert (
                    _metric(
                        c,
                        "fairserve_quota_backend_unavailable_total",
                        'op="reserve",outcome="denied"',
                        keys["metrics_token"],
                    )
                    == 3
                )
                assert c.get("/readyz").json()["dependencies"]["redis"]["quota_on_failure"] == "closed"
            finally:
                redis_server.thaw()
            _recovered(c, redis_server, keys["metered"])
            assert _post(c, keys["metered"]).status_code == 200
        assert "Traceback" not in "".join(proc.output), "".join(proc.output)[-4000:]
    finally:
        proc.stop()
