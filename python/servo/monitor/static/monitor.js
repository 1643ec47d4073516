// servo-monitor's page: polls /api/fleet every second and, for the selected robot, /api/robot.
// Every string from the fleet (robot ids, reasons) is untrusted: text nodes only, never HTML.
"use strict";

const STATES = ["connecting", "streaming", "degraded", "stalled", "reconnecting", "dead"];
const COLORS = {
  connecting: "#3182ce", streaming: "#1f9d55", degraded: "#d69e2e",
  stalled: "#dd6b20", reconnecting: "#805ad5", dead: "#c53030",
};
const BUCKETS = [5, 10, 20, 50, 100, 200, 500, Infinity];
const SVG = "http://www.w3.org/2000/svg";
let selected = null;

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.setAttribute("class", value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

const ms = (v) => (v === null || v === undefined ? "–" : `${v.toFixed(1)} ms`);
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
const badge = (text, kind = text) => el("span", { class: `badge ${kind}` }, text);

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderSummary(fleet) {
  const up = fleet.replicas.filter((r) => r.up).length;
  const counts = {};
  for (const robot of fleet.robots) counts[robot.stale ? "stale" : robot.state] = (counts[robot.stale ? "stale" : robot.state] || 0) + 1;
  const chips = [el("span", { class: "chip", id: "replica-count" }, `replicas ${up}/${fleet.replicas.length} up`),
    el("span", { class: "chip", id: "robot-count" }, `robots ${fleet.robots.length}`)];
  for (const state of [...STATES, "stale"]) {
    if (counts[state]) chips.push(el("span", { class: "chip" }, `${state} ${counts[state]}`));
  }
  const refused = Object.values(fleet.refused).reduce((a, b) => a + b, 0);
  if (refused) chips.push(el("span", { class: "chip" }, `telemetry refused ${refused}`));
  document.getElementById("summary").replaceChildren(...chips);
  document.getElementById("clock").textContent = `updated ${clock(fleet.now)}`;
}

function renderReplicas(replicas) {
  fill(document.querySelector("#replicas tbody"), replicas.map((r) => {
    const status = !r.up ? "down" : r.draining ? "draining" : r.warmed_up ? "serving" : "starting";
    const load = r.load === null || !r.up ? 0 : Math.min(1, r.load);
    return el("tr", { "data-replica": r.replica, "data-status": status },
      el("td", {}, r.replica), el("td", {}, r.model), el("td", {}, r.revision ?? "–"),
      el("td", {}, badge(status)),
      el("td", { class: "num" }, r.sessions === null || !r.up ? "–" : `${r.sessions} / ${r.max_sessions}`),
      el("td", {}, el("span", { class: "bar" }, el("span", { style: `width:${(load * 100).toFixed(0)}%` }))),
      el("td", { class: "num" }, ms(r.queue_wait_ms)));
  }));
}

function renderRobots(robots) {
  fill(document.querySelector("#robots tbody"), robots.map((r) => {
    const state = r.identity_changed ? badge("identity changed", "identity") : r.stale ? badge("stale") : badge(r.state);
    return el("tr", { "data-robot": r.id, "data-state": r.stale ? "stale" : r.state, class: r.id === selected ? "selected" : "",
      onclick: () => select(r.id) },
      el("td", {}, r.id), el("td", {}, state),
      el("td", { class: "num" }, `${ms(r.rtt_p50)} / ${ms(r.rtt_p99)}`),
      el("td", { class: "num" }, r.delay_steps), el("td", { class: "num" }, r.queue_depth),
      el("td", { class: "num" }, r.fallback_ticks), el("td", { class: "num" }, ms(r.lateness_p99)),
      el("td", {}, r.codec || "–"), el("td", {}, r.replica || "–"),
      el("td", { class: "num" }, `${r.age_s.toFixed(1)} s ago`));
  }));
}

function renderHistogram(robots) {
  const svg = document.getElementById("histogram");
  const counts = (key) => BUCKETS.map((top, i) => robots.filter((r) => r[key] !== null &&
    r[key] < top && r[key] >= (i ? BUCKETS[i - 1] : 0)).length);
  const p50 = counts("rtt_p50"), p99 = counts("rtt_p99");
  const peak = Math.max(1, ...p50, ...p99);
  const width = 520 / BUCKETS.length;
  const parts = [];
  BUCKETS.forEach((top, i) => {
    for (const [series, color, dx] of [[p50, "#3182ce", 6], [p99, "#dd6b20", width / 2]]) {
      const h = (series[i] / peak) * 140;
      parts.push(el("svg:rect", { x: i * width + dx, y: 150 - h, width: width / 2 - 8, height: h, fill: color },
        el("svg:title", {}, `${series[i]} robot(s)`)));
    }
    const label = top === Infinity ? `≥${BUCKETS[i - 1]}` : `<${top}`;
    parts.push(el("svg:text", { x: i * width + width / 2, y: 168, "text-anchor": "middle" }, label));
  });
  parts.push(el("svg:text", { x: 4, y: 12 }, "■ p50"), el("svg:text", { x: 50, y: 12, style: "fill:#dd6b20" }, "■ p99"));
  svg.replaceChildren(...parts);
}

function renderEvents(events) {
  document.getElementById("events").replaceChildren(...events.map((e) =>
    el("li", { class: e.kind }, el("span", { class: "kind" }, `${clock(e.t)} ${e.kind}`), ` ${e.robot}: ${e.text}`)));
}

async function refresh() {
  try {
    const fleet = await (await fetch("/api/fleet", { cache: "no-store" })).json();
    renderSummary(fleet);
    renderReplicas(fleet.replicas);
    renderRobots(fleet.robots);
    renderHistogram(fleet.robots);
    renderEvents(fleet.events);
    document.body.dataset.updated = String(fleet.now);
  } catch (err) {
    document.getElementById("clock").textContent = `monitor unreachable (${err})`;
  }
}

function select(robot) {
  selected = robot;
  document.getElementById("timeline-card").hidden = false;
  document.getElementById("timeline-robot").textContent = robot;
  refreshTimeline();
}

async function refreshTimeline() {
  if (selected === null) return;
  const response = await fetch(`/api/robot?id=${encodeURIComponent(selected)}`, { cache: "no-store" });
  if (!response.ok) return;
  const data = await response.json();
  // The last two minutes, or since the robot's first transition when that is more recent.
  const end = Date.now() / 1000;
  const first = Math.min(end - 10, ...data.transitions.map((tr) => tr.t), ...data.requests.map((r) => r.t));
  const start = Math.max(end - 120, first - 1);
  const x = (t) => ((Math.max(start, t) - start) / (end - start)) * 1000;
  const parts = [];
  for (let i = 0; i <= 4; i++) {
    const t = start + ((end - start) * i) / 4;
    parts.push(el("svg:text", { x: Math.min(950, x(t)), y: 198 }, clock(t)));
  }
  // State bands: each transition until the next (or now), on this machine's clock.
  const transitions = data.transitions;
  transitions.forEach((tr, i) => {
    const until = i + 1 < transitions.length ? transitions[i + 1].t : end;
    if (until < start) return;
    parts.push(el("svg:rect", { x: x(tr.t), y: 10, width: Math.max(1, x(until) - x(tr.t)), height: 26,
      fill: COLORS[tr.state] || "#999" }, el("svg:title", {}, `${tr.state}: ${tr.reason}`)));
  });
  // Round trip (p50) per record, and each request's staleness at the replica.
  const samples = data.samples.filter((s) => s.t >= start && s.rtt_p50 !== null);
  const top = Math.max(50, ...samples.map((s) => s.rtt_p99 || 0), ...data.requests.map((r) => r.staleness_ms));
  const y = (v) => 185 - (v / top) * 135;
  if (samples.length > 1) {
    parts.push(el("svg:polyline", { points: samples.map((s) => `${x(s.t)},${y(s.rtt_p50)}`).join(" "),
      fill: "none", stroke: "#3182ce", "stroke-width": 2 }));
  }
  for (const r of data.requests.filter((q) => q.t >= start)) {
    parts.push(el("svg:line", { x1: x(r.t), x2: x(r.t), y1: 185, y2: y(r.staleness_ms),
      stroke: r.outcome === "ok" ? "#a0aec0" : "#c53030" }, el("svg:title", {}, `seq ${r.seq}: ${r.outcome}`)));
  }
  parts.push(el("svg:text", { x: 4, y: 48 }, `rtt p50 (line) and each request's staleness at the replica (bars), 0–${top.toFixed(0)} ms`));
  document.getElementById("timeline").replaceChildren(...parts);
  document.getElementById("timeline-note").textContent =
    `${data.robot.state} on ${data.robot.replica || "no replica"}; key ${data.robot.fingerprint}` +
    (data.robot.pinned ? " (pinned)" : " (trusted on first use)");
  document.getElementById("transitions").replaceChildren(...transitions.slice(-50).reverse().map((tr) =>
    el("li", {}, el("span", { class: "kind" }, clock(tr.t)), badge(tr.state), ` ${tr.reason}`)));
  fill(document.querySelector("#requests tbody"), data.requests.slice(-50).reverse().map((r) =>
    el("tr", {}, el("td", {}, clock(r.t)), el("td", {}, r.replica), el("td", { class: "num" }, r.seq),
      el("td", {}, r.outcome), el("td", { class: "num" }, ms(r.queue_wait_ms)),
      el("td", { class: "num" }, ms(r.inference_ms)), el("td", { class: "num" }, ms(r.staleness_ms)))));
}

document.getElementById("timeline-close").addEventListener("click", () => {
  selected = null;
  document.getElementById("timeline-card").hidden = true;
});
refresh();
setInterval(refresh, 1000);
setInterval(refreshTimeline, 2000);
