"""Engine-side accounting: requests in flight when their gateway is killed are billed `interrupted` by
another gateway from the engine's own record; confirmed requests are never billed twice; a disconnect's
delivered tokens are kept beside the produced ones (real `fairserve engine` + two `serve --engine`)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from sqlalchemy import text

from billing import BillingStore, Database, default_db_url
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.serving.boundary.messages import IterationReport, Submit
from engine.serving.remote.messages import FromServer
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture, for the PostgreSQL runs)
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess

IN_FLIGHT = 3


def _rows(db_url: str, tag: str) -> dict[str, dict[str, Any]]:
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            found = conn.execute(text("SELECT * FROM usage WHERE request_id LIKE :p"), {"p": f"{tag}%"})
            return {r["request_id"]: dict(r) for r in found.mappings()}
    finally:
        db.dispose()


def _stream(
    url: str, headers: dict[str, str], body: dict[str, Any], started: threading.Event, chunks: int
) -> None:
    """Read `chunks` events of a stream (0: all of it), then leave; a killed gateway just ends it."""
    try:
        with (
            httpx.Client(base_url=url, timeout=60) as c,
            c.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
        ):
            for n, line in enumerate(resp.iter_lines(), 1):
                if line:
                    started.set()
                if chunks and n >= chunks:
                    return
    except httpx.HTTPError:
        pass
    finally:
        started.set()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (
        str(request.getfixturevalue("pg_url")) if request.param == "postgresql" else default_db_url(tmp_path)
    )


MODEL, COST = "intr-model", 4.0  # interrupted rows are charged at the serving model's --model-cost


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess(
        tmp_path / "engine",
        *("--max-num-seqs", "4", "--num-kv-blocks", "256", "--served-model-name", MODEL),
        *("--gateway-timeout", "1"),
    )
    yield proc
    proc.kill()


def _engine_charges(engine_dir: Path) -> dict[str, float]:
    """The engine's own charge of each finished request, by ledger request id, from its produced.log."""
    charges: dict[str, float] = {}
    for line in (engine_dir / "produced.log").read_text().splitlines():
        doc = json.loads(line)
        if "f" in doc:
            record = doc["f"][1]
            charges[record[1]] = float(record[12])  # ledger_request_id, charged_service (ProducedRecord)
    return charges


def test_a_killed_gateways_requests_are_billed_interrupted(
    db_url: str, engine: EngineProcess, tmp_path: Path
) -> None:
    db = Database(db_url)
    db.upgrade()
    store = BillingStore(db)
    tenant_id = store.create_tenant(f"intr-{uuid.uuid4().hex[:8]}").id
    key = store.create_key(tenant_id)[0]
    db.dispose()
    tag = f"intr-{uuid.uuid4().hex[:8]}-"
    cost = ("--model-cost", f"{MODEL}={COST:g}")
    first = ServeProcess(tmp_path / "gw1", "--db", db_url, "--engine", engine.address, *cost)
    second = ServeProcess(tmp_path / "gw2", "--db", db_url, "--engine", engine.address, *cost)
    try:
        assert any("no --cluster-key: the engines at" in line for line in first.output)  # as the engine warns
        model = httpx.get(f"{first.url}/v1/models", headers=first.headers(key), timeout=10).json()["data"][0][
            "id"
        ]
        body = {"model": model, "prompt": "count", "max_tokens": 8, "stream": True}
        done = threading.Event()
        _stream(first.url, first.headers(key, **{"X-Request-Id": f"{tag}done"}), body, done, 0)
        long_body = {**body, "max_tokens": 2000, "ignore_eos": True}
        threads, started = [], []
        for i in range(IN_FLIGHT):
            ev = threading.Event()
            headers = first.headers(key, **{"X-Request-Id": f"{tag}cut-{i}"})
            t = threading.Thread(target=_stream, args=(first.url, headers, long_body, ev, 0))
            t.start()
            threads.append(t)
            started.append(ev)
        for ev in started:
            assert ev.wait(60)
        first.proc.kill()  # kill -9 with IN_FLIGHT streams live on the engine
        first.proc.wait(30)
        for t in threads:
            t.join(60)
        # The engine reaps the dead gateway, aborts its requests and keeps their records; the second
        # gateway bills them once they are ORPHAN_AFTER_S old.
        want = {f"{tag}cut-{i}" for i in range(IN_FLIGHT)}
        rows = wait_for(lambda: (r := _rows(db_url, tag)) and want <= set(r) and r, 90, "interrupted rows")
        charges = _engine_charges(tmp_path / "engine")
        for rid in want:
            assert rows[rid]["status"] == "interrupted", rows[rid]
            assert rows[rid]["completion_tokens"] > 0 and rows[rid]["delivered_tokens"] is None
            assert rows[rid]["model"] == rows[rid]["served_model"] == MODEL
            assert rows[rid]["charged_service"] == pytest.approx(COST * charges[rid]) and charges[rid] > 0
        # The answered request was confirmed to the engine, so only the killed gateway's journal holds it
        # (unless its writer got there first): its restart replays it, and it is billed once, completed.
        again = ServeProcess(tmp_path / "gw1", "--db", db_url, "--engine", engine.address, *cost)
        again.stop()
        rows = _rows(db_url, tag)
        assert rows[f"{tag}done"]["status"] == "completed"
        assert rows[f"{tag}done"]["delivered_tokens"] == rows[f"{tag}done"]["completion_tokens"]
        done_charge = _engine_charges(tmp_path / "engine")[f"{tag}done"]
        assert rows[f"{tag}done"]["charged_service"] == pytest.approx(COST * done_charge)  # the same price
        assert len(rows) == IN_FLIGHT + 1
        # A client that leaves mid-stream: produced tokens billed, delivered ones kept beside them.
        left = threading.Event()
        _stream(second.url, second.headers(key, **{"X-Request-Id": f"{tag}left"}), long_body, left, 4)
        row = wait_for(lambda: _rows(db_url, f"{tag}left").get(f"{tag}left"), 60, "the disconnect's row")
        assert row["status"] == "cancelled"
        assert row["delivered_tokens"] is not None and row["delivered_tokens"] <= row["completion_tokens"]
        _reconciles(db_url, engine, second, tenant_id, tag)
    finally:
        first.stop()
        second.stop()


def _mine(differences: list[dict[str, Any]], tenant_id: str) -> list[dict[str, Any]]:
    return [d for d in differences if d["tenant_id"] == tenant_id]  # the PostgreSQL ledger is shared


def _reconciles(db_url: str, engine: EngineProcess, gateway: ServeProcess, tenant_id: str, tag: str) -> None:
    """`usage reconcile` and the admin endpoint: no difference for the tenant, then one for a lost row."""
    admin = {"Authorization": f"Bearer {gateway.banner['admin_token']}"}
    report = httpx.get(f"{gateway.url}/admin/api/ledger/reconcile?since=1h", headers=admin, timeout=30).json()
    assert report["engine_totals"][tenant_id]["requests"] == IN_FLIGHT + 2
    assert report["ledger"][tenant_id] == report["engine_totals"][tenant_id]
    assert _mine(report["differences"], tenant_id) == []
    db = Database(db_url)
    with db.engine.begin() as conn:  # a row lost to the ledger
        conn.execute(text("DELETE FROM usage WHERE request_id = :r"), {"r": f"{tag}left"})
    db.dispose()
    cmd = [sys.executable, "-m", "gateway.cli", "usage", "reconcile", "--since", "1h", "--db", db_url]
    out = subprocess.run(
        [*cmd, "--engine", engine.address, "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1, out.stderr
    lost = _mine(json.loads(out.stdout)["differences"], tenant_id)
    assert {d["count"] for d in lost} >= {"requests", "completion_tokens"}
    assert next(d for d in lost if d["count"] == "requests")["delta"] == -1


def _raw_peer_submits(address: str, tenant_id: str, ledger_id: str) -> None:
    """A bare ZeroMQ DEALER (no gateway of the deployment) submits a request as `tenant_id`, reads until it
    has finished, and leaves."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"intruder-peer")
    decoder = msgspec.msgpack.Decoder(FromServer)
    try:
        sock.connect(address)
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        meta = RequestMeta(tenant_id=tenant_id, ledger_id=ledger_id)
        sock.send(msgspec.msgpack.encode(Submit("intruder-1", [5, 6, 7, 8], params, meta)))
        while sock.poll(60_000):
            msg = decoder.decode(sock.recv())
            if isinstance(msg, IterationReport) and any(
                o.request_id == "intruder-1" and o.finished for o in msg.outputs
            ):
                return
        raise AssertionError("the raw peer's request never finished")
    finally:
        sock.close(linger=0)
        ctx.term()


def _metric(gateway: ServeProcess, line_start: str) -> float:
    headers = {"Authorization": f"Bearer {gateway.banner['metrics_token']}"}
    text_ = httpx.get(f"{gateway.url}/metrics", headers=headers, timeout=10).text
    return sum(float(line.split()[-1]) for line in text_.splitlines() if line.startswith(line_start))


def test_a_raw_peers_work_is_logged_and_counted_never_billed(engine: EngineProcess, tmp_path: Path) -> None:
    """On an engine without a cluster key a bare ZeroMQ peer runs a request as the victim tenant and
    leaves. The engine keeps the record as it would a dead gateway's; the attached gateway sees that the
    peer is no gateway of its deployment and bills nothing (it did bill a dead gateway's, above)."""
    db_url = default_db_url(tmp_path / "gw")
    gateway = ServeProcess(tmp_path / "gw", "--engine", engine.address)
    try:
        store = BillingStore(Database(db_url))
        victim = store.create_tenant(f"victim-{uuid.uuid4().hex[:8]}").id
        _raw_peer_submits(engine.address, victim, "stolen-row")
        foreign = 'fairserve_orphan_records_total{outcome="foreign"}'
        wait_for(lambda: _metric(gateway, foreign) >= 1, 60, "the raw peer's record refused")
        assert _rows(db_url, "stolen") == {}
        assert _metric(gateway, 'fairserve_orphan_records_total{outcome="billed"}') == 0
        assert any("intruder-peer" in line and "not billed" in line for line in gateway.output)
    finally:
        gateway.stop()
