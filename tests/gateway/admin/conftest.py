"""Headless Chromium (Debian's, driven by Playwright) and tenant load for the dashboard tests."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from tests.gateway.conftest import Server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"headless Chromium is required under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright; fails under CI=true when it cannot start, else skips."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        _unavailable(f"playwright is not installed: {exc}")
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        _unavailable(f"{CHROMIUM} is missing (scripts/ensure_chromium.sh installs it)")
    with sync_playwright() as pw:
        try:
            chromium = pw.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=30_000
            )
        except Error as exc:
            _unavailable(f"Chromium did not start: {exc}")
        yield chromium
        chromium.close()


class Load:
    """Streaming completions from several tenants at once, in threads, until stopped."""

    def __init__(self, server: Server, secrets: list[str], per_tenant: int = 3, max_tokens: int = 40) -> None:
        self.server = server
        self.secrets = secrets
        self.per_tenant = per_tenant
        self.max_tokens = max_tokens
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(s,), daemon=True)
            for s in secrets
            for _ in range(per_tenant)
        ]

    def _loop(self, secret: str) -> None:
        body = {
            "model": self.server.model,
            "prompt": "share the accelerator fairly",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
        }
        with httpx.Client(base_url=self.server.url, timeout=120) as c:
            while not self.stop.is_set():
                resp = c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {secret}"})
                self.statuses.append(resp.status_code)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


@pytest.fixture
def page(server: Server, browser: Any) -> Iterator[Any]:
    """A dashboard tab holding the admin token (as after a login), at the widest width tested."""
    context = browser.new_context(viewport={"width": 1367, "height": 900})
    token = json.dumps(server.state.admin_token)
    context.add_init_script(f"sessionStorage.setItem('fairserve.admin_token', {token})")
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
        assert not errors, errors
    finally:
        context.close()
