// LoRA adapters: list, register (public or one tenant's) and remove. Admin token only; a tenant sees the
// adapters it may use through /v1/models, never this list.

import { ApiError, api, el, fillBody, identities, when } from "./util.js";

const $ = (id) => document.getElementById(id);

function showError(node, err) {
  node.textContent = err instanceof ApiError || err instanceof Error ? err.message : String(err);
}

// The owner choices: public, then each tenant by name (its id is what is sent), keeping the selection.
function fillOwners(select, tenants) {
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "public (every tenant)"),
    ...tenants.map((t) => el("option", { value: t.id }, t.name)));
  select.value = tenants.some((t) => t.id === chosen) ? chosen : "";
}

function owner(a) {
  if (a.public) return el("span", { class: "muted" }, "public");
  return el("span", { title: `tenant id ${a.tenant_id}` }, identities.describe(a.tenant_id).name);
}

export async function refreshAdapters() {
  let adapters;
  try {
    const tenants = (await api("GET", "/tenants")).tenants;
    identities.learnTenants(tenants);
    fillOwners($("new-adapter").tenant, tenants);
    adapters = (await api("GET", "/adapters")).adapters;
  } catch (err) {
    showError($("new-adapter-error"), err);
    return;
  }
  fillBody($("adapters"), adapters.map((a) => el("tr", { dataset: { name: a.name } },
    el("td", {}, el("strong", {}, a.name)),
    el("td", { class: "owner" }, owner(a)),
    el("td", { class: "small" }, el("code", {}, a.path)),
    el("td", {}, a.source === "config" ? "--lora (config)" : `${when(a.created_at)} · ${a.actor}`),
    el("td", { class: "actions" }, a.source === "config" ? null
      : el("button", { type: "button", class: "remove", on: { click: () => removeAdapter(a) } }, "Remove")))));
}

async function removeAdapter(a) {
  try {
    await api("DELETE", `/adapters/${encodeURIComponent(a.name)}`);
  } catch (err) {
    showError($("new-adapter-error"), err);
  }
  await refreshAdapters();
}

async function addAdapter(event) {
  event.preventDefault();
  const form = event.target;
  $("new-adapter-error").textContent = "";
  const body = { name: form.name.value.trim(), path: form.path.value.trim() };
  if (form.tenant.value) body.tenant = form.tenant.value;
  try {
    await api("POST", "/adapters", body);
    form.reset();
  } catch (err) {
    showError($("new-adapter-error"), err);
  }
  await refreshAdapters();
}

$("new-adapter").addEventListener("submit", addAdapter);
