"""The dashboard's public-prefix section in a real headless Chromium: register from the form, remove."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Server

# The page shows everything the shared server has seen: run where only the serial part has used it
# (scripts/test.sh), as in a serial run, not after whatever the other files on its worker left there.
pytestmark = pytest.mark.serial


def test_register_and_remove_a_prefix_from_the_dashboard(server: Server, browser: Any) -> None:
    token = server.state.admin_token
    name = f"web-prefix-{uuid.uuid4().hex[:6]}"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    admin = httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
    try:
        page.goto(f"{server.url}/admin")
        page.wait_for_selector("body[data-ready='true']")
        page.fill("#token", token)
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#dashboard", state="visible")
        page.wait_for_function(
            f"() => document.querySelector('#new-prefix [name=model]').value === '{server.model}'"
        )
        page.fill("#new-prefix [name=name]", name)
        page.fill("#new-prefix [name=text]", f"You are a careful assistant {uuid.uuid4().hex}. " * 3)
        page.click("#new-prefix button[type=submit]")
        row = f"#prefixes tr[data-name='{name}']"
        page.wait_for_selector(row)
        assert name in [p["name"] for p in admin.get("/admin/api/prefixes").json()["prefixes"]]
        page.click(f"{row} button.remove")
        page.wait_for_selector(row, state="detached")
        assert name not in [p["name"] for p in admin.get("/admin/api/prefixes").json()["prefixes"]]
        assert not errors, errors
    finally:
        admin.close()
        context.close()
