// The fleet status page: polls /ui/api/status (one request per refresh) and
// renders the totals, the filters' choices and one page of proxies. Plain DOM,
// no framework; every value goes in as text, never as HTML.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const state = { offset: 0, matching: 0, limit: 100, skew: 0, timer: 0, inFlight: null };

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child);
  return node;
}

function query() {
  const form = new FormData($("filters"));
  const params = new URLSearchParams();
  for (const [k, v] of form) if (v) params.set(k, v);
  params.set("offset", String(state.offset));
  return params;
}

function left(iso) {
  const seconds = Math.round((Date.parse(iso) - (Date.now() + state.skew)) / 1000);
  if (seconds <= 0) return "ending";
  if (seconds < 120) return seconds + " s left";
  if (seconds < 7200) return Math.round(seconds / 60) + " min left";
  return Math.round(seconds / 3600) + " h left";
}

function sparkline(values) {
  const width = 100, height = 20;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  const ok = values.filter((v) => v !== null);
  const failed = values.length - ok.length;
  svg.setAttribute("aria-label", `${values.length} recent probes, ${failed} failed`);
  if (!values.length) return svg;
  const max = Math.max(1, ...ok);
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  let points = [];
  const flush = () => {
    if (points.length) {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", points.join(" "));
      svg.append(line);
    }
    points = [];
  };
  values.forEach((v, i) => {
    const x = (i * step).toFixed(1);
    if (v === null) {
      flush();
      const mark = document.createElementNS(SVG, "rect");
      mark.setAttribute("x", String(Math.max(0, i * step - 1.5)));
      mark.setAttribute("y", "0");
      mark.setAttribute("width", "3");
      mark.setAttribute("height", String(height));
      mark.setAttribute("class", "fail");
      svg.append(mark);
    } else {
      points.push(`${x},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
    }
  });
  flush();
  return svg;
}

function size(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

function row(p) {
  const labels = Object.entries(p.labels).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`));
  const health = el("td", { class: "health" }, el("span", { class: `badge ${p.health}` }, p.health));
  if (p.lastError && p.health !== "healthy") health.append(el("div", { class: "error" }, p.lastError));
  const latency = p.latencyMs === null ? "–" : `${p.latencyMs.toFixed(1)} ms`;
  const lease = el("td", { class: "lease" });
  if (p.lease) {
    lease.append(el("span", { class: "badge leased" }, "leased"), " ", el("span", { class: "holder" }, p.lease.holder), " ");
    lease.append(el("span", { class: "left muted", "data-until": p.lease.expiresAt }, left(p.lease.expiresAt)));
  } else {
    lease.append(el("span", { class: "muted" }, "free"));
  }
  if (p.gateway) {
    lease.append(el("div", { class: "gateway muted" }, `gateway: ↑ ${size(p.gateway.bytesUp)} ↓ ${size(p.gateway.bytesDown)}`));
  }
  const cooldowns = el("td", { class: "cooldowns" });
  for (const c of p.cooldowns) {
    const target = c.target === "*" ? "every site" : c.target;
    cooldowns.append(el("div", { class: "cooldown", "data-target": c.target }, el("span", { class: "badge cooling" }, target), " ",
      el("span", { class: "left muted", "data-until": c.until }, left(c.until))));
  }
  return el("tr", { "data-proxy": p.name, "data-health": p.health },
    el("td", { class: "name" }, p.name), el("td", { class: "nowrap" }, p.provider),
    el("td", { class: "nowrap" }, p.type), el("td", { class: "nowrap" }, p.zone || "–"), el("td", { class: "labels" }, ...labels), health,
    el("td", { class: "latency" }, latency), el("td", {}, sparkline(p.recentMs)), lease, cooldowns);
}

function fillSelect(select, values) {
  const chosen = select.value;
  const wanted = ["", ...values];
  const have = Array.from(select.options, (o) => o.value);
  if (have.length === wanted.length && have.every((v, i) => v === wanted[i])) return;
  select.replaceChildren(el("option", { value: "" }, "all"), ...values.map((v) => el("option", { value: v }, v)));
  select.value = values.includes(chosen) ? chosen : "";
}

// A probe target most of the fleet cannot reach: proxies keep the health they
// had (docs/discovery.md, "A probe target down"), which the page must say, or a
// fleet-wide outage of the target would look like nothing at all.
function renderTargets(targets) {
  const down = targets.filter((t) => t.down).map((t) => t.target);
  const note = $("targets-down");
  note.hidden = down.length === 0;
  const several = down.length > 1;
  const why = down.length < targets.length ? "probes go through the other targets." :
    `${targets.length > 1 ? "no target is left, so " : ""}probes count for nothing and the proxies ` +
    "keep the health they had: check the target and the fleet's way out.";
  note.textContent = down.length === 0 ? "" :
    `Probe target${several ? "s" : ""} ${down.join(", ")} ${several ? "look" : "looks"} down: ${why}`;
}

function render(data) {
  renderTargets(data.probeTargets);
  const t = data.totals;
  $("t-proxies").textContent = t.proxies;
  $("t-healthy").textContent = t.healthy;
  $("t-unhealthy").textContent = t.unhealthy;
  $("t-unknown").textContent = t.unknown;
  $("t-leased").textContent = t.leased;
  $("t-cooling").textContent = t.cooling;
  $("t-grants").textContent = t.grantsPerMinute;
  const form = $("filters").elements;
  fillSelect(form.provider, data.filters.providers);
  fillSelect(form.zone, data.filters.zones);
  fillSelect(form.label, data.filters.labels);
  fillSelect(form.state, data.filters.states);
  state.matching = data.matching;
  state.limit = data.limit;
  const first = data.matching ? data.offset + 1 : 0;
  $("range").textContent = `${first}-${data.offset + data.proxies.length} of ${data.matching}`;
  $("prev").disabled = data.offset === 0;
  $("next").disabled = data.offset + data.limit >= data.matching;
  document.querySelector("#fleet tbody").replaceChildren(...data.proxies.map(row));
}

async function refresh() {
  clearTimeout(state.timer);
  if (state.inFlight) state.inFlight.abort();
  const controller = new AbortController();
  state.inFlight = controller;
  const timeout = setTimeout(() => controller.abort(), 10000);
  try {
    const answer = await fetch("/ui/api/status?" + query(), { credentials: "same-origin", signal: controller.signal, cache: "no-store" });
    if (answer.status === 401) { window.location.reload(); return; }
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    const data = await answer.json();
    state.skew = Date.parse(data.now) - Date.now();
    if (data.offset > 0 && data.offset >= data.matching) { state.offset = 0; state.timer = setTimeout(refresh, 0); return; }
    render(data);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("updated").classList.remove("stale");
  } catch (error) {
    if (controller.signal.aborted && state.inFlight !== controller) return; // superseded
    $("updated").textContent = "cannot reach the service (" + error.message + "); retrying";
    $("updated").classList.add("stale");
  } finally {
    clearTimeout(timeout);
    if (state.inFlight === controller) {
      state.inFlight = null;
      state.timer = setTimeout(refresh, POLL_MS);
    }
  }
}

function tick() {
  for (const node of document.querySelectorAll("[data-until]")) node.textContent = left(node.dataset.until);
}

document.addEventListener("DOMContentLoaded", () => {
  const filters = $("filters");
  filters.addEventListener("change", () => { state.offset = 0; refresh(); });
  filters.addEventListener("input", (e) => { if (e.target.name === "name") { state.offset = 0; refresh(); } });
  filters.addEventListener("submit", (e) => e.preventDefault());
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); refresh(); });
  $("next").addEventListener("click", () => { state.offset += state.limit; refresh(); });
  setInterval(tick, 1000);
  refresh();
});
