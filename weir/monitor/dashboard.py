"""The dashboard: one self-contained HTML page (no CDN, no build step) served at `/`.

Vanilla JS draws the topology (SVG; processors and topics colored by health) and time-series charts (SVG
polylines) from the JSON API, refreshing every 2 s. Every name shown comes from progress records, so the
page only ever sets text (`textContent`), never HTML built from data. Stable hooks for browser tests:
`#topology`, `.node[data-name=...][data-health=...]`, `#chart-rates`, `#chart-lag`, `#chart-freshness`,
`#chart-batch`, `#chart-dlq`, `#processors .proc-row[data-name=...]`, `#alerts-active .alert`,
`#alerts-history .alert`, `#broker[data-reachable=...]`, `#updated`.
"""

DASHBOARD = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>weir monitor</title>
<link rel="icon" href="data:,">
<style>
  :root { --healthy:#2e7d32; --behind:#f9a825; --stalled:#ef6c00; --dead:#c62828; --waiting:#6a1b9a; --stopped:#757575;
          --unknown:#9e9e9e; --starting:#0277bd; --running:#00897b;
          --bg:#fafafa; --fg:#212121; --muted:#757575; --line:#e0e0e0; }
  body { font: 13px/1.4 system-ui, sans-serif; margin: 0; background: var(--bg); color: var(--fg); }
  header { display: flex; gap: 18px; align-items: center; padding: 8px 16px; background: #263238; color: #fff; }
  header h1 { font-size: 16px; margin: 0; }
  header .pill { padding: 2px 8px; border-radius: 10px; background: #455a64; }
  #broker[data-reachable="true"] { background: var(--healthy); }
  #broker[data-reachable="false"] { background: var(--dead); }
  #status.error { color: #ffcdd2; }
  main { padding: 12px 16px; display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 12px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px;
            overflow-x: auto; }
  section h2 { font-size: 13px; margin: 0 0 6px; color: var(--muted); text-transform: uppercase; }
  .wide { grid-column: 1 / -1; }
  #topology { width: 100%; min-height: 160px; }
  .node rect, .node ellipse { stroke: #37474f; stroke-width: 1; }
  .node text { font-size: 11px; pointer-events: none; }
  .node { cursor: pointer; }
  .node.selected rect, .node.selected ellipse { stroke-width: 3; }
  .edge { fill: none; stroke: #90a4ae; stroke-width: 1.4; }
  .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 10px; }
  .chart svg { width: 100%; height: 170px; background: #fff; }
  .chart .axis { stroke: #bdbdbd; stroke-width: 1; }
  .chart .tick { font-size: 10px; fill: var(--muted); }
  .chart polyline { fill: none; stroke-width: 1.6; }
  .chart .legend { font-size: 10px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid var(--line); white-space: nowrap; }
  th { color: var(--muted); font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .badge { display: inline-block; padding: 1px 6px; border-radius: 8px; color: #fff; font-size: 11px; }
  .alert { padding: 4px 6px; border-left: 4px solid var(--dead); margin: 3px 0; background: #fff8f8; }
  .alert.resolved { border-color: var(--healthy); background: #f5fbf5; }
  .muted { color: var(--muted); }
  #detail pre { white-space: pre-wrap; margin: 0; font-size: 11px; }
</style>
</head>
<body>
<header>
  <h1>weir monitor</h1>
  <span id="broker" class="pill" data-reachable="unknown">broker ?</span>
  <span id="health-summary" class="pill">&nbsp;</span>
  <span id="selected" class="pill">all processors</span>
  <span id="updated" class="muted">never updated</span>
  <span id="status"></span>
</header>
<main>
  <section class="wide"><h2>Topology</h2><svg id="topology" role="img" aria-label="pipeline topology"></svg></section>
  <section class="wide"><h2>Time series (last 15 minutes)</h2>
    <div class="charts">
      <div class="chart"><h2>Input vs processing rate (records/s)</h2><svg id="chart-rates"></svg></div>
      <div class="chart"><h2>Lag (records)</h2><svg id="chart-lag"></svg></div>
      <div class="chart"><h2>Freshness (s behind real time)</h2><svg id="chart-freshness"></svg></div>
      <div class="chart"><h2>Batch duration (ms)</h2><svg id="chart-batch"></svg></div>
      <div class="chart"><h2>Dead letters and late records (per batch)</h2><svg id="chart-dlq"></svg></div>
    </div>
  </section>
  <section><h2>Processors</h2><table id="processors"><thead><tr>
    <th>processor</th><th>health</th><th>lag</th><th>lag s</th><th>in/s</th><th>proc/s</th><th>freshness s</th>
    <th>dlq</th><th>late</th><th>retention left</th><th>restarts</th><th>failures</th></tr></thead>
    <tbody></tbody></table>
    <div id="detail" class="muted">click a processor for its details</div>
  </section>
  <section><h2>Alerts firing</h2><div id="alerts-active"></div>
    <h2 style="margin-top:10px">Fired and resolved</h2><div id="alerts-history"></div></section>
  <section><h2>Outputs</h2><table id="outputs"><thead><tr><th>output</th><th>freshness s</th><th>written by</th>
    </tr></thead><tbody></tbody></table></section>
  <section><h2>Views</h2><table id="views"><thead><tr><th>view</th><th>key</th><th>rows</th><th>current as of</th>
    <th>lag s</th></tr></thead><tbody></tbody></table></section>
  <section><h2>Topics</h2><table id="topics"><thead><tr><th>topic</th><th>partitions</th><th>records</th>
    <th>append/s</th><th>retention</th></tr></thead><tbody></tbody></table></section>
</main>
<script>
"use strict";
const TOKEN = new URLSearchParams(location.search).get("token");
const HEADERS = TOKEN ? {"Authorization": "Bearer " + TOKEN} : {};
const SVG = "http://www.w3.org/2000/svg";
const WINDOW_MS = 15 * 60 * 1000;
// A batch's point is stamped with its progress record's time, which can reach the monitor after points
// stamped later: each refresh asks for the points that arrived after the last answer's `arrival` cursor,
// whatever their stamps (merge() keeps the points in time order, one per time).
const PALETTE = ["#1565c0", "#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4e342e", "#283593", "#00695c",
                 "#e65100", "#37474f"];
const COLORS = {healthy: "#2e7d32", behind: "#f9a825", stalled: "#ef6c00", dead: "#c62828", stopped: "#757575",
                waiting: "#6a1b9a", unknown: "#9e9e9e", starting: "#0277bd", running: "#00897b"};
let selected = null;           // a processor key, or null for all
let overview = null;
const store = {};              // "processor|series" or "output|name" -> [[t, v], ...]
let arrival = 0;               // the cursor of the last /api/series answer
let started = null;            // the monitor's start: a restarted monitor numbers its arrivals afresh

function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(digits === undefined ? (Number.isInteger(v) ? 0 : 1) : digits);
}
function pct(v) { return v === null || v === undefined ? "–" : (v * 100).toFixed(2) + "%"; }
function dur(s) {
  if (s === null || s === undefined) return "–";
  const a = Math.abs(s), sign = s < 0 ? "-" : "";
  if (a < 120) return sign + a.toFixed(0) + "s";
  if (a < 7200) return sign + (a / 60).toFixed(0) + "m";
  if (a < 172800) return sign + (a / 3600).toFixed(1) + "h";
  return sign + (a / 86400).toFixed(1) + "d";
}
function admission(b) {  // flow = auto: the last batch's limit and why (docs/flow.md); or real time
  if (b && b.realtime_s) return `real time: records stream through, checkpointed every ${fmt(b.realtime_s)} s`;
  const a = b && b.admission;
  if (!a) return "";
  return `admission: ${fmt(a.limit)} records per batch (${a.reason}); ${fmt(a.waiting)} waiting; ` +
    `last batch ${fmt(a.measured_ms)} ms of a ${fmt(a.target_ms)} ms target`;
}
function releases(p) {  // each version's shares of its input; the running one first (weir/monitor/drift.py)
  const vs = p.versions || [];
  if (vs.length < 2) return vs.length ? `version ${vs[0].version}` : "";
  const d = p.release_drift;
  const lines = vs.slice(0, 3).map(v => `version ${v.version} since ${new Date(v.since_ms).toISOString()}: ` +
    `in ${fmt(v.in)}; out ${pct(v.shares.out)}, filtered ${pct(v.shares.filtered)}, dlq ${pct(v.shares.dlq)}, ` +
    `late ${pct(v.shares.late)}`);
  if (d && d.share) lines.push("release drift: " + d.detail);
  return lines.join("\n");
}
function rebuilds(r) {  // Kafka clients of its process rebuilt after errors they could not go on from
  const kinds = Object.entries(r || {}).filter(([, n]) => n > 0);
  if (!kinds.length) return "";
  return "client rebuilds: " + kinds.map(([k, n]) => `${k} ${fmt(n)}`).join(", ");
}
async function get(path) {
  const r = await fetch(path, {headers: HEADERS, cache: "no-store"});
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// -- topology ---------------------------------------------------------------------------------------------
function layout(topo) {
  const depth = {}, ins = {};
  topo.nodes.forEach(n => { depth[n.id] = 0; ins[n.id] = 0; });
  for (let i = 0; i < topo.nodes.length + 1; i++) {      // longest path; bounded, so a cycle cannot hang it
    let changed = false;
    topo.edges.forEach(e => {
      if (depth[e.from] !== undefined && depth[e.to] !== undefined && depth[e.to] < depth[e.from] + 1) {
        depth[e.to] = depth[e.from] + 1; changed = true;
      }
    });
    if (!changed) break;
  }
  const cols = {};
  topo.nodes.forEach(n => { (cols[depth[n.id]] = cols[depth[n.id]] || []).push(n); });
  const pos = {};
  const colW = 190, rowH = 54;
  let rows = 1;
  Object.keys(cols).forEach(d => {
    cols[d].sort((a, b) => a.id < b.id ? -1 : 1);
    rows = Math.max(rows, cols[d].length);
    cols[d].forEach((n, i) => { pos[n.id] = {x: 20 + d * colW, y: 16 + i * rowH}; });
  });
  return {pos, width: 40 + (Object.keys(cols).length) * colW, height: 30 + rows * rowH};
}
function drawTopology(topo) {
  const svg = document.getElementById("topology");
  svg.replaceChildren();
  const {pos, width, height} = layout(topo);
  svg.setAttribute("viewBox", `0 0 ${Math.max(width, 400)} ${height}`);
  svg.style.height = height + "px";
  const defs = el("svg:defs");
  const marker = el("svg:marker", {id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5",
                                   markerWidth: "6", markerHeight: "6", orient: "auto-start-reverse"});
  marker.appendChild(el("svg:path", {d: "M 0 0 L 10 5 L 0 10 z", fill: "#90a4ae"}));
  defs.appendChild(marker);
  svg.appendChild(defs);
  const W = 150, H = 34;
  topo.edges.forEach(e => {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) return;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    svg.appendChild(el("svg:path", {class: "edge", d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
                                     "marker-end": "url(#arrow)", "data-from": e.from, "data-to": e.to}));
  });
  topo.nodes.forEach(n => {
    const p = pos[n.id];
    const g = el("svg:g", {class: "node " + n.kind + (n.id === selected ? " selected" : ""), "data-name": n.id,
                           "data-kind": n.kind, "data-health": n.health, transform: `translate(${p.x},${p.y})`});
    const fill = COLORS[n.health] || COLORS.unknown;
    if (n.kind === "processor") {
      g.appendChild(el("svg:rect", {width: W, height: H, rx: 6, fill}));
    } else {
      g.appendChild(el("svg:ellipse", {cx: W / 2, cy: H / 2, rx: W / 2, ry: H / 2, fill: "#fff", stroke: fill,
                                       "stroke-width": 2, "stroke-dasharray": n.kind === "sink" ? "4 3" : ""}));
    }
    const label = n.name.length > 24 ? n.name.slice(0, 23) + "…" : n.name;
    g.appendChild(el("svg:text", {x: W / 2, y: 14, "text-anchor": "middle",
                                  fill: n.kind === "processor" ? "#fff" : "#212121"}, label));
    const sub = n.kind === "processor" ? n.health : (n.freshness_s !== null && n.freshness_s !== undefined
                ? "fresh " + dur(n.freshness_s) : n.kind);
    g.appendChild(el("svg:text", {x: W / 2, y: 28, "text-anchor": "middle",
                                  fill: n.kind === "processor" ? "#fff" : "#616161"}, sub));
    g.appendChild(el("svg:title", {}, n.id + " (" + n.health + ")"));
    if (n.kind === "processor") g.addEventListener("click", () => select(n.id === selected ? null : n.id));
    svg.appendChild(g);
  });
}

// -- charts -----------------------------------------------------------------------------------------------
function merge(key, points) {
  const have = store[key] || (store[key] = []);
  points.forEach(p => {  // in time order: a late arrival is put where its stamp belongs
    let i = have.length;
    while (i > 0 && have[i - 1][0] > p[0]) i--;
    if (i > 0 && have[i - 1][0] === p[0]) have[i - 1] = p; else have.splice(i, 0, p);
  });
  const cut = Date.now() - WINDOW_MS;
  while (have.length && have[0][0] < cut) have.shift();
}
function drawChart(id, lines, unit) {
  const svg = document.getElementById(id);
  svg.replaceChildren();
  const box = svg.getBoundingClientRect();
  const w = Math.max(box.width, 300), h = Math.max(box.height, 150), L = 48, R = 8, T = 8, B = 34;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  // The x axis spans the data there is: from 2 up to 15 minutes.
  const now = Date.now();
  let first = now;
  lines.forEach(l => { if (l.points.length) first = Math.min(first, l.points[0][0]); });
  const span = Math.min(Math.max(now - first, 2 * 60000), WINDOW_MS), t0 = now - span;
  let max = 0;
  lines.forEach(l => l.points.forEach(p => { if (p[1] !== null && p[0] >= t0) max = Math.max(max, p[1]); }));
  max = max > 0 ? max * 1.1 : 1;
  const X = t => L + (t - t0) / span * (w - L - R), Y = v => T + (1 - v / max) * (h - T - B);
  svg.appendChild(el("svg:line", {class: "axis", x1: L, y1: h - B, x2: w - R, y2: h - B}));
  svg.appendChild(el("svg:line", {class: "axis", x1: L, y1: T, x2: L, y2: h - B}));
  [0, 0.5, 1].forEach(f => svg.appendChild(el("svg:text", {class: "tick", x: L - 4, y: Y(max * f) + 3,
                                                            "text-anchor": "end"}, fmt(max * f) + (unit || ""))));
  [1, 2 / 3, 1 / 3, 0].forEach(f => {
    const ago = span * f / 1000;
    const label = f ? "-" + (ago >= 120 ? (ago / 60).toFixed(0) + "m" : ago.toFixed(0) + "s") : "now";
    svg.appendChild(el("svg:text", {class: "tick", x: X(now - span * f), y: h - B + 12, "text-anchor": "middle"},
                       label));
  });
  let lx = L;
  lines.forEach(l => {
    let seg = [];
    const flush = () => {
      if (seg.length > 1) svg.appendChild(el("svg:polyline", {points: seg.join(" "), stroke: l.color,
                                             "stroke-dasharray": l.dash || "", "data-series": l.name}));
      // A point alone (a processor's only batch, one between gaps) is a dot: a line needs two, and it would vanish
      if (seg.length === 1) {
        const [cx, cy] = seg[0].split(",");
        svg.appendChild(el("svg:circle", {cx, cy, r: 2.5, fill: l.color, "data-series": l.name}));
      }
      seg = [];
    };
    l.points.forEach(p => {
      if (p[0] < t0) return;
      if (p[1] === null || p[1] === undefined) { flush(); return; }
      seg.push(X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1));
    });
    flush();
    const t = el("svg:text", {class: "legend", x: lx, y: h - 6, fill: l.color}, l.name);
    svg.appendChild(t);
    lx += Math.min(8 + 6 * l.name.length, 220);
  });
  if (!lines.length) svg.appendChild(el("svg:text", {class: "tick", x: w / 2, y: h / 2, "text-anchor": "middle"},
                                        "no data yet"));
}
function procKeys() {
  if (!overview) return [];
  const keys = Object.keys(overview.processors);
  return selected ? keys.filter(k => k === selected) : keys;
}
function lines(series, dash) {
  const out = [];
  procKeys().forEach((k, i) => series.forEach(([s, suffix, d]) => {
    const pts = store[k + "|" + s];
    if (pts && pts.length) out.push({name: (selected ? "" : overview.processors[k].name + " ") + suffix,
                                     color: PALETTE[i % PALETTE.length], points: pts, dash: d});
  }));
  return out;
}
function drawCharts() {
  drawChart("chart-rates", lines([["input_rate", "input", ""], ["processing_rate", "processed", "4 3"]]), "");
  drawChart("chart-lag", lines([["lag", "lag", ""]]), "");
  let fresh = [];
  if (!selected) {
    Object.keys(overview.outputs).forEach((o, i) => {
      const pts = store["output|" + o];
      if (pts && pts.length) fresh.push({name: o, color: PALETTE[i % PALETTE.length], points: pts});
    });
  }
  if (!fresh.length) fresh = lines([["freshness_s", "freshness", ""]]);
  drawChart("chart-freshness", fresh, "s");
  drawChart("chart-batch", lines([["batch_ms", "batch", ""]]), "");
  drawChart("chart-dlq", lines([["dlq", "dlq", ""], ["late", "late", "4 3"]]), "");
}

// -- tables and alerts ------------------------------------------------------------------------------------
function badge(health) {
  return el("span", {class: "badge", style: "background:" + (COLORS[health] || COLORS.unknown)}, health);
}
function row(cells, attrs) {
  const tr = el("tr", attrs);
  cells.forEach(c => {
    const td = el("td", c && c.num ? {class: "num"} : {});
    if (c instanceof Node) td.appendChild(c); else td.textContent = c && c.num ? c.text : (c === null ? "–" : c);
    tr.appendChild(td);
  });
  return tr;
}
const N = text => ({num: true, text});
function drawTables() {
  const tbody = document.querySelector("#processors tbody");
  tbody.replaceChildren();
  Object.entries(overview.processors).forEach(([k, p]) => {
    const tr = row([k, badge(p.health), N(fmt(p.lag)), N(fmt(p.lag_seconds)), N(fmt(p.input_rate)),
                    N(fmt(p.processing_rate)), N(fmt(p.freshness_s)), N(pct(p.dlq_rate)), N(pct(p.late_rate)),
                    N(dur(p.retention_left_s)), N(fmt(p.restarts)), N(fmt(p.failures_total))],
                   {class: "proc-row", "data-name": k, "data-health": p.health, title: p.health_reason || ""});
    tr.addEventListener("click", () => select(k === selected ? null : k));
    tbody.appendChild(tr);
  });
  const detail = document.getElementById("detail");
  detail.replaceChildren();
  if (selected && overview.processors[selected]) {
    const p = overview.processors[selected];
    const lines = [`${selected}: ${p.health} (${p.health_reason})`,
      `inputs: ${p.inputs.join(", ") || "–"}   outputs: ${p.outputs.join(", ") || "–"}`,
      `trigger ${fmt(p.trigger_ms)} ms; last batch ${p.last_batch ? p.last_batch.batch_id : "–"}; batch p50 ` +
        `${fmt(p.batch_ms_p50)} ms, p95 ${fmt(p.batch_ms_p95)} ms`,
      admission(p.last_batch),
      `violations ${p.violations_total} (in window ${p.violations_window}); lost offsets ${p.lost_offsets}`,
      p.silent_gaps === null ? "" : `audit: ${p.silent_gaps} silent gap(s)` +
        (p.gaps.length ? ` (${p.gaps.join(", ")})` : "") + `; ${p.counted_lost_offsets} counted lost offsets`,
      rebuilds(p.client_rebuilds),
      releases(p),
      p.last_error ? "last error: " + p.last_error : ""];
    detail.appendChild(el("pre", {}, lines.filter(Boolean).join("\n")));
  } else {
    detail.textContent = "click a processor for its details";
  }
  const out = document.querySelector("#outputs tbody");
  out.replaceChildren();
  Object.values(overview.outputs).forEach(o => out.appendChild(
    row([o.name, N(fmt(o.freshness_s)), o.writers.join(", ")], {"data-name": o.name})));
}
function drawTopics(topics) {
  const tbody = document.querySelector("#topics tbody");
  tbody.replaceChildren();
  Object.values(topics).forEach(t => tbody.appendChild(row(
    [t.name, N(Object.keys(t.partitions).length), N(fmt(t.records)), N(fmt(t.append_rate)),
     t.retention_ms === null ? "unlimited" : dur(t.retention_ms / 1000)], {"data-name": t.name})));
}
function drawViews(views) {
  const tbody = document.querySelector("#views tbody");
  tbody.replaceChildren();
  (views || []).forEach(v => tbody.appendChild(row(v.error ? [v.name, v.error, "", "", ""] :
    [v.name, v.key.join(", "), N(fmt(v.rows)), v.freshness.as_of || "nothing yet", N(fmt(v.freshness.lag_s))],
    {"data-name": v.name})));
}
function alertEl(a) {
  const d = el("div", {class: "alert " + a.status, "data-rule": a.rule, "data-target": a.target});
  d.appendChild(el("b", {}, a.status === "firing" ? "FIRING " : "resolved "));
  d.appendChild(el("span", {}, a.message));
  d.appendChild(el("div", {class: "muted"}, a.at));
  return d;
}
function drawAlerts(alerts) {
  const act = document.getElementById("alerts-active"), hist = document.getElementById("alerts-history");
  act.replaceChildren(...alerts.active.map(alertEl));
  if (!alerts.active.length) act.appendChild(el("div", {class: "muted"}, "none"));
  hist.replaceChildren(...alerts.history.slice(0, 50).map(alertEl));
  const unknown = alerts.rules.filter(r => r.status === "unknown_target");
  unknown.forEach(r => hist.prepend(el("div", {class: "muted"}, `rule ${r.name}: no ${r.target} yet`)));
}
function select(key) {
  selected = key;
  document.getElementById("selected").textContent = key || "all processors";
  if (overview) { drawTopology(overview.topology); drawTables(); drawCharts(); }
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const query = arrival ? "after=" + arrival : "since=" + (Date.now() - WINDOW_MS);
    const [ov, series, alerts, topics] = await Promise.all([get("api/overview"), get("api/series?" + query),
                                                            get("api/alerts"), get("api/topics")]);
    overview = ov;
    // A monitor restarted since the last answer numbers arrivals from 1 again: ask for the whole window.
    arrival = started === null || series.started_ms === started ? series.arrival : 0;
    started = series.started_ms;
    Object.entries(series.processors).forEach(([k, s]) => Object.entries(s).forEach(([n, pts]) => {
      merge(k + "|" + n, pts);
    }));
    Object.entries(series.outputs).forEach(([o, pts]) => merge("output|" + o, pts));
    const b = document.getElementById("broker");
    b.dataset.reachable = String(ov.broker.reachable);
    b.textContent = ov.broker.reachable ? "broker reachable" : ov.broker.reachable === false
      ? "broker unreachable" + (ov.broker.error ? ": " + ov.broker.error.slice(0, 60) : "") : "broker ?";
    document.getElementById("health-summary").textContent =
      Object.entries(ov.health).map(([h, n]) => `${n} ${h}`).join(", ") || "no processors yet";
    if (selected && !ov.processors[selected]) selected = null;
    drawTopology(ov.topology);
    drawTables();
    drawCharts();
    drawTopics(topics);
    drawViews(ov.views);
    drawAlerts(alerts);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    status.textContent = ""; status.className = "";
  } catch (e) {
    status.textContent = "cannot reach the monitor: " + e.message; status.className = "error";
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
