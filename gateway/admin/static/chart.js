// The fairness picture: each tenant's share of charged service (solid) next to its weight share (dashed),
// drawn as inline SVG. A share under the weight share is unfair only while the tenant had work queued: each
// series says how much of the window it did ("backlogged"), and one under the server's threshold is marked
// "demand-limited" (its line dotted). Weight changes are vertical marks. Every series drawn is in the legend.
// The container's data-* attributes expose what is drawn, for tests and scripts.

import { PALETTE, clock, el, identities, pct } from "./util.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 1100;
const H = 280;
const M = { left: 44, right: 12, top: 10, bottom: 24 };
const GAP_S = 5; // points further apart than this are not joined (nothing charged, or no sample, between)
const MAX_POINTS = 2000;

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

export class ShareChart {
  constructor(container, legend) {
    this.container = container;
    this.legend = legend;
    this.points = [];
    this.colors = {};
    this.span = 300;
    this.updates = 0;
    this.coverage = null; // the server's samples: { samples, sampled_since, sampled_until }
    this.limitedBelow = 0.5; // the server's demand-limited threshold (share.demand_limited_below)
  }

  // A key's share of the window with work queued, as of the newest point that has one; undefined if none.
  backlog(view, key) {
    const p = [...view].reverse().find((q) => q.backlogged && q.backlogged[key] !== undefined);
    return p ? p.backlogged[key] : undefined;
  }

  limited(view, key) {
    const b = this.backlog(view, key);
    return b !== undefined && b < this.limitedBelow;
  }

  // What the server's history holds (each snapshot says): the chart says "no service" only over samples.
  cover(share) {
    this.coverage = { samples: share.samples, since: share.sampled_since, until: share.sampled_until };
    if (share.demand_limited_below !== undefined) this.limitedBelow = share.demand_limited_below;
  }

  // Why nothing is drawn: the samples covering [start, end] show no service, or there are none (yet).
  emptyText(start) {
    const c = this.coverage;
    if (c && c.samples >= 2 && c.until !== null && c.until >= start) {
      return "no service charged in this span — send some requests";
    }
    return "no samples in this span yet";
  }

  setSpan(seconds) {
    this.span = seconds;
    this.render();
  }

  reset(points) {
    this.points = points.slice(-MAX_POINTS);
    this.updates += 1;
    this.render();
  }

  push(point) {
    const last = this.points[this.points.length - 1];
    if (last && point.t <= last.t) return;
    this.points.push(point);
    if (this.points.length > MAX_POINTS) this.points.shift();
    this.updates += 1;
    this.render();
  }

  color(key) {
    if (!(key in this.colors)) this.colors[key] = PALETTE[Object.keys(this.colors).length % PALETTE.length];
    return this.colors[key];
  }

  label(key) {
    return identities.describe(key).name;
  }

  // The tooltip of a series: who it is (name, then the id), and where it stands in the newest point.
  tooltip(key, latest) {
    const who = identities.describe(key);
    const now = latest && latest.share[key] !== undefined
      ? `: ${pct(latest.share[key])} of service · weight share ${pct(latest.weight_share[key])}` : "";
    return `${who.name} (${who.id})${now}`;
  }

  render() {
    const end = this.points.length ? Math.max(this.points[this.points.length - 1].t, Date.now() / 1000) : Date.now() / 1000;
    const start = end - this.span;
    const view = this.points.filter((p) => p.t >= start);
    const x = (t) => M.left + ((t - start) / this.span) * (W - M.left - M.right);
    const y = (v) => M.top + (1 - v) * (H - M.top - M.bottom);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "share of service vs weight share" });
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      root.append(svg("line", { x1: M.left, x2: W - M.right, y1: y(v), y2: y(v), class: "gridline" }));
      const t = svg("text", { x: M.left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" });
      t.textContent = `${v * 100}%`;
      root.append(t);
    }
    for (let i = 0; i <= 4; i += 1) {
      const t = svg("text", { x: x(start + (i * this.span) / 4), y: H - 6, "text-anchor": "middle", class: "axis" });
      t.textContent = i === 4 ? "now" : `-${Math.round(((4 - i) * this.span) / 4)}s`;
      root.append(t);
    }
    const keys = [];
    for (const p of view) for (const k of Object.keys(p.share)) if (!keys.includes(k)) keys.push(k);
    const latest = view[view.length - 1];
    for (const key of keys) {
      const color = this.color(key);
      const limited = this.limited(view, key);
      const series = svg("g", { "data-tenant": key, "data-demand-limited": String(limited) });
      series.append(svg("title"));
      series.firstChild.textContent = this.tooltip(key, latest);
      for (const [field, cls] of [["weight_share", "weight-line"], ["share", "share-line"]]) {
        let d = "";
        let prev = null;
        for (const p of view) {
          const v = p[field][key];
          if (v === undefined) { prev = null; continue; }
          d += `${prev === null || p.t - prev > GAP_S ? "M" : "L"}${x(p.t).toFixed(1)},${y(v).toFixed(1)}`;
          prev = p.t;
        }
        if (d) series.append(svg("path", { d, stroke: color, class: limited && field === "share" ? `${cls} limited` : cls }));
      }
      // Mark the newest share so a series that has only just started is visible too.
      const last = [...view].reverse().find((p) => p.share[key] !== undefined);
      if (last) series.append(svg("circle", { cx: x(last.t), cy: y(last.share[key]), r: 4, fill: color }));
      if (last && limited) {
        const note = svg("text", { x: Math.min(x(last.t), W - M.right) - 8, y: y(last.share[key]) - 8, "text-anchor": "end", class: "limited-note", fill: color });
        note.textContent = `${this.label(key)}: demand-limited`;
        series.append(note);
      }
      root.append(series);
    }
    let changes = 0;
    for (const p of view) {
      for (const [key, [before, after]] of Object.entries(p.weight_changes || {})) {
        const mark = svg("g", { "data-weight-change": key, class: "weight-change" });
        mark.append(svg("line", { x1: x(p.t), x2: x(p.t), y1: M.top, y2: H - M.bottom, stroke: this.color(key) }));
        const right = x(p.t) > W * 0.6; // a mark near "now" labels to its left, so the label stays in view
        const t = svg("text", { x: x(p.t) + (right ? -4 : 4), y: M.top + 12 + 14 * (changes % 3), "text-anchor": right ? "end" : "start", class: "axis" });
        t.textContent = `${this.label(key)} weight ${before} → ${after}`;
        const hover = svg("title");
        hover.textContent = `${this.label(key)}: weight ${before} → ${after} at ${clock(p.t)}`;
        mark.append(hover, t);
        root.append(mark);
        changes += 1;
      }
    }
    if (!view.length) {
      const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" });
      t.textContent = this.emptyText(start);
      root.append(t);
    }
    this.container.replaceChildren(root);
    this.container.dataset.weightChanges = String(changes);
    this.describe(view, keys);
  }

  // One legend entry per series drawn (not only those served in the newest window): share, weight share,
  // and how much of the window it had work queued, "demand-limited" below the threshold.
  legendText(view, key) {
    const p = [...view].reverse().find((q) => q.share[key] !== undefined);
    const b = this.backlog(view, key);
    const parts = [p ? `${pct(p.share[key])} of service · weight share ${pct(p.weight_share[key])}` : "no service in the last window"];
    if (b !== undefined) parts.push(`backlogged ${pct(b)} of the time`);
    if (this.limited(view, key)) parts.push("demand-limited");
    return `${this.label(key)}: ${parts.join(" · ")}`;
  }

  describe(view, keys) {
    const latest = view[view.length - 1];
    const shares = {};
    const weights = {};
    if (latest) {
      for (const [k, v] of Object.entries(latest.share)) shares[this.label(k)] = Number(v.toFixed(4));
      for (const [k, v] of Object.entries(latest.weight_share)) weights[this.label(k)] = Number(v.toFixed(4));
    }
    const ds = this.container.dataset;
    ds.points = String(view.length);
    ds.series = String(keys.length);
    ds.updates = String(this.updates);
    ds.latest = JSON.stringify(shares);
    ds.latestWeight = JSON.stringify(weights);
    ds.latestT = latest ? String(latest.t) : "";
    ds.backlogged = JSON.stringify(Object.fromEntries(keys.filter((k) => this.backlog(view, k) !== undefined)
      .map((k) => [this.label(k), Number(this.backlog(view, k).toFixed(4))])));
    ds.demandLimited = JSON.stringify(keys.filter((k) => this.limited(view, k)).map((k) => this.label(k)));
    ds.empty = view.length ? "" : this.emptyText(Date.now() / 1000 - this.span);
    const items = keys.length
      ? keys.map((k) => el("span", { class: this.limited(view, k) ? "legend-item demand-limited" : "legend-item", title: identities.describe(k).id, dataset: { key: k } },
        el("span", { class: "swatch", dataset: { color: this.color(k) } }), this.legendText(view, k)))
      : [el("span", { class: "muted" }, "idle")];
    if (latest) items.push(el("span", { class: "muted" }, `as of ${clock(latest.t)}`));
    this.legend.replaceChildren(...items);
    // CSP forbids inline style attributes; colouring through the CSSOM is allowed.
    for (const sw of this.legend.querySelectorAll(".swatch")) sw.style.background = sw.dataset.color;
  }
}
