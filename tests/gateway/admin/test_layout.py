"""What a person sees on /admin, in a real headless Chromium: tenants named in the chart, nothing overflowing.

The chart's legend and tooltips name tenants (a hover shows the id); every table and button stays inside its
card at every width. Tenant rows keep their columns (one line each) down to 800 px; below, each wraps as a
whole, every field in the same place row to row. Other tables wrap their rows below 1024 px.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.admin.conftest import Load
from tests.gateway.conftest import Server, wait_for

# The page shows everything the shared server has seen: run where only the serial part has used it
# (scripts/test.sh), as in a serial run, not after whatever the other files on its worker left there.
pytestmark = pytest.mark.serial

WIDE = (1367, 1024, 900, 800)  # a laptop down to the narrowest width at which tenant rows keep their columns
NARROW = 700  # below: tenant rows wrap as whole rows
SHOTS = Path(__file__).resolve().parents[3] / "artifacts"  # the repository's (ignored) artifacts/

# Every visible button and table that sticks out of its card's content box (by more than half a pixel), and whether the
# page scrolls sideways.
OVERFLOW_JS = """() => {
  const out = [];
  for (const card of document.querySelectorAll('#dashboard .card')) {
    const box = card.getBoundingClientRect();
    const pad = getComputedStyle(card);  // the content box: nothing may sit in the card's padding either
    const c = { left: box.left + parseFloat(pad.paddingLeft), right: box.right - parseFloat(pad.paddingRight),
      top: box.top + parseFloat(pad.paddingTop), bottom: box.bottom - parseFloat(pad.paddingBottom) };
    const title = card.querySelector('h2') ? card.querySelector('h2').textContent : '?';
    for (const node of card.querySelectorAll('button, table')) {
      if (!node.getClientRects().length) continue;
      const b = node.getBoundingClientRect();
      if (b.left < c.left - 0.5 || b.right > c.right + 0.5 || b.top < c.top - 0.5 || b.bottom > c.bottom + 0.5) {
        out.push(`${title}: ${node.tagName.toLowerCase()} '${node.textContent.trim().slice(0, 20)}' `
          + `[${b.left.toFixed(0)}, ${b.right.toFixed(0)}] outside [${c.left.toFixed(0)}, ${c.right.toFixed(0)}]`);
      }
    }
  }
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth) out.push(`page scrolls sideways: ${doc.scrollWidth} > ${window.innerWidth}`);
  return out;
}"""

# How many distinct lines the cells of each tenants row sit on (1 = the row reads as a table row).
ROW_LINES_JS = """() => [...document.querySelectorAll('#tenants tbody tr')].map((tr) =>
  new Set([...tr.cells].map((td) => Math.round(td.getBoundingClientRect().top))).size)"""

# Where each cell of each tenants row sits, relative to its row: [left, top] per cell.
CELL_PLACES_JS = """() => [...document.querySelectorAll('#tenants tbody tr')].map((tr) => {
  const r = tr.getBoundingClientRect();
  return [...tr.cells].map((td) => { const b = td.getBoundingClientRect();
    return [Math.round(b.left - r.left), Math.round(b.top - r.top)]; }); })"""

LEGEND_JS = """() => [...document.querySelectorAll('#share-legend .legend-item')].map((item) =>
  ({ text: item.textContent, title: item.title }))"""

SERIES_TITLES_JS = """() => Object.fromEntries([...document.querySelectorAll('#share-chart g[data-tenant]')]
  .map((g) => [g.dataset.tenant, g.querySelector('title').textContent]))"""

# The page's own module (same URL, same instance): how it names a fairness key for people.
DESCRIBE_JS = """async (keys) => {
  const { identities } = await import('/admin/static/util.js');
  return keys.map((k) => identities.describe(k));
}"""


def _shot(page: Any, width: int) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"admin-layout-{width}.png"), full_page=True)


def test_chart_names_tenants_and_every_table_fits_its_card(server: Server, page: Any) -> None:
    suffix = uuid.uuid4().hex[:6]
    names = [f"legend-{suffix}-a", f"legend-{suffix}-b"]
    for name in names:
        server.add_tenant(name)
    ids = {name: server.tenants[name].id for name in names}
    page.goto(f"{server.url}/admin")
    page.wait_for_selector("#dashboard", state="visible")
    page.wait_for_function("() => document.getElementById('conn').textContent === 'live'")
    # More streams than engine slots (8): both tenants backlogged, both charged service within the window.
    with Load(server, [server.keys[n] for n in names], per_tenant=5, max_tokens=32):
        page.wait_for_function(
            "(names) => { const d = JSON.parse(document.getElementById('share-chart').dataset.latest || '{}');"
            " return names.every((n) => (d[n] || 0) > 0)"
            " && Number(document.getElementById('share-chart').dataset.points) >= 3; }",
            arg=names,
            timeout=45_000,
        )
        legend = {item["title"]: item["text"] for item in page.evaluate(LEGEND_JS)}
        titles = page.evaluate(SERIES_TITLES_JS)
        # Fairness keys that are not tenants (the api_key and user domains) read by tenant name too.
        key = server.state.store.list_keys(names[0])[0]
        others = page.evaluate(DESCRIBE_JS, [f"{ids[names[0]]}/alice", key.id])
        # A saved row carries its longest message ("saved · scheduler updated") beside its buttons.
        row = f"#tenants tr[data-name='{names[1]}']"
        page.fill(f"{row} [name=weight]", "1.5")
        page.click(f"{row} button.save")
        page.wait_for_function(
            f"() => document.querySelector(\"{row} .row-msg\").textContent.includes('scheduler updated')"
        )
        lines: dict[int, list[int]] = {}
        overflow: dict[int, list[str]] = {}
        places: dict[int, list[list[list[int]]]] = {}
        for width in (*WIDE, NARROW):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_function(f"() => window.innerWidth === {width}")
            _shot(page, width)
            overflow[width] = page.evaluate(OVERFLOW_JS)
            lines[width] = page.evaluate(ROW_LINES_JS)
            places[width] = page.evaluate(CELL_PLACES_JS)

    # Legend and tooltips name the tenants; the hover (title) shows the id.
    for name, tenant_id in ids.items():
        assert legend[f"tenant id {tenant_id}"].startswith(f"{name}: "), legend
        assert titles[tenant_id].startswith(f"{name} (tenant id {tenant_id})"), titles
    assert others == [
        {"name": f"{names[0]} / alice", "id": f"user {ids[names[0]]}/alice"},
        {"name": f"{names[0]} · key {key.prefix}…", "id": f"API key id {key.id}"},
    ]
    # No series is labelled by a bare id prefix when the tenant has a name.
    assert not [t for t in legend.values() if re.match(r"[0-9a-f]{8}…", t)], legend

    # Every button and table inside its card, at every width; no sideways scrolling.
    assert overflow == {width: [] for width in (*WIDE, NARROW)}, overflow
    # Each tenant's row keeps its columns on one line down to 800 px, and wraps below, as a whole: every
    # cell in the same place in its row as in the next row (the rows hold the same fields).
    for width in WIDE:
        assert lines[width] and set(lines[width]) == {1}, (width, lines[width])
        columns = [[left for left, _ in row] for row in places[width]]
        assert len(columns) >= 2 and all(c == columns[0] for c in columns), (width, columns)
    assert lines[NARROW] and min(lines[NARROW]) > 1, lines[NARROW]
    assert len(places[NARROW]) >= 2 and all(p == places[NARROW][0] for p in places[NARROW]), places[NARROW]
    wait_for(lambda: server.state.engine.stats().running == 0, 60, "load to drain")
