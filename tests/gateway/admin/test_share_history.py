"""The dashboard's share history is the server's: sampled whether or not a page watches, bounded, read by a
page as it opens; and the chart says "no service" only where the server's samples show none. Real HTTP,
real engine, and Debian's Chromium through Playwright."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from gateway.admin.live import HISTORY_SAMPLES, ServiceHistory
from tests.gateway.conftest import Server, wait_for

pytestmark = pytest.mark.serial  # the page shows what the shared server has seen (as test_layout.py)


def _live(server: Server, client: httpx.Client) -> dict[str, Any]:
    answer = client.get("/admin/api/live", headers={"Authorization": f"Bearer {server.state.admin_token}"})
    assert answer.status_code == 200
    return dict(answer.json()["share"])


def test_the_history_is_sampled_with_no_page_open_and_a_new_page_shows_it(
    server: Server, client: httpx.Client, page: Any
) -> None:
    name = f"unwatched-{uuid.uuid4().hex[:6]}"
    server.add_tenant(name)
    tenant_id = server.tenants[name].id
    body = {"model": server.model, "prompt": "sampled unwatched", "max_tokens": 8, "ignore_eos": True}
    started = time.time()
    while time.time() < started + 4.0:  # no page is open, and no snapshot is asked for while this runs
        assert client.post("/v1/completions", json=body, headers=server.headers(name)).status_code == 200
    served_at = time.time()
    # The server sampled on its own, during the load: its history holds points charging this tenant taken
    # while it ran (a history sampled only by watchers would hold none from then).
    share = wait_for(
        lambda: (s := _live(server, client)) and s["sampled_until"] > served_at and s, 30, "a sample after"
    )
    during = [p for p in share["points"] if tenant_id in p["share"] and started < p["t"] <= served_at]
    assert len(during) >= 2, share["points"][-10:]
    assert 2 <= share["samples"] <= HISTORY_SAMPLES
    # A page opened now draws that history from its first snapshot, and does not say "no service".
    page.goto(f"{server.url}/admin")
    page.wait_for_selector("#dashboard", state="visible")
    page.wait_for_function("() => Number(document.getElementById('share-chart').dataset.updates) >= 1")
    drawn = page.evaluate("() => ({ ...document.getElementById('share-chart').dataset })")
    assert int(drawn["points"]) >= 1 and drawn["empty"] == "", drawn
    assert page.locator("#share-chart g[data-tenant='" + tenant_id + "']").count() == 1
    assert "no service" not in page.locator("#share-chart").inner_text()


# The page's own chart module, on a detached element: what it says with no point in view.
EMPTY_JS = """async (coverage) => {
  const { ShareChart } = await import('/admin/static/chart.js');
  const chart = new ShareChart(document.createElement('div'), document.createElement('div'));
  if (coverage) chart.cover(coverage);
  chart.reset([]);
  return chart.container.querySelector('text.empty').textContent;
}"""


def test_the_chart_says_no_service_only_over_samples(server: Server, page: Any) -> None:
    page.goto(f"{server.url}/admin")
    page.wait_for_selector("#dashboard", state="visible")
    now = time.time()
    covered = {"samples": 60, "sampled_since": now - 60, "sampled_until": now}
    assert page.evaluate(EMPTY_JS, covered).startswith("no service charged in this span")
    for unknown in (None, {"samples": 0, "sampled_since": None, "sampled_until": None}):
        assert page.evaluate(EMPTY_JS, unknown) == "no samples in this span yet"
    stale = {"samples": 60, "sampled_since": now - 3600, "sampled_until": now - 1800}  # none in a 5-min span
    assert page.evaluate(EMPTY_JS, stale) == "no samples in this span yet"


def test_the_history_is_bounded() -> None:
    history = ServiceHistory(capacity=5, min_interval_s=0.0)
    for i in range(50):
        history.observe(float(i), {"a": float(i)}, {"a": 1.0})
    assert len(history) == 5
    assert history.coverage() == {"samples": 5, "sampled_since": 45.0, "sampled_until": 49.0}
