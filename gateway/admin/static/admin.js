// The dashboard: login, tenants (inline editing), API keys, usage and the audit log.

import { refreshAdapters } from "./adapters.js";
import { LiveView } from "./live.js";
import { refreshPrefixes } from "./prefixes.js";
import { ApiError, api, el, fillBody, identities, num, session, when } from "./util.js";

const $ = (id) => document.getElementById(id);
const COUNT_FIELDS = ["tokens_per_minute", "tokens_per_day", "max_queued_requests"];
let tenants = [];
let live = null;

function showError(node, err) {
  node.textContent = err instanceof ApiError || err instanceof Error ? err.message : String(err);
}

// -- login -------------------------------------------------------------------------------------------

async function login(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  const actor = $("actor").value.trim();
  $("login-error").textContent = "";
  session.save(token, actor);
  try {
    await api("GET", "/tenants");
  } catch (err) {
    session.clear();
    $("login-error").textContent = err.status === 401 || err.status === 403
      ? "That is not the admin token." : `Could not log in: ${err.message}`;
    return;
  }
  $("token").value = "";
  await enter();
}

function logout() {
  session.clear();
  if (live) live.stop();
  $("dashboard").hidden = true;
  $("logout").hidden = true;
  $("login-panel").hidden = false;
  $("who").textContent = "";
}

async function enter() {
  $("login-panel").hidden = true;
  $("dashboard").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = session.actor ? `as ${session.actor}` : "";
  await refreshTenants(); // first: the other tables name tenants from it
  await Promise.all([refreshKeys(), refreshUsage(), refreshAudit(), refreshPrefixes(), refreshAdapters()]);
  live = live || new LiveView(logout);
  await live.start();
}

// -- tenants -----------------------------------------------------------------------------------------

function countInput(name, value) {
  return el("input", { name, type: "number", min: "0", step: "1", placeholder: "∞", title: "empty: unlimited",
    value: value === null ? "" : String(value) });
}

// A tenant's default X-On-Infeasible; "" is none of its own (the server's default).
const POLICIES = ["", "reject", "fallback", "partial", "truncate"];

function policySelect(t) {
  return el("select", { name: "on_infeasible", title: "what its requests get when their deadline cannot be met; "
      + "their X-On-Infeasible header wins" },
    POLICIES.map((p) => el("option", { value: p, selected: (t.on_infeasible ?? "") === p }, p || "server")));
}

function tenantRow(t) {
  const classSelect = el("select", { name: "priority_class" },
    [...Array(10).keys()].map((c) => el("option", { value: String(c), selected: c === t.priority_class }, c)));
  const status = el("td", { class: "c-status" }, t.disabled ? "disabled" : "active");
  const row = el("tr", { dataset: { id: t.id, name: t.name }, class: t.disabled ? "disabled" : "" },
    el("td", { class: "c-name", title: `tenant id ${t.id}` }, el("strong", {}, t.name),
      el("div", { class: "muted small" }, t.id.slice(0, 8)),
      el("div", { class: "muted small c-backlog" })), // filled by live.js: its backlogged share of the window
    el("td", {}, el("input", { name: "weight", type: "number", step: "any", min: "0", value: String(t.weight) })),
    el("td", {}, classSelect),
    ...COUNT_FIELDS.map((f) => el("td", {}, countInput(f, t[f]))),
    el("td", {}, el("input", { name: "cache_group", type: "text", maxlength: "64", placeholder: "own blocks",
      title: "empty: its own prefix-cache blocks",
      value: t.cache_group ?? "" }), policySelect(t)),
    el("td", {}, t.active_keys ?? "–"),
    el("td", { class: "c-waiting" }, "–"), el("td", { class: "c-running" }, "–"), el("td", { class: "c-service" }, "–"),
    status,
    el("td", { class: "actions" },
      el("button", { type: "button", class: "save", on: { click: () => saveTenant(row, t) } }, "Save"),
      el("button", { type: "button", class: "toggle", on: { click: () => toggleTenant(row, t) } },
        t.disabled ? "Enable" : "Disable"),
      el("div", { class: "row-msg", role: "status" })));
  return row;
}

function changedFields(row, t) {
  const out = {};
  const weightText = row.querySelector('[name="weight"]').value.trim();
  const weight = weightText === "" ? NaN : Number(weightText);
  if (weight !== t.weight) out.weight = Number.isNaN(weight) ? weightText : weight;
  const cls = Number(row.querySelector('[name="priority_class"]').value);
  if (cls !== t.priority_class) out.priority_class = cls;
  const group = row.querySelector('[name="cache_group"]').value.trim() || null;
  if (group !== (t.cache_group ?? null)) out.cache_group = group;
  const policy = row.querySelector('[name="on_infeasible"]').value || null;
  if (policy !== (t.on_infeasible ?? null)) out.on_infeasible = policy;
  for (const f of COUNT_FIELDS) {
    const text = row.querySelector(`[name="${f}"]`).value.trim();
    const value = text === "" ? null : Number(text);
    if (value !== t[f]) out[f] = Number.isInteger(value) || value === null ? value : text;
  }
  return out;
}

async function saveTenant(row, t) {
  const msg = row.querySelector(".row-msg");
  const fields = changedFields(row, t);
  if (!Object.keys(fields).length) { msg.textContent = "no changes"; msg.className = "row-msg muted"; return; }
  try {
    const updated = await api("PATCH", `/tenants/${encodeURIComponent(t.id)}`, fields);
    msg.textContent = updated.engine_updated ? "saved · scheduler updated" : "saved";
    msg.className = "row-msg ok";
    await Promise.all([refreshTenants(row.dataset.id, msg.textContent), refreshAudit()]);
  } catch (err) {
    msg.className = "row-msg error";
    showError(msg, err);
  }
}

async function toggleTenant(row, t) {
  const msg = row.querySelector(".row-msg");
  try {
    await api("POST", `/tenants/${encodeURIComponent(t.id)}/${t.disabled ? "enable" : "disable"}`);
    await Promise.all([refreshTenants(), refreshAudit(), refreshKeys()]);
  } catch (err) {
    msg.className = "row-msg error";
    showError(msg, err);
  }
}

async function refreshTenants(keepMsgFor, text) {
  try {
    tenants = (await api("GET", "/tenants")).tenants;
    identities.learnTenants(tenants);
  } catch (err) {
    showError($("tenants-status"), err);
    return;
  }
  $("tenants-status").textContent = `${tenants.length} tenants`;
  fillBody($("tenants"), tenants.map(tenantRow));
  if (live) live.fillTenantCells();
  if (keepMsgFor) {
    const msg = document.querySelector(`#tenants tr[data-id="${keepMsgFor}"] .row-msg`);
    if (msg) { msg.textContent = text; msg.className = "row-msg ok"; }
  }
  const select = $("key-tenant");
  const chosen = select.value;
  select.replaceChildren(...tenants.map((t) => el("option", { value: t.id, selected: t.id === chosen }, t.name)));
}

async function createTenant(event) {
  event.preventDefault();
  const form = event.target;
  const err = $("new-tenant-error");
  err.textContent = "";
  const body = { name: form.name.value.trim() };
  if (form.weight.value !== "") body.weight = Number(form.weight.value);
  if (form.priority_class.value !== "") body.priority_class = Number(form.priority_class.value);
  try {
    const t = await api("POST", "/tenants", body);
    form.name.value = "";
    await Promise.all([refreshTenants(t.id, "created"), refreshAudit()]);
    $("key-tenant").value = t.id;
  } catch (e) {
    showError(err, e);
  }
}

// -- keys --------------------------------------------------------------------------------------------

async function refreshKeys() {
  let keys;
  try {
    keys = (await api("GET", "/keys")).keys;
    identities.learnKeys(keys);
  } catch (err) {
    showError($("new-key-error"), err);
    return;
  }
  keys.sort((a, b) => Number(a.revoked) - Number(b.revoked) || (a.created_at < b.created_at ? 1 : -1));
  fillBody($("keys"), keys.map((k) => el("tr", { dataset: { id: k.id, prefix: k.prefix }, class: k.revoked ? "disabled" : "" },
    el("td", {}, el("code", {}, `${k.prefix}…`)), el("td", {}, k.name), el("td", {}, k.tenant_name || k.tenant_id),
    el("td", {}, when(k.created_at)), el("td", {}, when(k.last_used_at)),
    el("td", { class: "c-status" }, k.revoked ? `revoked ${when(k.revoked_at)}` : "active"),
    el("td", {}, k.revoked ? "" : el("button", { type: "button", class: "revoke", on: { click: () => revokeKey(k) } },
      "Revoke")))));
}

async function createKey(event) {
  event.preventDefault();
  const form = event.target;
  const err = $("new-key-error");
  err.textContent = "";
  try {
    const made = await api("POST", `/tenants/${encodeURIComponent(form.tenant.value)}/keys`,
      { name: form.name.value.trim() || "default" });
    $("new-key-secret").textContent = made.secret;
    $("new-key-box").hidden = false;
    await Promise.all([refreshKeys(), refreshTenants(), refreshAudit()]);
  } catch (e) {
    showError(err, e);
  }
}

async function revokeKey(k) {
  if (!window.confirm(`Revoke key ${k.prefix}… (${k.name})? Clients using it get 401 at once.`)) return;
  try {
    await api("POST", `/keys/${encodeURIComponent(k.id)}/revoke`);
    await Promise.all([refreshKeys(), refreshTenants(), refreshAudit()]);
  } catch (e) {
    showError($("new-key-error"), e);
  }
}

// -- usage and audit -----------------------------------------------------------------------------------

// Engine tokens of cancelled requests and of attempts a retry replaced, as a share of the tenant's engine tokens.
function wastedCell(w) {
  if (!w) return el("td", {}, "-");
  const title = `cancelled ${w.cancelled_tokens}, replaced by a retry ${w.replaced_tokens}, ` +
    `after a cancel ${w.tokens_after_cancel} of ${w.engine_tokens} engine tokens`;
  return el("td", { class: "wasted", title }, `${(100 * w.wasted_share).toFixed(1)}%`);
}

// Requests per serving model, and those degraded to meet a deadline (billing/degradations.py).
function servedCell(s) {
  if (!s) return el("td", {}, "–");
  const models = Object.entries(s.by_model).map(([m, n]) => `${m} ${n}`).join(", ");
  const degraded = Object.entries(s.degraded).map(([k, n]) => `${k} ${n}`).join(", ");
  const dropped = s.dropped_tokens ? ` · ${num(s.dropped_tokens)} prompt tokens dropped` : "";
  return el("td", { class: "c-served" }, models, degraded ? el("div", { class: "muted small" }, degraded + dropped) : null);
}

async function refreshUsage() {
  const window_ = $("usage-window").value;
  try {
    const usage = await api("GET", `/usage?window=${encodeURIComponent(window_)}`);
    if (!usage.tenants.length) {
      fillBody($("usage"), [el("tr", {}, el("td", { colspan: "10", class: "muted" }, `no requests in the last ${window_}`))]);
      return;
    }
    fillBody($("usage"), usage.tenants.map((u) => el("tr", {},
      el("td", {}, u.tenant_name || u.tenant_id), el("td", {}, num(u.requests)),
      el("td", {}, Object.entries(u.requests_by_status).map(([s, n]) => `${s} ${n}`).join(", ")),
      el("td", {}, num(u.prompt_tokens)), el("td", {}, num(u.cached_tokens)), el("td", {}, num(u.completion_tokens)),
      el("td", {}, num(u.charged_service, 1)), el("td", {}, num(u.preemptions)), wastedCell(usage.wasted[u.tenant_id]),
      servedCell(usage.served[u.tenant_id]))));
  } catch (err) {
    fillBody($("usage"), [el("tr", {}, el("td", { colspan: "10", class: "error" }, err.message))]);
  }
}

function describeChange(entry) {
  const before = entry.before || {};
  const after = entry.after || {};
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])];
  if (!entry.before) return keys.map((k) => `${k}=${JSON.stringify(after[k])}`).join(", ");
  return keys.filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]))
    .map((k) => `${k}: ${JSON.stringify(before[k])} → ${JSON.stringify(after[k])}`).join(", ");
}

async function refreshAudit() {
  try {
    const { entries } = await api("GET", "/audit?limit=20");
    fillBody($("audit"), entries.map((a) => el("tr", {},
      el("td", {}, when(a.at)), el("td", {}, a.actor), el("td", {}, a.action),
      el("td", { title: a.tenant_id ? `tenant id ${a.tenant_id}` : "" },
        a.tenant_id ? identities.describe(a.tenant_id).name : "–"),
      el("td", { class: "change" }, describeChange(a)))));
  } catch (err) {
    fillBody($("audit"), [el("tr", {}, el("td", { colspan: "5", class: "error" }, err.message))]);
  }
}

// -- wiring --------------------------------------------------------------------------------------------

$("login-form").addEventListener("submit", login);
$("logout").addEventListener("click", logout);
$("new-tenant").addEventListener("submit", createTenant);
$("new-key").addEventListener("submit", createKey);
$("usage-refresh").addEventListener("click", refreshUsage);
$("usage-window").addEventListener("change", refreshUsage);
$("new-key-dismiss").addEventListener("click", () => {
  $("new-key-secret").textContent = "";
  $("new-key-box").hidden = true;
});
$("new-key-copy").addEventListener("click", () => navigator.clipboard?.writeText($("new-key-secret").textContent));
document.body.dataset.ready = "true";
if (session.token) {
  enter().catch((err) => {
    logout();
    $("login-error").textContent = `Session expired: ${err.message}`;
  });
}
