// The live view: one snapshot with history, then an SSE stream read through fetch() so the admin token
// travels as a header (EventSource cannot send headers, and a token in a query string ends up in logs).

import { ShareChart } from "./chart.js";
import { api, authHeaders, clock, el, fillBody, identities, num, session } from "./util.js";

const $ = (id) => document.getElementById(id);

function feasibilityText(f) {
  if (!f) return "";
  return `${Math.round(f.prefill_tokens_per_s)} prompt tokens/s, ${(1000 * f.iteration_s).toFixed(1)} ms per iteration (${f.source})`;
}

export class LiveView {
  constructor(onAuthLost) {
    this.chart = new ShareChart($("share-chart"), $("share-legend"));
    this.onAuthLost = onAuthLost;
    this.controller = null;
    this.tenantStats = [];
    $("chart-span").addEventListener("change", (e) => this.chart.setSpan(Number(e.target.value)));
  }

  async start() {
    this.stop();
    this.controller = new AbortController();
    const snap = await api("GET", "/live");
    this.apply(snap);
    this.chart.cover(snap.share);
    this.chart.reset(snap.share.points);
    this.loop(this.controller.signal);
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    this.setConn(false);
  }

  setConn(on) {
    const pill = $("conn");
    pill.textContent = on ? "live" : "offline";
    pill.className = `pill ${on ? "on" : "off"}`;
  }

  async loop(signal) {
    let backoff = 1000;
    while (!signal.aborted && session.token) {
      try {
        const resp = await fetch("/admin/api/live/stream", { headers: authHeaders(), signal, cache: "no-store" });
        if (resp.status === 401 || resp.status === 403) { this.onAuthLost(); return; }
        if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
        this.setConn(true);
        backoff = 1000;
        await this.read(resp.body, signal);
      } catch (err) {
        if (signal.aborted) return;
      }
      this.setConn(false);
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  async read(body, signal) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        const snap = JSON.parse(data);
        this.apply(snap);
        this.chart.cover(snap.share);
        for (const p of snap.share.points) this.chart.push(p);
        if (!snap.share.points.length) this.chart.render();
      }
    }
  }

  apply(snap) {
    identities.learnTenants(snap.tenants);
    $("model").textContent = `${snap.model}${snap.alive ? "" : " — engine down"}${snap.draining ? " — draining" : ""}`;
    const e = snap.engine;
    $("g-waiting").textContent = num(e.waiting);
    $("g-running").textContent = num(e.running);
    $("g-batch").textContent = `${e.batch_size} / ${e.max_num_seqs}`;
    $("g-batch-bar").style.width = `${(100 * e.batch_size) / Math.max(e.max_num_seqs, 1)}%`;
    $("g-kv").textContent = `${e.kv_blocks_used} / ${e.kv_blocks_total}`;
    $("g-kv-bar").style.width = `${(100 * e.kv_blocks_used) / Math.max(e.kv_blocks_total, 1)}%`;
    $("g-preempt").textContent = num(e.preemptions_total);
    $("g-iter").textContent = `${num(e.iteration_seconds * 1000, 1)} ms`;
    $("g-decode").textContent = num(e.decode_tokens_per_s);
    $("g-live").textContent = num(snap.live_requests);
    this.tenantStats = snap.tenants;
    this.fillTenantCells();
    this.engines(snap.engines || []);
    this.rejections(snap.rejections);
    fillBody($("iterations"), snap.iterations.slice(0, 12).map((it) => el("tr", {},
      el("td", {}, it.iteration), el("td", {}, it.waiting), el("td", {}, it.running),
      el("td", {}, it.prefill_tokens), el("td", {}, it.decode_tokens),
      el("td", {}, `${it.kv_blocks_used}/${it.kv_blocks_free}`), el("td", {}, it.preemptions),
      el("td", {}, num(it.seconds * 1000, 1)))));
  }

  // The live columns of the tenants table, from the newest snapshot (also after the table is rebuilt).
  fillTenantCells() {
    for (const t of this.tenantStats) {
      const row = document.querySelector(`#tenants tr[data-id="${t.id}"]`);
      if (!row) continue;
      row.querySelector(".c-waiting").textContent = num(t.waiting);
      row.querySelector(".c-running").textContent = num(t.running);
      row.querySelector(".c-service").textContent = num(t.service);
      // Whether its share can be read as the scheduler's: the share of the window it had work queued.
      // One short line for every row (at 800 px the table has no pixel to spare, and below it rows wrap as a
      // whole, each field in the same place); demand-limited shows as its style and its hover.
      const backlog = row.querySelector(".c-backlog");
      const known = t.backlogged !== null && t.backlogged !== undefined;
      backlog.textContent = known ? `backlog ${Math.round(100 * t.backlogged)}%` : "";
      backlog.title = known ? `work queued ${Math.round(100 * t.backlogged)}% of the last 30 s${t.demand_limited
        ? ": demand-limited, its share is what it asked for" : ": backlogged, its share is the scheduler's"}` : "";
      backlog.classList.toggle("demand-limited", Boolean(t.demand_limited));
      row.dataset.demandLimited = String(Boolean(t.demand_limited));
    }
  }

  engines(rows) { // each row names its model; hover it for the rates admission estimates that model by
    const up = rows.filter((e) => e.alive).length;
    $("engines-status").textContent = `${up} of ${rows.length} up`;
    fillBody($("engines"), rows.map((e) => {
      const fill = el("div");
      fill.style.width = `${(100 * e.kv_use).toFixed(1)}%`; // through the CSSOM: the page's CSP refuses inline styles
      return el("tr", { dataset: { key: e.key }, class: e.alive ? "" : "disabled" },
        el("td", {}, el("strong", {}, e.key), e.address ? el("div", { class: "muted small" }, e.address) : null,
          e.model ? el("div", { class: "muted small c-model", title: feasibilityText(e.feasibility) }, e.model) : null),
        el("td", { class: "c-status" }, e.alive ? (e.leaving ? "leaving" : e.suspect ? "suspect" : "up") : "down"),
        el("td", { class: "c-waiting" }, num(e.waiting)), el("td", { class: "c-running" }, num(e.running)),
        el("td", { class: "c-kv" }, `${e.kv_blocks_used} / ${e.kv_blocks_total}`, el("div", { class: "bar" }, fill)),
        el("td", { class: "c-in-flight" }, e.in_flight === null ? "–" : num(e.in_flight)),
        el("td", { class: "c-routed" }, e.routed === null ? "–" : num(e.routed)));
    }));
  }

  rejections(rej) {
    const reasons = Object.entries(rej.by_reason).filter(([, n]) => n > 0);
    $("reject-reasons").replaceChildren(...(reasons.length
      ? reasons.map(([r, n]) => el("span", { class: "chip" }, `${r}: ${n}`))
      : [el("span", { class: "muted" }, "no rejections since start")]));
    fillBody($("rejections"), rej.recent.slice(0, 15).map((r) => el("tr", { title: r.message },
      el("td", {}, clock(r.at)), el("td", { title: r.tenant_id || "" }, r.tenant_id ? identities.describe(r.tenant_id).name : "–"),
      el("td", {}, r.reason), el("td", {}, r.status),
      el("td", {}, r.retry_after_s === null ? "–" : `${r.retry_after_s} s`))));
  }
}
