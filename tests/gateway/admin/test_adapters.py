"""LoRA adapters registered at run time through the admin API, over real HTTP with the official client:
a private adapter serves its tenant only (another tenant gets the very 404 of an unknown model and does
not see it in /v1/models), a public one serves everyone, removing one makes it unknown, bad bodies are
4xx naming the field, and the directory is in SQL."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from safetensors.torch import load_file, save_file
from sqlalchemy import text

from billing import Database
from engine import LLM, SamplingParams
from gateway.adapters import AdapterRegistry
from tests.engine.worker.lora.adapters import Adapted, build
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess

PROMPT = [5, 17, 99, 3, 200, 42, 7, 8]
ASK: dict[str, Any] = {
    "prompt": PROMPT,
    "max_tokens": 6,
    "temperature": 0,
    "extra_body": {"ignore_eos": True},
}


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    specs = {"tuned": (4, ["q_proj", "v_proj", "up_proj"], False), "other": (8, ["k_proj", "o_proj"], False)}
    return build(tmp_path_factory.mktemp("llama"), "llama", specs)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def serve(adapted: Adapted, data_dir: Path) -> Iterator[ServeProcess]:
    args = ["--model", str(adapted.base), "--lora", f"tuned={adapted.adapters['tuned']}"]
    process = ServeProcess(data_dir, *args, "--num-kv-blocks", "128", "--max-lora-rank", "8")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def admin(serve: ServeProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {serve.banner['admin_token']}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as client:
        yield client


def _tenant(admin: httpx.Client, serve: ServeProcess) -> tuple[str, openai.OpenAI]:
    """A new tenant's id, and the official client with one of its keys."""
    created = admin.post("/admin/api/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
    assert created.status_code == 201, created.text
    tenant = created.json()["id"]
    key = admin.post(f"/admin/api/tenants/{tenant}/keys", json={})
    assert key.status_code == 201, key.text
    return tenant, openai.OpenAI(base_url=serve.url + "/v1", api_key=key.json()["secret"], max_retries=0)


def _not_found(oa: openai.OpenAI, model: str) -> Any:
    """The 404 body `model` gets (the official client's parsed error body)."""
    with pytest.raises(openai.NotFoundError) as info:
        oa.completions.create(model=model, **ASK)
    assert info.value.code == "model_not_found"
    return info.value.body


def _listed(oa: openai.OpenAI) -> list[str]:
    return [m.id for m in oa.models.list()]


def _merged_text(adapted: Adapted, name: str) -> str:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return LLM(str(adapted.merged[name]), dtype="float32").generate(PROMPT, params)[0].text


def test_a_private_adapter_serves_its_tenant_only(
    serve: ServeProcess, admin: httpx.Client, adapted: Adapted
) -> None:
    alice, alice_oa = _tenant(admin, serve)
    _, bob_oa = _tenant(admin, serve)
    name = f"alice-{uuid.uuid4().hex[:6]}"
    unknown = _not_found(bob_oa, name)  # before it exists
    created = admin.post(
        "/admin/api/adapters", json={"name": name, "path": str(adapted.adapters["other"]), "tenant": alice}
    )
    assert created.status_code == 201, created.text
    assert created.json()["tenant_id"] == alice and not created.json()["public"]
    assert name in _listed(alice_oa) and name not in _listed(bob_oa)
    answer = alice_oa.completions.create(model=name, **ASK)
    assert answer.model == name
    assert answer.choices[0].text == _merged_text(adapted, "other")
    assert _not_found(bob_oa, name) == unknown  # byte for byte what a name nobody registered gets
    assert admin.delete(f"/admin/api/adapters/{name}").status_code == 200
    assert name not in _listed(alice_oa)
    assert _not_found(alice_oa, name) == unknown
    assert admin.delete(f"/admin/api/adapters/{name}").status_code == 404


def test_a_public_adapter_serves_every_tenant(
    serve: ServeProcess, admin: httpx.Client, adapted: Adapted, data_dir: Path
) -> None:
    _, alice_oa = _tenant(admin, serve)
    _, bob_oa = _tenant(admin, serve)
    name = f"shared-{uuid.uuid4().hex[:6]}"
    created = admin.post("/admin/api/adapters", json={"name": name, "path": str(adapted.adapters["other"])})
    assert created.status_code == 201, created.text
    assert created.json()["public"]
    for oa in (alice_oa, bob_oa):
        assert _listed(oa)[:2] == ["base", "tuned"] and name in _listed(oa)
        assert oa.completions.create(model=name, **ASK).choices[0].text == _merged_text(adapted, "other")
    listed = {a["name"]: a for a in admin.get("/admin/api/adapters").json()["adapters"]}
    assert listed["tuned"]["source"] == "config" and listed[name]["source"] == "admin"
    # The directory is in SQL: a fresh registry on the same database (a restart, another gateway) has it.
    db = Database(f"sqlite:///{data_dir / 'fairserve.db'}")
    try:
        assert name in [a.name for a in AdapterRegistry(db, {}).reload()]
    finally:
        db.dispose()
    assert admin.delete(f"/admin/api/adapters/{name}").status_code == 200
    _not_found(bob_oa, name)


def test_bad_bodies_name_the_field(
    serve: ServeProcess, admin: httpx.Client, adapted: Adapted, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    too_big = tmp_path / "rank-16"
    too_big.mkdir()
    (too_big / "adapter_config.json").write_text(json.dumps({"r": 16, "target_modules": ["q_proj"]}))
    good = str(adapted.adapters["other"])
    for body, status, field in (
        ({"name": "x", "path": good, "colour": 1}, 400, "colour"),
        ({"path": good}, 400, "name"),
        ({"name": "a/b", "path": good}, 400, "name"),
        ({"name": "base", "path": good}, 409, "name"),  # a served model's name
        ({"name": "tuned", "path": good}, 409, "name"),  # a `--lora` adapter's
        ({"name": "x"}, 400, "path"),
        ({"name": "x", "path": "relative/dir"}, 400, "path"),
        ({"name": "x", "path": str(tmp_path / "missing")}, 400, "path"),
        ({"name": "x", "path": str(empty)}, 400, "path"),
        ({"name": "x", "path": str(too_big)}, 400, "path"),  # rank 16 > --max-lora-rank 8
        ({"name": "x", "path": good, "tenant": "no-such-tenant"}, 400, "tenant"),
        ({"name": "x", "path": good, "tenant": 7}, 400, "tenant"),
    ):
        resp = admin.post("/admin/api/adapters", json=body)
        assert resp.status_code == status and resp.json()["error"]["param"] == field, (body, resp.text)
    name = f"dup-{uuid.uuid4().hex[:6]}"
    assert admin.post("/admin/api/adapters", json={"name": name, "path": good}).status_code == 201
    duplicate = admin.post("/admin/api/adapters", json={"name": name, "path": good})
    assert duplicate.status_code == 409 and duplicate.json()["error"]["param"] == "name"
    assert admin.delete(f"/admin/api/adapters/{name}").status_code == 200
    assert admin.delete("/admin/api/adapters/tuned").status_code == 409  # the config owns it


def test_tenants_cannot_touch_the_directory(serve: ServeProcess, admin: httpx.Client) -> None:
    _, oa = _tenant(admin, serve)
    tenant_key = {"Authorization": f"Bearer {oa.api_key}"}
    with httpx.Client(base_url=serve.url, timeout=30) as c:
        assert c.get("/admin/api/adapters", headers=tenant_key).status_code == 403
        assert c.post("/admin/api/adapters", json={}, headers=tenant_key).status_code == 403


def _hot_adapter(adapted: Adapted, root: Path) -> Path:
    """A copy of `other` whose weights are finite (registration takes it) but overflow in the forward."""
    hot = root / "hot"
    shutil.copytree(adapted.adapters["other"], hot)
    tensors = load_file(str(hot / "adapter_model.safetensors"))
    save_file({k: v * 1e30 for k, v in tensors.items()}, str(hot / "adapter_model.safetensors"))
    return hot


def test_a_faulting_adapter_fails_its_tenant_alone_and_is_billed(
    serve: ServeProcess, admin: httpx.Client, adapted: Adapted, data_dir: Path, tmp_path: Path
) -> None:
    """Issue 54: B's private adapter faults in the forward on each of B's requests while C streams. Every
    one of C's streams completes; B's first request is a 400 naming `model`, in the ledger (status `error`)
    billed for the prefill it was served; its later ones are refused at once (400 naming `model`) before any
    work, so, as every refusal before work, they bill nothing."""
    bob, bob_oa = _tenant(admin, serve)
    carol, carol_oa = _tenant(admin, serve)
    name = f"hot-{uuid.uuid4().hex[:6]}"
    alpha = tmp_path / "alpha"  # `lora_alpha: 1e308` (the engine-stopping adapter) is refused at registration
    shutil.copytree(adapted.adapters["other"], alpha)
    config = json.loads((alpha / "adapter_config.json").read_text())
    (alpha / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 1e308}))
    refused = admin.post("/admin/api/adapters", json={"name": name, "path": str(alpha), "tenant": bob})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "path", refused.text
    hot = str(_hot_adapter(adapted, tmp_path))
    created = admin.post("/admin/api/adapters", json={"name": name, "path": hot, "tenant": bob})
    assert created.status_code == 201, created.text

    streamed: dict[int, tuple[int, str | None]] = {}

    def carol_streams(i: int) -> None:
        stream = carol_oa.completions.create(
            model="base",
            prompt=PROMPT,
            max_tokens=60,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
        streamed[i] = (
            len([c for c in chunks if c.choices and c.choices[0].text]),
            chunks[-1].choices[0].finish_reason,
        )

    threads = [threading.Thread(target=carol_streams, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    bob_ids = [f"bob-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    for request_id in bob_ids:
        with pytest.raises(openai.BadRequestError) as info:
            bob_oa.completions.create(model=name, **ASK, extra_headers={"X-Request-Id": request_id})
        assert info.value.code == "invalid_value" and info.value.param == "model", info.value
        assert name in str(info.value.message)
    for t in threads:
        t.join(timeout=120)
    assert sorted(streamed) == list(range(6))
    assert all(reason == "length" for _, reason in streamed.values()), streamed
    # B's first request ran: it is in the ledger with its service; the others were refused before any work.
    db = Database(f"sqlite:///{data_dir / 'fairserve.db'}")

    def rows() -> dict[str, tuple[str, float]]:
        with db.engine.connect() as conn:  # a connection per read: each sees the ledger's latest commit
            found = conn.execute(
                text("SELECT request_id, status, charged_service FROM usage WHERE tenant_id = :t"), {"t": bob}
            ).all()
        return {r[0]: (r[1], float(r[2])) for r in found}

    try:

        def complete() -> dict[str, tuple[str, float]] | None:
            now = rows()
            return now if bob_ids[0] in now else None

        billed = wait_for(complete, 30, "B's ledger rows")
        assert billed[bob_ids[0]][0] == "error" and billed[bob_ids[0]][1] > 0, billed
        assert not set(bob_ids[1:]) & set(billed), billed  # refused before any work: nothing to bill
    except AssertionError:
        raise AssertionError(f"B's rows: {rows()}") from None
    finally:
        db.dispose()
    # Registered again, it is read again (and faults again, alone): streamed, the fault came before any
    # event, so it is still the status (the headers wait for the first event).
    assert admin.delete(f"/admin/api/adapters/{name}").status_code == 200
    assert (
        admin.post("/admin/api/adapters", json={"name": name, "path": hot, "tenant": bob}).status_code == 201
    )
    with pytest.raises(openai.BadRequestError) as again:
        list(bob_oa.completions.create(model=name, stream=True, **ASK))
    assert again.value.param == "model" and "not finite" in again.value.message, again.value
    assert carol_oa.completions.create(model="base", **ASK).choices[0].finish_reason == "length"
