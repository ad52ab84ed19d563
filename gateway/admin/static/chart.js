// The fairness picture: each tenant's share of charged service (solid) next to its weight share (dashed),
// drawn as inline SVG. The container's data-* attributes expose what is drawn, for tests and scripts.

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
  }

  // What the server's history holds (each snapshot says): the chart says "no service" only over samples.
  cover(share) {
    this.coverage = { samples: share.samples, since: share.sampled_since, until: share.sampled_until };
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
      const series = svg("g", { "data-tenant": key });
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
        if (d) series.append(svg("path", { d, stroke: color, class: cls }));
      }
      // Mark the newest share so a series that has only just started is visible too.
      const last = [...view].reverse().find((p) => p.share[key] !== undefined);
      if (last) series.append(svg("circle", { cx: x(last.t), cy: y(last.share[key]), r: 4, fill: color }));
      root.append(series);
    }
    if (!view.length) {
      const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" });
      t.textContent = this.emptyText(start);
      root.append(t);
    }
    this.container.replaceChildren(root);
    this.describe(view, keys);
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
    ds.empty = view.length ? "" : this.emptyText(Date.now() / 1000 - this.span);
    const items = latest
      ? Object.keys(latest.share).map((k) => el("span", { class: "legend-item", title: identities.describe(k).id },
        el("span", { class: "swatch", dataset: { color: this.color(k) } }),
        `${this.label(k)}: ${pct(latest.share[k])} of service · weight share ${pct(latest.weight_share[k])}`))
      : [el("span", { class: "muted" }, "idle")];
    if (latest) items.push(el("span", { class: "muted" }, `as of ${clock(latest.t)}`));
    this.legend.replaceChildren(...items);
    // CSP forbids inline style attributes; colouring through the CSSOM is allowed.
    for (const sw of this.legend.querySelectorAll(".swatch")) sw.style.background = sw.dataset.color;
  }
}
