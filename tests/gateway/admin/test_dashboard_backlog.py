"""The dashboard says what it shows, in a real headless Chromium: whether each tenant had work queued in the
window (a share under the weight share is unfair only then), "demand-limited" below the threshold, weight
changes marked on the chart, every tenant drawn named in the legend, and the gauges on one line at 1367 and
800 px even with their longest values. Screenshots go to artifacts/ (dashboard-backlog-<width>.png)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.admin.conftest import Load
from tests.gateway.conftest import Server, wait_for

pytestmark = pytest.mark.serial  # the chart shows what the shared server serves: nobody else's load

SHOTS = Path(__file__).resolve().parents[3] / "artifacts"

LEGEND_JS = """() => Object.fromEntries([...document.querySelectorAll('#share-legend .legend-item')]
  .map((item) => [item.dataset.key, item.textContent]))"""
SERIES_JS = (
    """() => [...document.querySelectorAll('#share-chart g[data-tenant]')].map((g) => g.dataset.tenant)"""
)
ROW_JS = """(id) => { const tr = document.querySelector(`#tenants tr[data-id="${id}"]`);
  const b = tr.querySelector('.c-backlog'); return { backlog: b.textContent, title: b.title, limited: tr.dataset.demandLimited }; }"""
MARKS_JS = """() => [...document.querySelectorAll('#share-chart g[data-weight-change]')]
  .map((g) => ({ key: g.dataset.weightChange, text: g.querySelector('text').textContent }))"""
# The longest value each gauge shows in practice, then every gauge value that wraps or is clipped.
GAUGES_JS = """() => {
  const longest = { 'g-waiting': '12,345', 'g-running': '256', 'g-batch': '256 / 256', 'g-kv': '65536 / 65536',
    'g-preempt': '123,456', 'g-iter': '1,234.5 ms', 'g-decode': '123,456', 'g-live': '12,345' };
  for (const [id, text] of Object.entries(longest)) document.getElementById(id).textContent = text;
  const bad = [];
  for (const gauge of document.querySelectorAll('.gauges .gauge')) {
    const value = gauge.querySelector('.value');
    const b = value.getBoundingClientRect(), g = gauge.getBoundingClientRect();
    const line = parseFloat(getComputedStyle(value).fontSize) * 1.6;
    if (value.scrollWidth > value.clientWidth + 0.5 || b.height > line || b.right > g.right + 0.5) {
      bad.push(`${value.id}: '${value.textContent}' ${value.scrollWidth}px in ${value.clientWidth}px, ${b.height}px high`);
    }
  }
  return bad;
}"""


def test_backlog_demand_limit_weight_marks_legend_and_gauges(server: Server, page: Any) -> None:
    suffix = uuid.uuid4().hex[:6]
    flood, light = f"flood-{suffix}", f"light-{suffix}"
    server.add_tenant(flood, weight=1.0)
    server.add_tenant(light, weight=3.0)
    ids = {name: server.tenants[name].id for name in (flood, light)}
    page.goto(f"{server.url}/admin")
    page.wait_for_selector("#dashboard", state="visible")
    page.wait_for_function("() => document.getElementById('conn').textContent === 'live'")
    admin = {"Authorization": f"Bearer {server.state.admin_token}"}
    # 12 streams of the flood tenant for 8 seats keep it queued; the light tenant's one stream finds a seat
    # within a few iterations: it is served under its weight share because it asks for less.
    with (
        Load(server, [server.keys[flood]], per_tenant=12, max_tokens=32),
        Load(server, [server.keys[light]], per_tenant=1, max_tokens=32),
    ):
        page.wait_for_function(
            "([flood, light]) => { const d = JSON.parse(document.getElementById('share-chart').dataset.backlogged"
            " || '{}'); return d[flood] > 0.6 && d[light] !== undefined && d[light] < 0.5; }",
            arg=[flood, light],
            timeout=90_000,
        )
        resp = httpx.patch(
            f"{server.url}/admin/api/tenants/{ids[light]}", json={"weight": 5}, headers=admin, timeout=30
        )
        assert resp.status_code == 200
        page.wait_for_function(
            '(id) => document.querySelector(`#share-chart g[data-weight-change="${id}"]`) !== null',
            arg=ids[light],
            timeout=30_000,
        )
        legend = page.evaluate(LEGEND_JS)
        drawn = page.evaluate(SERIES_JS)
        rows = {name: page.evaluate(ROW_JS, ids[name]) for name in (flood, light)}
        marks = page.evaluate(MARKS_JS)
        limited = json.loads(page.eval_on_selector("#share-chart", "c => c.dataset.demandLimited"))
        gauges: dict[int, list[str]] = {}
        for width in (1367, 800):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_function(f"() => window.innerWidth === {width}")
            gauges[width] = page.evaluate(GAUGES_JS)
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / f"dashboard-backlog-{width}.png"), full_page=True)

    # Every series drawn is in the legend, by name, with how much of the window it had work queued.
    assert set(drawn) <= set(legend), (drawn, legend)
    assert legend[ids[flood]].startswith(f"{flood}: ") and "backlogged" in legend[ids[flood]]
    assert "demand-limited" not in legend[ids[flood]]
    assert legend[ids[light]].startswith(f"{light}: ") and legend[ids[light]].endswith("demand-limited")
    assert light in limited and flood not in limited
    # The tenants table says the same, row by row.
    assert rows[flood]["backlog"].startswith("backlog ") and rows[flood]["limited"] == "false", rows
    assert rows[flood]["title"].endswith("backlogged, its share is the scheduler's"), rows
    assert rows[light]["backlog"].startswith("backlog ") and rows[light]["limited"] == "true", rows
    assert "demand-limited" in rows[light]["title"], rows
    # The weight change is a mark on the chart, naming the tenant and both weights.
    assert {"key": ids[light], "text": f"{light} weight 3 → 5"} in marks, marks
    # Every gauge value on one line inside its gauge, at both widths.
    assert gauges == {1367: [], 800: []}, gauges
    wait_for(lambda: server.state.engine.stats().running == 0, 60, "load to drain")
