// Public prompt prefixes: list, register (text) and remove. Tenants never see this: admin token only.

import { ApiError, api, el, fillBody, when } from "./util.js";

const $ = (id) => document.getElementById(id);

function showError(node, err) {
  node.textContent = err instanceof ApiError || err instanceof Error ? err.message : String(err);
}

export async function refreshPrefixes() {
  let prefixes;
  try {
    prefixes = (await api("GET", "/prefixes")).prefixes;
    const form = $("new-prefix");
    if (!form.model.value) form.model.value = (await api("GET", "/engine")).model;
  } catch (err) {
    showError($("new-prefix-error"), err);
    return;
  }
  fillBody($("prefixes"), prefixes.map((p) => el("tr", { dataset: { id: p.id, name: p.name } },
    el("td", {}, el("strong", {}, p.name)),
    el("td", {}, p.model),
    el("td", {}, p.tokens),
    el("td", { class: "muted small", title: p.text ?? "" }, (p.text ?? "(token ids)").slice(0, 80)),
    el("td", {}, when(p.created_at)),
    el("td", { class: "actions" },
      el("button", { type: "button", class: "remove", on: { click: () => removePrefix(p) } }, "Remove")))));
}

async function removePrefix(p) {
  try {
    await api("DELETE", `/prefixes/${encodeURIComponent(p.id)}`);
  } catch (err) {
    showError($("new-prefix-error"), err);
  }
  await refreshPrefixes();
}

async function addPrefix(event) {
  event.preventDefault();
  const form = event.target;
  $("new-prefix-error").textContent = "";
  try {
    await api("POST", "/prefixes", { model: form.model.value.trim(), name: form.name.value.trim(),
      text: form.text.value });
    form.reset();
  } catch (err) {
    showError($("new-prefix-error"), err);
  }
  await refreshPrefixes();
}

$("new-prefix").addEventListener("submit", addPrefix);
