// servo-monitor's page: polls /api/fleet every second and, for the selected robot, /api/robot.
// Every string from the fleet (robot ids, reasons) is untrusted: text nodes only, never HTML.
// A robot's timeline has a link of its own (#robot=ID); the filter narrows robots and events.
"use strict";

const STATES = ["connecting", "streaming", "degraded", "stalled", "reconnecting", "dead"];
// What a robot's telemetry says beyond its fail-safe state: stopped on purpose, silent, gone.
const LIVENESS = ["stale", "crashed", "stopped"];
const COLORS = {
  connecting: "#3182ce", streaming: "#1f9d55", degraded: "#d69e2e",
  stalled: "#dd6b20", reconnecting: "#805ad5", dead: "#c53030",
  stale: "#e53e3e", crashed: "#9b2c2c", stopped: "#718096",
};
const BUCKETS = [5, 10, 20, 50, 100, 200, 500, Infinity];
const SVG = "http://www.w3.org/2000/svg";
let selected = null;
let fleet = null;

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
const robotLink = (id) => `#robot=${encodeURIComponent(id)}`;

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colspan: columns }, empty))]));
}

function filterText() {
  return document.getElementById("filter").value.trim().toLowerCase();
}

function matches(words, ...fields) {
  if (!words) return true;
  const haystack = fields.filter((f) => f !== null && f !== undefined).join(" ").toLowerCase();
  return words.split(/\s+/).every((word) => haystack.includes(word));
}

function renderSummary(data) {
  const up = data.replicas.filter((r) => r.up).length;
  const counts = {};
  for (const robot of data.robots) counts[robot.status] = (counts[robot.status] || 0) + 1;
  const chips = [el("span", { class: "chip", id: "replica-count" }, `replicas ${up}/${data.replicas.length} up`),
    el("span", { class: "chip", id: "robot-count" }, `robots ${data.robots.length}`)];
  for (const state of [...STATES, ...LIVENESS]) {
    if (counts[state]) chips.push(el("span", { class: "chip" }, `${state} ${counts[state]}`));
  }
  const refused = Object.values(data.refused).reduce((a, b) => a + b, 0);
  if (refused) chips.push(el("span", { class: "chip" }, `telemetry refused ${refused}`));
  document.getElementById("summary").replaceChildren(...chips);
  document.getElementById("clock").textContent = `updated ${clock(data.now)}`;
}

function renderReplicas(replicas) {
  fill(document.querySelector("#replicas tbody"), replicas.map((r) => {
    const status = !r.up ? "down" : r.draining ? "draining" : r.warmed_up ? "serving" : "starting";
    // A down replica's last figures are history: the server sends none, the page shows none.
    const load = r.load === null ? 0 : Math.min(1, r.load);
    return el("tr", { "data-replica": r.replica, "data-status": status },
      el("td", {}, r.replica), el("td", {}, r.model), el("td", {}, r.revision ?? "–"),
      el("td", {}, badge(status), r.up ? "" : ` for ${(r.down_s ?? 0).toFixed(0)} s`),
      el("td", { class: "num" }, r.sessions === null ? "–" : `${r.sessions} / ${r.max_sessions}`),
      el("td", {}, r.load === null ? "–" : el("span", { class: "bar" }, el("span", { style: `width:${(load * 100).toFixed(0)}%` }))),
      el("td", { class: "num" }, ms(r.queue_wait_ms)));
  }), "no replica seen yet", 7);
}

function robotBadge(r) {
  if (r.identity_changed) return badge("identity changed", "identity");
  const since = r.since === null ? "" : ` since ${clock(r.since)}`;
  const node = badge(r.status);
  node.setAttribute("title", r.status === "stopped" ? `stopped on purpose: ${r.goodbye}${since}` :
    r.status === "crashed" ? `no record and no goodbye${since}: the process died or its link did` :
      r.status === "stale" ? `no record${since}` : r.last_transition ? r.last_transition.reason : r.status);
  return node;
}

function renderRobots(robots) {
  const words = filterText();
  const shown = robots.filter((r) => matches(words, r.id, r.status, r.state, r.replica, r.model, r.codec));
  fill(document.querySelector("#robots tbody"), shown.map((r) =>
    el("tr", { "data-robot": r.id, "data-state": r.status, class: r.id === selected ? "selected" : "",
      onclick: () => { location.hash = robotLink(r.id); } },
    el("td", {}, el("a", { href: robotLink(r.id) }, r.id)), el("td", {}, robotBadge(r)),
    el("td", { class: "num" }, `${ms(r.rtt_p50)} / ${ms(r.rtt_p99)}`),
    el("td", { class: "num" }, r.delay_steps), el("td", { class: "num" }, r.queue_depth),
    el("td", { class: "num" }, r.fallback_ticks), el("td", { class: "num" }, ms(r.lateness_p99)),
    el("td", {}, r.codec || "–"), el("td", {}, r.replica || "–"),
    el("td", { class: "num" }, `${r.age_s.toFixed(1)} s ago`))),
  robots.length ? "no robot matches the filter" : "no robot reports yet", 10);
  document.getElementById("shown").textContent = words ? `${shown.length} of ${robots.length}` : "";
}

function renderHistogram(robots) {
  const svg = document.getElementById("histogram");
  const live = robots.filter((r) => !LIVENESS.includes(r.status));
  const counts = (key) => BUCKETS.map((top, i) => live.filter((r) => r[key] !== null &&
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

// A small line chart of round trips over time: [{t, p50, p99}] in a (width x 140) SVG.
function lineChart(svg, points, width, span) {
  const end = Date.now() / 1000;
  const start = Math.max(end - span, Math.min(end - 10, ...points.map((p) => p.t)));
  const shown = points.filter((p) => p.t >= start && p.p50 !== null);
  const top = Math.max(10, ...shown.map((p) => p.p99 ?? p.p50));
  const x = (t) => 30 + ((t - start) / (end - start)) * (width - 40);
  const y = (v) => 120 - (v / top) * 105;
  const parts = [el("svg:line", { x1: 30, x2: width - 10, y1: 120, y2: 120, stroke: "#cbd5e0" }),
    el("svg:text", { x: 2, y: 18 }, top.toFixed(0)), el("svg:text", { x: 2, y: 123 }, "0"),
    el("svg:text", { x: 30, y: 136 }, clock(start)),
    el("svg:text", { x: width - 10, y: 136, "text-anchor": "end" }, clock(end))];
  for (const [key, color] of [["p99", "#dd6b20"], ["p50", "#3182ce"]]) {
    const series = shown.filter((p) => p[key] !== null && p[key] !== undefined);
    if (series.length > 1) {
      parts.push(el("svg:polyline", { class: `rtt-${key}`, points: series.map((p) => `${x(p.t)},${y(p[key])}`).join(" "),
        fill: "none", stroke: color, "stroke-width": 2 }));
    } else if (series.length === 1) {
      parts.push(el("svg:circle", { class: `rtt-${key}`, cx: x(series[0].t), cy: y(series[0][key]), r: 3, fill: color }));
    }
  }
  parts.push(el("svg:text", { x: width - 120, y: 12 }, "— p50"), el("svg:text", { x: width - 60, y: 12, style: "fill:#dd6b20" }, "— p99"));
  if (!shown.length) parts.push(el("svg:text", { x: width / 2, y: 70, "text-anchor": "middle" }, "no round trip measured yet"));
  svg.replaceChildren(...parts);
}

function renderEvents(events) {
  const words = filterText();
  const shown = events.filter((e) => matches(words, e.robot, e.kind, e.text));
  document.getElementById("events").replaceChildren(...(shown.length ? shown.map((e) =>
    el("li", { class: e.kind, "data-count": e.count },
      el("span", { class: "kind" }, `${clock(e.t)} ${e.kind}`), ` ${e.robot}: ${e.text}`,
      e.count > 1 ? el("span", { class: "count" }, `×${e.count} since ${clock(e.first)}`) : ""))
    : [el("li", { class: "empty" }, events.length ? "no event matches the filter" : "no event yet")]));
}

function render() {
  if (fleet === null) return;
  renderRobots(fleet.robots);
  renderEvents(fleet.events);
}

async function refresh() {
  try {
    fleet = await (await fetch("/api/fleet", { cache: "no-store" })).json();
    renderSummary(fleet);
    renderReplicas(fleet.replicas);
    render();
    renderHistogram(fleet.robots);
    lineChart(document.getElementById("fleet-rtt"), fleet.rtt, 520, 600);
    document.body.dataset.updated = String(fleet.now);
  } catch (err) {
    document.getElementById("clock").textContent = `monitor unreachable (${err})`;
  }
}

function select(robot) {
  selected = robot;
  document.getElementById("timeline-card").hidden = robot === null;
  if (robot === null) return;
  document.getElementById("timeline-robot").textContent = robot;
  document.getElementById("timeline-note").textContent = "loading…";
  refreshTimeline();
}

function fromHash() {
  const found = /^#robot=(.+)$/.exec(location.hash);
  select(found ? decodeURIComponent(found[1]) : null);
}

async function refreshTimeline() {
  if (selected === null) return;
  const robot = selected;
  const response = await fetch(`/api/robot?id=${encodeURIComponent(robot)}`, { cache: "no-store" });
  if (robot !== selected) return;
  if (!response.ok) {
    document.getElementById("timeline-note").textContent = `no telemetry from ${robot} (yet)`;
    return;
  }
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
  // State bands: each transition until the next (or now), on this machine's clock; the last one
  // is stale, crashed or stopped once the robot's records stopped.
  const transitions = data.transitions;
  transitions.forEach((tr, i) => {
    const until = i + 1 < transitions.length ? transitions[i + 1].t : end;
    if (until < start) return;
    parts.push(el("svg:rect", { class: "band", "data-state": tr.state, x: x(tr.t), y: 10,
      width: Math.max(1, x(until) - x(tr.t)), height: 26, fill: COLORS[tr.state] || "#999" },
    el("svg:title", {}, `${tr.state}: ${tr.reason}`)));
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
  lineChart(document.getElementById("robot-rtt"),
    data.samples.map((s) => ({ t: s.t, p50: s.rtt_p50, p99: s.rtt_p99 })), 1000, 600);
  const r = data.robot;
  const status = r.status === "stopped" ? `stopped (${r.goodbye})` : r.status;
  document.getElementById("timeline-note").textContent =
    `${status} on ${r.replica || "no replica"}; key ${r.fingerprint}` + (r.pinned ? " (pinned)" : " (trusted on first use)");
  document.getElementById("transitions").replaceChildren(...transitions.slice(-50).reverse().map((tr) =>
    el("li", {}, el("span", { class: "kind" }, clock(tr.t)), badge(tr.state), ` ${tr.reason}`)));
  fill(document.querySelector("#requests tbody"), data.requests.slice(-50).reverse().map((q) =>
    el("tr", {}, el("td", {}, clock(q.t)), el("td", {}, q.replica), el("td", { class: "num" }, q.seq),
      el("td", {}, q.outcome), el("td", { class: "num" }, ms(q.queue_wait_ms)),
      el("td", { class: "num" }, ms(q.inference_ms)), el("td", { class: "num" }, ms(q.staleness_ms)))),
  "no request audited yet", 7);
}

document.getElementById("timeline-close").addEventListener("click", () => {
  history.replaceState(null, "", location.pathname + location.search);
  select(null);
});
document.getElementById("filter").addEventListener("input", render);
window.addEventListener("hashchange", fromHash);
fromHash();
refresh();
setInterval(refresh, 1000);
setInterval(refreshTimeline, 2000);
