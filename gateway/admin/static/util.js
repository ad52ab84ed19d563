// Shared helpers: the admin session, the API client, DOM building and formatting.
// The token lives in memory and sessionStorage only; it is sent as a Bearer header, never in a URL.

const TOKEN_KEY = "fairserve.admin_token";
const ACTOR_KEY = "fairserve.admin_actor";

export const session = {
  token: sessionStorage.getItem(TOKEN_KEY),
  actor: sessionStorage.getItem(ACTOR_KEY) || "",
  save(token, actor) {
    this.token = token;
    this.actor = actor;
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(ACTOR_KEY, actor);
  },
  clear() {
    this.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(ACTOR_KEY);
  },
};

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

export function authHeaders() {
  const headers = { Authorization: `Bearer ${session.token}` };
  if (session.actor) headers["X-Admin-Actor"] = session.actor;
  return headers;
}

// One admin API call; throws ApiError with the server's message on any non-2xx answer.
export async function api(method, path, body) {
  const headers = authHeaders();
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(`/admin/api${path}`, init);
  let data = null;
  try {
    data = await resp.json();
  } catch (_) {
    data = null;
  }
  if (!resp.ok) {
    const err = data && data.error ? data.error : {};
    throw new ApiError(resp.status, err.message || `HTTP ${resp.status}`, err.param || null);
  }
  return data;
}

// el("td", {class: "x", dataset: {id}}, "text", child): text is always set as text, never parsed as HTML.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Each cell gets its column's header as data-label: below 1024 px the rows wrap and show it (admin.css).
export function fillBody(table, rows) {
  const heads = [...table.tHead.rows[0].cells].map((th) => th.textContent.trim());
  for (const row of rows) {
    [...row.cells].forEach((td, i) => { if (heads[i] && td.colSpan === 1) td.dataset.label = heads[i]; });
  }
  table.tBodies[0].replaceChildren(...rows);
}

// Who a fairness key is, for people: tenants by name, API keys by tenant and prefix, users as tenant/user.
// Names learnt once are kept, so a series still reads by name after its tenant leaves the snapshot.
export const identities = {
  tenants: {},
  keys: {},
  learnTenants(rows) {
    for (const t of rows) this.tenants[t.id] = t.name;
  },
  learnKeys(rows) {
    for (const k of rows) this.keys[k.id] = { tenant: k.tenant_id, prefix: k.prefix };
  },
  // {name, id}: the name a person reads, and the key itself (shown on hover).
  describe(key) {
    const tenant = (id) => this.tenants[id] || `tenant ${id.slice(0, 8)}…`;
    if (key in this.tenants) return { name: this.tenants[key], id: `tenant id ${key}` };
    if (key in this.keys) return { name: `${tenant(this.keys[key].tenant)} · key ${this.keys[key].prefix}…`, id: `API key id ${key}` };
    const cut = key.indexOf("/");
    if (cut > 0) return { name: `${tenant(key.slice(0, cut))} / ${key.slice(cut + 1)}`, id: `user ${key}` };
    return { name: `${key.slice(0, 8)}…`, id: key };
  },
};

export function when(iso) {
  if (!iso) return "never";
  const d = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}

export function clock(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleTimeString(undefined, { hour12: false });
}

export function num(value, digits = 0) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function pct(value) {
  return `${(100 * value).toFixed(1)}%`;
}

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777",
  "#4d7c0f", "#9a3412", "#475569"];
