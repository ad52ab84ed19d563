"""The dashboard's LoRA adapter section in a real headless Chromium: register a tenant's private adapter
and a public one from the form, see each row's owner, remove both; a long path stays inside its card."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from tests.gateway.admin.test_layout import OVERFLOW_JS
from tests.gateway.conftest import Server

# The page shows everything the shared server has seen: run where only the serial part has used it
# (scripts/test.sh), as in a serial run, not after whatever the other files on its worker left there.
pytestmark = pytest.mark.serial


def _adapter_dir(root: Path) -> Path:
    """A directory the admin API accepts: a PEFT config and finite rank-4 q_proj tensors (registration
    checks both, engine/worker/lora/adapter.py `check_directory`; no request runs, so no model's shapes)."""
    path = root / ("a-rather-long-directory-name-" * 4) / "adapter"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {f"{prefix}.lora_A.weight": torch.zeros(4, 8), f"{prefix}.lora_B.weight": torch.zeros(8, 4)}
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return path


def _register(page: Any, name: str, path: Path, owner: str) -> str:
    """Fill and submit the form; the selector of the row that appears."""
    page.fill("#new-adapter [name=name]", name)
    page.fill("#new-adapter [name=path]", str(path))
    page.select_option("#new-adapter [name=tenant]", owner)
    page.click("#new-adapter button[type=submit]")
    row = f"#adapters tr[data-name='{name}']"
    page.wait_for_selector(row)
    return row


def test_register_and_remove_adapters_from_the_dashboard(
    server: Server, browser: Any, tmp_path: Path
) -> None:
    token = server.state.admin_token
    path = _adapter_dir(tmp_path)
    context = browser.new_context(viewport={"width": 1367, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    admin = httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
    tenant_name = f"lora-owner-{uuid.uuid4().hex[:6]}"
    tenant = admin.post("/admin/api/tenants", json={"name": tenant_name}).json()["id"]
    private, public = f"web-private-{uuid.uuid4().hex[:6]}", f"web-public-{uuid.uuid4().hex[:6]}"
    try:
        page.goto(f"{server.url}/admin")
        page.wait_for_selector("body[data-ready='true']")
        page.fill("#token", token)
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#dashboard", state="visible")
        page.wait_for_selector(f"#new-adapter [name=tenant] option[value='{tenant}']", state="attached")
        private_row = _register(page, private, path, tenant)
        public_row = _register(page, public, path, "")
        assert page.inner_text(f"{private_row} td.owner") == tenant_name
        assert page.inner_text(f"{public_row} td.owner") == "public"
        stored = {a["name"]: a for a in admin.get("/admin/api/adapters").json()["adapters"]}
        assert stored[private]["tenant_id"] == tenant and stored[public]["public"]
        for width in (1367, 700):
            page.set_viewport_size({"width": width, "height": 1000})
            assert [o for o in page.evaluate(OVERFLOW_JS) if o.startswith("LoRA")] == [], width
        page.click(f"{private_row} button.remove")
        page.wait_for_selector(private_row, state="detached")
        page.click(f"{public_row} button.remove")
        page.wait_for_selector(public_row, state="detached")
        names = [a["name"] for a in admin.get("/admin/api/adapters").json()["adapters"]]
        assert private not in names and public not in names
        assert not errors, errors
    finally:
        admin.close()
        context.close()
