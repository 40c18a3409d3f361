// tunefleet dashboard: draws the three pages from the JSON API and keeps them live by polling.
// No libraries: charts are hand-written SVG. Every value from the database goes into the page
// as text (textContent / SVG attributes), never as HTML.
"use strict";

const REFRESH_MS =
  1000 * (parseFloat(document.querySelector('meta[name="tunefleet-refresh"]').content) || 2);
const STATES = ["done", "running", "pending", "invalid", "failed", "timed_out", "cancelled"];
const SVGNS = "http://www.w3.org/2000/svg";
const main = document.getElementById("main");
const statusEl = document.getElementById("status");
let updates = 0;

// --- small helpers ------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) if (c) node.append(c);
  return node;
}

function gflops(v) {
  if (v === null || v === undefined) return "-";
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2);
}

// What a run's best figure is, after it (as the CLI writes it): nothing once confirmed.
function bestMark(status) {
  if (!status || status === "confirmed") return "";
  return status === "not reproduced" ? " (NOT reproduced)" : ` (${status})`;
}

function secs(v) {
  if (v === null || v === undefined) return "-";
  if (v < 1e-3) return (v * 1e6).toFixed(1) + " µs";
  if (v < 1) return (v * 1e3).toFixed(2) + " ms";
  return v.toFixed(2) + " s";
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

function num(v) { return v === null || v === undefined ? "-" : String(v); }
function pct(v) { return v === null || v === undefined ? "-" : `${Math.round(100 * v)}%`; }
function argsText(a) {
  return Object.entries(a || {}).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
}
function configText(c) {
  return Object.entries(c || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
}
function failedAll(r) { return (r.invalid || 0) + (r.failed || 0) + (r.timed_out || 0); }
// What --max-trials counts: configurations the rules rejected before any worker saw them
// (ruled_out, inside invalid) cost no evaluation.
function finished(r) { return (r.done || 0) + failedAll(r) - (r.ruled_out || 0); }

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (!r.ok) throw new ApiError(r.status, (data && data.error) || `${r.status} ${r.statusText}`);
  return data;
}

function setStatus(text, error) {
  statusEl.textContent = text;
  statusEl.classList.toggle("error", !!error);
}

// Calls fn now and then every REFRESH_MS (skipped while the tab is hidden); one call at a time.
function poll(fn) {
  const tick = async () => {
    if (!document.hidden) {
      try {
        await fn();
        updates += 1;
        document.body.dataset.updates = String(updates);
        setStatus(`live · updated ${new Date().toLocaleTimeString()}`, false);
      } catch (e) {
        setStatus(e.status === 404 ? e.message : `not updated: ${e.message}`, true);
        if (e.status === 404 || e.status === 401) return;  // waiting will not fix these
      }
    }
    setTimeout(tick, REFRESH_MS);
  };
  tick();
}

// The page is drawn: a mark for tests and for the page-load benchmark (performance entries).
function ready() {
  if (!document.body.dataset.ready) performance.mark("tunefleet-ready");
  document.body.dataset.ready = "1";
}

function stateBar(r, big) {
  const total = STATES.reduce((s, k) => s + (r[k] || 0), 0);
  const bar = el("div", { class: big ? "bar big" : "bar", title: STATES.map((k) => `${k} ${r[k] || 0}`).join(", ") });
  if (total > 0) {
    for (const k of STATES) {
      if (!r[k]) continue;
      const part = el("span", { class: `s-${k}` });
      part.style.width = `${(100 * r[k]) / total}%`;
      bar.append(part);
    }
  }
  return bar;
}

function legend() {
  return el("div", { class: "legend" }, STATES.map((k) => el("span", {}, el("i", { class: `s-${k}` }), k.replace("_", " "))));
}

function table(columns, rows, opts) {
  opts = opts || {};
  const head = el("tr", {}, columns.map((c) => {
    const th = el("th", { class: [c.num ? "num" : "", c.sort ? "sortable" : "", opts.sort && c.sort === opts.sort ? `sorted ${opts.order}` : ""].join(" ").trim() || null, text: c.title });
    if (c.sort && opts.onSort) th.addEventListener("click", () => opts.onSort(c.sort));
    if (c.sort) th.dataset.sort = c.sort;
    return th;
  }));
  const body = el("tbody", {}, rows.map((row) => {
    const tr = el("tr", { class: opts.onRow ? "clickable" : null }, columns.map((c) => {
      const v = c.value(row);
      return el("td", { class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null }, v instanceof Node ? v : String(v));
    }));
    if (opts.rowId) tr.dataset.id = String(opts.rowId(row));
    if (opts.onRow) tr.addEventListener("click", () => opts.onRow(row));
    return tr;
  }));
  return el("table", {}, el("thead", {}, head), body);
}

// --- charts (SVG) -------------------------------------------------------------------------

// Round tick values from lo to hi, about n of them (whole numbers only when integer is set).
function ticks(lo, hi, n, integer) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

const W = 560, H = 240, PAD = { l: 56, r: 26, t: 12, b: 38 };

function frame(xLabel, yLabel, xs, ys, xFmt, yFmt, yInteger, xInteger) {
  const g = svg("g");
  const sx = (v) => PAD.l + ((v - xs[0]) / (xs[1] - xs[0] || 1)) * (W - PAD.l - PAD.r);
  const sy = (v) => H - PAD.b - ((v - ys[0]) / (ys[1] - ys[0] || 1)) * (H - PAD.t - PAD.b);
  for (const t of ticks(ys[0], ys[1], 4, yInteger)) {
    g.append(svg("line", { class: "grid-line", x1: PAD.l, x2: W - PAD.r, y1: sy(t), y2: sy(t) }));
    g.append(svg("text", { x: PAD.l - 6, y: sy(t) + 4, "text-anchor": "end", text: yFmt(t) }));
  }
  for (const t of ticks(xs[0], xs[1], 5, xInteger)) {
    g.append(svg("text", { x: sx(t), y: H - PAD.b + 15, "text-anchor": "middle", text: xFmt(t) }));
  }
  g.append(svg("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }));
  g.append(svg("line", { class: "axis", x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: H - PAD.b }));
  g.append(svg("text", { x: (PAD.l + W - PAD.r) / 2, y: H - 4, "text-anchor": "middle", text: xLabel }));
  g.append(svg("text", { x: 12, y: (PAD.t + H - PAD.b) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(PAD.t + H - PAD.b) / 2})`, text: yLabel }));
  return { g, sx, sy };
}

// The best-so-far step curve: points are (x, best) at each improvement, held until xEnd.
function stepChart(points, key, xEnd, xLabel, xFmt, xInteger) {
  const box = el("div", { class: "chart" });
  if (!points.length) { box.append(el("div", { class: "empty", text: "no successful trial yet" })); return box; }
  const xmax = Math.max(xEnd || 0, ...points.map((p) => p[key])) || 1;
  const ymax = Math.max(...points.map((p) => p.gflops));
  const f = frame(xLabel, "best GFLOP/s", [0, xmax], [0, ymax * 1.08], xFmt, gflops, false, xInteger);
  let d = "";
  points.forEach((p, i) => {
    const x = f.sx(p[key]), y = f.sy(p.gflops);
    d += i === 0 ? `M${x},${y}` : `H${x}V${y}`;
  });
  d += `H${f.sx(xmax)}`;
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, f.g, svg("path", { class: "curve", d }));
  for (const p of points) s.append(svg("circle", { class: "dot", cx: f.sx(p[key]), cy: f.sy(p.gflops), r: 2.5 }, svg("title", { text: `trial ${p.trial_id}: ${gflops(p.gflops)} GFLOP/s` })));
  box.append(s);
  return box;
}

function histogram(bins) {
  const box = el("div", { class: "chart" });
  if (!bins.length) { box.append(el("div", { class: "empty", text: "no measured speeds yet" })); return box; }
  const lo = bins[0].low, hi = bins[bins.length - 1].high;
  const top = Math.max(...bins.map((b) => b.trials), 1);
  const f = frame("GFLOP/s", "trials", [lo, hi], [0, top * 1.1], gflops, (v) => String(Math.round(v)), true);
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, f.g);
  for (const b of bins) {
    if (!b.trials) continue;
    const x0 = f.sx(b.low), x1 = f.sx(b.high), y = f.sy(b.trials);
    s.append(svg("rect", { class: "hbar", x: x0 + 0.5, y, width: Math.max(x1 - x0 - 1, 1), height: H - PAD.b - y }, svg("title", { text: `${gflops(b.low)}–${gflops(b.high)} GFLOP/s: ${b.trials}` })));
  }
  box.append(s);
  return box;
}

function timeline(workers, nbins) {
  const box = el("div", { class: "chart" });
  if (!workers.length) { box.append(el("div", { class: "empty", text: "no worker has held a trial of this run yet" })); return box; }
  const row = 22, left = 150, right = 60, h = 20 + workers.length * row + 24;
  const s = svg("svg", { viewBox: `0 0 ${W} ${h}`, role: "img" });
  const span = workers[0].span_s, cw = (W - left - right) / nbins;
  workers.forEach((w, i) => {
    const y = 10 + i * row;
    s.append(svg("text", { x: left - 8, y: y + 14, "text-anchor": "end", text: `${w.host} ${String(w.worker_id).slice(0, 8)}` }));
    s.append(svg("rect", { x: left, y: y + 2, width: W - left - right, height: row - 6, fill: "#eef0f3" }));
    w.busy.forEach((b, j) => {
      if (b <= 0) return;
      s.append(svg("rect", { class: "busy", x: left + j * cw, y: y + 2, width: cw + 0.3, height: row - 6, "fill-opacity": Math.max(0.12, b).toFixed(3) }));
    });
    s.append(svg("text", { x: W - right + 6, y: y + 14, text: pct(w.busy_share) }));
  });
  const yAxis = 10 + workers.length * row + 12;
  for (const t of ticks(0, span, 5)) {
    s.append(svg("text", { x: left + (t / span) * (W - left - right), y: yAxis, "text-anchor": "middle", text: duration(t) }));
  }
  box.append(s);
  return box;
}

// --- parameter importance -----------------------------------------------------------------

// The share a report gives a parameter for speed: the forest's where it was fitted.
function speedShare(rep, p) { return rep.forest.fitted ? p.speed.forest : p.speed.variance; }

// Bars: each parameter's importance for speed and for validity (0-100 %).
function importanceBars(rep) {
  const box = el("div", { class: "chart" });
  const ps = rep.parameters;
  if (!ps.length) { box.append(el("div", { class: "empty", text: "no parameters" })); return box; }
  const w = 380, row = 22, left = 96, right = 64, h = 24 + ps.length * row;
  const s = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img" });
  const sx = (v) => left + v * (w - left - right);
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    s.append(svg("line", { class: "grid-line", x1: sx(t), x2: sx(t), y1: 4, y2: h - 18 }));
    s.append(svg("text", { x: sx(t), y: h - 4, "text-anchor": "middle", text: `${t * 100}%` }));
  }
  ps.forEach((p, i) => {
    const y = 6 + i * row, sp = speedShare(rep, p), va = p.validity.variance;
    s.append(svg("text", { x: left - 8, y: y + 13, "text-anchor": "end", text: p.name }));
    s.append(svg("rect", { class: "imp-speed", x: left, y, width: Math.max((sp || 0) * (w - left - right), 0.5), height: 8 },
      svg("title", { text: `${p.name}: speed ${pct(sp)}` })));
    s.append(svg("rect", { class: "imp-validity", x: left, y: y + 9, width: Math.max((va || 0) * (w - left - right), 0.5), height: 8 },
      svg("title", { text: `${p.name}: validity ${pct(va)}` })));
    s.append(svg("text", { x: sx(Math.max(sp || 0, va || 0)) + 4, y: y + 13, text: `${pct(sp)} · ${pct(va)}` }));
  });
  box.append(s);
  return box;
}

// One parameter's speed per value: a box (quartiles), whiskers (best and worst measured) and
// the median of its measured configurations, on a log axis; under each value its count and
// failure rate.
function sliceChart(p, useGflops) {
  const box = el("div", { class: "chart slice", "data-param": p.name });
  const key = useGflops ? "gflops" : "time_s";
  const vals = p.values, measured = vals.filter((v) => v[key]);
  const w = 280, h = 200, pad = { l: 44, r: 8, t: 8, b: 44 };
  const s = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img" });
  if (!measured.length) { box.append(el("div", { class: "empty", text: "nothing measured" })); return box; }
  const scale = useGflops ? 1 : 1e3;
  let lo = Math.min(...measured.map((v) => v[key].min)) * scale, hi = Math.max(...measured.map((v) => v[key].max)) * scale;
  if (!(hi > lo)) { lo /= 1.5; hi *= 1.5; }
  const L = (v) => Math.log10(v), sy = (v) => h - pad.b - ((L(v) - L(lo)) / (L(hi) - L(lo))) * (h - pad.t - pad.b);
  const band = (w - pad.l - pad.r) / vals.length;
  for (const t of [lo, Math.sqrt(lo * hi), hi]) {
    s.append(svg("line", { class: "grid-line", x1: pad.l, x2: w - pad.r, y1: sy(t), y2: sy(t) }));
    s.append(svg("text", { x: pad.l - 4, y: sy(t) + 4, "text-anchor": "end", text: useGflops ? gflops(t) : `${t.toPrecision(2)}` }));
  }
  s.append(svg("text", { x: 10, y: (h - pad.b + pad.t) / 2, "text-anchor": "middle", transform: `rotate(-90 10 ${(h - pad.b + pad.t) / 2})`, text: useGflops ? "GFLOP/s" : "ms" }));
  vals.forEach((v, i) => {
    const cx = pad.l + band * (i + 0.5), bw = Math.min(band * 0.6, 26);
    const label = v.label.length > 8 ? v.label.slice(0, 7) + "…" : v.label;
    s.append(svg("text", { x: cx, y: h - pad.b + 13, "text-anchor": "middle", text: label }, svg("title", { text: v.label })));
    s.append(svg("text", { class: "count", x: cx, y: h - pad.b + 26, "text-anchor": "middle", text: `n=${v.trials}` }));
    if (v.fail_rate) s.append(svg("text", { class: "fail", x: cx, y: h - pad.b + 38, "text-anchor": "middle", "data-rate": pct(v.fail_rate), text: pct(v.fail_rate) }, svg("title", { text: `${v.trials - v.measured} of ${v.trials} gave no time` })));
    const q = v[key];
    if (!q) return;
    const g = svg("g", { class: "box" }, svg("title", { text: `${p.name}=${v.label}: ${v.measured} measured of ${v.trials}; best ${useGflops ? gflops(q.max) + " GFLOP/s" : secs(q.min)}, median ${useGflops ? gflops(q.median) + " GFLOP/s" : secs(q.median)}` }));
    g.append(svg("line", { class: "whisker", x1: cx, x2: cx, y1: sy(q.min * scale), y2: sy(q.max * scale) }));
    const y1 = sy(q.q3 * scale), y2 = sy(q.q1 * scale);
    g.append(svg("rect", { class: "iqr", x: cx - bw / 2, y: Math.min(y1, y2), width: bw, height: Math.max(Math.abs(y2 - y1), 1.5) }));
    g.append(svg("line", { class: "median", x1: cx - bw / 2, x2: cx + bw / 2, y1: sy(q.median * scale), y2: sy(q.median * scale) }));
    s.append(g);
  });
  box.append(s);
  return box;
}

// Parallel coordinates: an axis per parameter (most important first, values in order) and
// the speed last; the top N configurations drawn over a sample of the rest.
function parallelChart(rep) {
  const box = el("div", { class: "chart" });
  const t = rep.top, names = t.order;
  if (!t.lines.length || !names.length) { box.append(el("div", { class: "empty", text: "no measured configuration yet" })); return box; }
  const values = Object.fromEntries(rep.parameters.map((p) => [p.name, p.values]));
  const w = 1100, h = 300, pad = { l: 30, r: 70, t: 14, b: 40 };
  const s = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img" });
  const axes = names.length + 1, dx = (w - pad.l - pad.r) / (axes - 1 || 1);
  const speed = (ln) => (ln.gflops !== null && ln.gflops !== undefined ? ln.gflops : 1 / ln.median_s);
  const all = t.rest.concat(t.lines).map(speed);
  const lo = Math.min(...all), hi = Math.max(...all), span = hi - lo || 1;
  const sy = (f) => h - pad.b - f * (h - pad.t - pad.b);
  const ys = (ln) => ln.codes.map((c, i) => { const k = values[names[i]].length; return k > 1 ? c / (k - 1) : 0.5; }).concat([(speed(ln) - lo) / span]);
  const path = (ln) => ys(ln).map((f, i) => `${i ? "L" : "M"}${(pad.l + i * dx).toFixed(1)},${sy(f).toFixed(1)}`).join("");
  const rest = svg("g", { class: "pc-rest" }), top = svg("g", { class: "pc-top" });
  for (const ln of t.rest) rest.append(svg("path", { d: path(ln) }));
  for (const ln of t.lines) top.append(svg("path", { d: path(ln) }, svg("title", { text: `trial ${ln.trial_id}: ${ln.gflops !== null ? gflops(ln.gflops) + " GFLOP/s" : secs(ln.median_s)}` })));
  s.append(rest, top);
  names.forEach((n, i) => {
    const x = pad.l + i * dx, k = values[n].length;
    s.append(svg("line", { class: "axis", x1: x, x2: x, y1: sy(0), y2: sy(1) }));
    s.append(svg("text", { class: "pc-name", x, y: h - pad.b + 16, "text-anchor": "middle", text: n }));
    values[n].forEach((v, c) => s.append(svg("text", { class: "pc-value", x: x + 4, y: sy(k > 1 ? c / (k - 1) : 0.5) + 3, text: v.label.length > 10 ? v.label.slice(0, 9) + "…" : v.label })));
  });
  const xs = pad.l + names.length * dx, unit = t.lines[0].gflops !== null ? "GFLOP/s" : "1/s";
  s.append(svg("line", { class: "axis", x1: xs, x2: xs, y1: sy(0), y2: sy(1) }));
  s.append(svg("text", { class: "pc-name", x: xs, y: h - pad.b + 16, "text-anchor": "middle", text: `speed (${unit})` }));
  for (const f of [0, 0.5, 1]) s.append(svg("text", { class: "pc-value", x: xs + 4, y: sy(f) + 3, text: gflops(lo + f * span) }));
  box.append(s);
  return box;
}

function importanceText(rep) {
  const f = rep.forest, scope = rep.scope;
  const runs = scope.all_runs ? `runs ${scope.runs.map((r) => "#" + r).join(", ")} (every run of this cache key)` : "this run";
  const counts = `${rep.trials} finished configurations of ${runs}: ${rep.measured} measured, ${rep.invalid} invalid, ${rep.failed + rep.timed_out} failed or timed out.`;
  const how = f.fitted
    ? ` Forest of ${f.trees} trees on ${f.fitted_on} measured configurations, out-of-bag R² ${f.oob_r2.toFixed(2)}${f.oob_r2 < 0.5 ? " (low: read it with care)" : ""}; interactions ${pct(f.interactions)}.`
    : " Speed: share of the variance of log time between a parameter's values (corrected for chance). Validity: the same for the share of configurations that gave no time.";
  return counts + how;
}

// --- pages --------------------------------------------------------------------------------

function runsPage() {
  document.getElementById("nav-runs").classList.add("active");
  document.title = "Runs · tunefleet";
  const holder = el("div", { class: "panel", id: "runs" });
  main.replaceChildren(el("h1", { text: "Runs" }), el("div", { class: "sub", text: "every tuning run of this database, newest first" }), holder);
  poll(async () => {
    const data = await api("/api/runs");
    if (!data.runs.length) {
      holder.replaceChildren(el("div", { class: "empty", text: "no runs yet: start one with `tunefleet tune`" }));
    } else {
      holder.replaceChildren(table([
        { title: "Run", value: (r) => el("a", { href: `/runs/${r.run_id}`, text: `#${r.run_id}` }) },
        { title: "Problem", value: (r) => `${r.problem} ${argsText(r.problem_args)}`.trim() },
        { title: "Name", value: (r) => r.name || "" },
        { title: "Device class", value: (r) => r.device_class },
        { title: "State", value: (r) => el("span", { class: `badge ${r.run_state}`, text: r.run_state }) },
        { title: "Progress", value: (r) => stateBar(r, false) },
        { title: "Finished", num: true, value: (r) => r.max_trials ? `${finished(r)} / ${r.max_trials}` : finished(r) },
        { title: "Running", num: true, value: (r) => r.running },
        { title: "Pending", num: true, value: (r) => r.pending },
        { title: "Failed", num: true, value: failedAll },
        { title: "Best GFLOP/s", num: true, value: (r) => gflops(r.best_gflops) + bestMark(r.best_status) },
        { title: "Eval/min", num: true, value: (r) => (r.evaluations_per_minute || 0).toFixed(1) },
        { title: "Live workers", num: true, value: (r) => r.live_workers },
        { title: "Elapsed", num: true, value: (r) => duration(r.elapsed_s) },
      ], data.runs, { rowId: (r) => r.run_id }));
    }
    ready();
  });
}

function card(key, label, value) {
  return el("div", { class: "card", id: `card-${key}` }, el("div", { class: "k", text: label }), el("div", { class: "v", id: `count-${key}`, text: value }));
}

// A query parameter of the page's address, if it is one of the choices (else the first).
function params0(name, choices) {
  const v = new URLSearchParams(location.search).get(name);
  return choices.includes(v) ? v : choices[0];
}

function runPage(runId) {
  document.getElementById("nav-runs").classList.add("active");
  document.title = `Run ${runId} · tunefleet`;
  const head = el("div", { id: "run-head" });
  const cards = el("div", { class: "cards", id: "cards" });
  const states = el("div", { class: "panel", id: "states" });
  const bestBox = el("div", { class: "panel", id: "best" });
  const chartTime = el("div", { class: "panel", id: "chart-time" });
  const chartEvals = el("div", { class: "panel", id: "chart-evals" });
  const chartHist = el("div", { class: "panel", id: "chart-histogram" });
  const chartWorkers = el("div", { class: "panel", id: "chart-timeline" });
  const failures = el("div", { class: "panel", id: "failures" });
  const configs = el("div", { class: "panel", id: "configurations" });
  const importanceBox = el("div", { class: "panel", id: "importance" });
  const slices = el("div", { class: "panel", id: "slices" });
  const parallel = el("div", { class: "panel", id: "parallel" });
  const trialBox = el("div", { class: "panel", id: "trial", hidden: true });
  main.replaceChildren(head, cards, states, trialBox, bestBox,
    el("div", { class: "grid" }, chartTime, chartEvals, chartHist, chartWorkers), el("div", { class: "spacer" }),
    importanceBox, slices, parallel, failures, configs);
  const impState = { scope: params0("scope", ["run", "key"]), method: params0("method", ["variance", "forest"]), top: 10 };
  let impSeq = 0;

  const tableState = { sort: "gflops", order: "desc", offset: 0, limit: 50 };
  let lastKey = null, summary = null;
  const params = new URLSearchParams(location.search);
  let openTrial = params.get("trial");

  async function loadTable() {
    const q = new URLSearchParams({ sort: tableState.sort, order: tableState.order, limit: tableState.limit, offset: tableState.offset });
    const data = await api(`/api/runs/${runId}/trials?${q}`);
    const onSort = (key) => {
      if (tableState.sort === key) tableState.order = tableState.order === "desc" ? "asc" : "desc";
      else { tableState.sort = key; tableState.order = key === "gflops" || key === "gbps" ? "desc" : "asc"; }
      tableState.offset = 0;
      loadTable().catch((e) => setStatus(e.message, true));
    };
    const rows = data.trials;
    const t = table([
      { title: "Trial", sort: "trial_id", num: true, value: (r) => r.trial_id },
      { title: "State", sort: "state", value: (r) => el("span", { class: `badge ${r.state}`, text: r.state }) },
      { title: "GFLOP/s", sort: "gflops", num: true, value: (r) => gflops(r.gflops) },
      { title: "Median", sort: "median_s", num: true, value: (r) => secs(r.median_s) },
      { title: "Min", sort: "min_s", num: true, value: (r) => secs(r.min_s) },
      { title: "GB/s", sort: "gbps", num: true, value: (r) => gflops(r.gbps) },
      { title: "Compile", sort: "compile_s", num: true, value: (r) => secs(r.compile_s) },
      { title: "Worker", value: (r) => r.worker_host || "-" },
      { title: "Configuration", cls: "config", value: (r) => configText(r.config) },
    ], rows, { sort: data.sort, order: data.order, onSort, rowId: (r) => r.trial_id, onRow: (r) => showTrial(r.trial_id) });
    const last = Math.min(data.offset + rows.length, data.total);
    const pager = el("div", { class: "pager" },
      el("button", { text: "‹ previous", disabled: data.offset === 0, onclick: () => { tableState.offset = Math.max(0, data.offset - data.limit); loadTable(); } }),
      el("span", { id: "pager-text", text: rows.length ? `${data.offset + 1}–${last} of ${data.total}` : `0 of ${data.total}` }),
      el("button", { text: "next ›", disabled: last >= data.total, onclick: () => { tableState.offset = data.offset + data.limit; loadTable(); } }));
    configs.replaceChildren(el("h2", { text: "Configurations (click a column to sort, a row for its code)" }),
      rows.length ? t : el("div", { class: "empty", text: "no finished trial yet" }), pager);
  }

  async function showTrial(trialId) {
    openTrial = String(trialId);
    const url = new URL(location.href);
    url.searchParams.set("trial", openTrial);
    history.replaceState(null, "", url);
    const data = await api(`/api/runs/${runId}/trials/${trialId}`);
    const t = data.trial;
    const rows = [
      ["State", el("span", { class: `badge ${t.state}`, text: t.state })],
      ["Purpose", t.purpose + (t.confirms_trial_id ? ` of trial ${t.confirms_trial_id}` : "")],
      ["Source", t.source],
      ["Attempt", `${t.attempt} of ${t.max_attempts}`],
      ["GFLOP/s", gflops(t.gflops)], ["GB/s", gflops(t.gbps)],
      ["Median / min", `${secs(t.median_s)} / ${secs(t.min_s)}`],
      ["Samples", t.samples_s ? t.samples_s.map(secs).join(", ") : "-"],
      ["Compile", secs(t.compile_s)],
      ["Validation", t.validation ? JSON.stringify(t.validation) : "-"],
      ["Device", t.device_name ? `${t.device_name} (driver ${t.driver_version || "-"})` : "-"],
      ["Worker", t.worker_host ? `${t.worker_host} ${String(t.worker_id).slice(0, 8)}` : "-"],
      ["Error", t.error || "-"],
    ];
    trialBox.hidden = false;
    trialBox.replaceChildren(
      el("button", { class: "close", text: "close", onclick: () => { trialBox.hidden = true; openTrial = null; const u = new URL(location.href); u.searchParams.delete("trial"); history.replaceState(null, "", u); } }),
      el("h2", { text: `Trial ${t.trial_id}` }),
      el("dl", { class: "kv" }, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)])),
      el("h2", { text: "Configuration" }), el("pre", { class: "cmd", id: "trial-config", text: JSON.stringify(t.config, null, 1) }),
      el("h2", { text: "Reproduce" }), el("pre", { class: "cmd", id: "trial-reproduce", text: data.reproduce }),
      el("h2", { text: "Generated code" }),
      t.code ? el("pre", { id: "trial-code", text: t.code }) : el("div", { class: "empty", id: "trial-code", text: "no code stored for this trial" }));
    for (const tr of configs.querySelectorAll("tbody tr")) tr.classList.toggle("selected", tr.dataset.id === openTrial);
  }

  async function loadImportance() {
    const seq = ++impSeq;
    const q = new URLSearchParams({ scope: impState.scope, method: impState.method, top: impState.top });
    if (impState.method === "forest" && !importanceBox.dataset.method) importanceBox.dataset.loading = "1";
    const data = await api(`/api/runs/${runId}/importance?${q}`);
    if (seq !== impSeq) return;  // a newer choice is on its way
    delete importanceBox.dataset.loading;
    const rep = data.importance;
    const pick = (name, options, labels) => el("select", { id: `importance-${name}`, onchange: (e) => {
      impState[name] = e.target.value;
      const u = new URL(location.href); u.searchParams.set(name, e.target.value); history.replaceState(null, "", u);
      importanceBox.dataset.method = "";
      loadImportance().catch((err) => setStatus(err.message, true));
    } }, options.map((o, i) => el("option", { value: o, selected: impState[name] === o, text: labels[i] })));
    const controls = el("div", { class: "controls" },
      el("label", {}, "trials of ", pick("scope", ["run", "key"], ["this run", "every run of its cache key"])),
      el("label", {}, "method ", pick("method", ["variance", "forest"], ["variance between values (NumPy)", data.forest_missing ? "forest (needs scikit-learn)" : "random forest (fANOVA)"])));
    const heading = el("h2", { text: "Parameter importance: what decides the speed, what makes configurations fail" });
    if (!rep) {
      importanceBox.replaceChildren(heading, controls, el("div", { class: "empty", id: "importance-missing", text: data.forest_missing }));
      importanceBox.dataset.method = "none";
      return;
    }
    const useGflops = rep.parameters.every((p) => p.values.every((v) => !v.measured || v.gflops));
    const best = (p) => { const m = p.values.filter((v) => v.time_s); if (!m.length) return "-"; const v = m.reduce((a, b) => (b.time_s.median < a.time_s.median ? b : a)); return `${v.label} (${secs(v.time_s.median)})`; };
    const failing = (p) => { const m = p.values.filter((v) => v.fail_rate); if (!m.length) return "-"; const v = m.reduce((a, b) => (b.fail_rate > a.fail_rate ? b : a)); return `${v.label} (${pct(v.fail_rate)} of ${v.trials})`; };
    const cols = [
      { title: "Parameter", value: (p) => p.name },
      { title: "Values", num: true, value: (p) => p.values.length },
    ];
    if (rep.forest.fitted) cols.push({ title: "Speed (forest)", num: true, value: (p) => pct(p.speed.forest) });
    cols.push({ title: "Speed (variance)", num: true, value: (p) => pct(p.speed.variance) },
      { title: "Validity", num: true, value: (p) => pct(p.validity.variance) },
      { title: "Fastest value (median)", value: best }, { title: "Most failing", value: failing });
    importanceBox.replaceChildren(heading, controls,
      el("div", { class: "sub", id: "importance-summary", text: importanceText(rep) }),
      el("div", { class: "imp-grid" }, el("div", {}, importanceBars(rep), el("div", { class: "legend" }, el("span", {}, el("i", { class: "imp-speed" }), "speed"), el("span", {}, el("i", { class: "imp-validity" }), "validity"))),
        el("div", { class: "scroll" }, table(cols, rep.parameters, { rowId: (p) => p.name }))));
    importanceBox.dataset.method = rep.method;
    slices.replaceChildren(el("h2", { text: `Speed per value: ${useGflops ? "GFLOP/s" : "median time"} of the measured configurations (log scale: box the middle half, whiskers best and worst); under each value n finished and, in purple, the share that gave no time` }),
      rep.parameters.length ? el("div", { class: "slices" }, rep.parameters.map((p) => el("div", { class: "slice-box" }, el("h3", { text: `${p.name} · ${pct(speedShare(rep, p))}` }), sliceChart(p, useGflops)))) : el("div", { class: "empty", text: "no parameters" }));
    parallel.replaceChildren(el("h2", { text: `The ${rep.top.n} fastest configurations (orange) against ${rep.top.rest.length} of the other ${rep.top.rest_total} measured (grey)` }), parallelChart(rep));
  }

  async function loadTimeline() {
    const t = await api(`/api/runs/${runId}/timeline`);
    chartWorkers.replaceChildren(el("h2", { text: "Workers: share of time holding a trial" }), timeline(t.timeline, t.timeline_bins));
  }

  async function loadCharts(s) {
    const c = await api(`/api/runs/${runId}/charts`);
    chartTime.replaceChildren(el("h2", { text: "Best so far, against time" }), stepChart(c.best_so_far, "elapsed_s", s.elapsed_s, "time since the run started", duration));
    chartEvals.replaceChildren(el("h2", { text: "Best so far, against evaluations" }), stepChart(c.best_so_far, "n", finished(s), "evaluations", (v) => String(Math.round(v)), true));
    chartHist.replaceChildren(el("h2", { text: "Distribution of measured speeds" }), histogram(c.histogram));
    failures.replaceChildren(el("h2", { text: "Failure reasons" }), c.failures.length ? table([
      { title: "State", value: (r) => el("span", { class: `badge ${r.state}`, text: r.state }) },
      { title: "Trials", num: true, value: (r) => r.trials },
      { title: "Reason", cls: "reason", value: (r) => r.error },
      { title: "First", num: true, value: (r) => r.first_trial },
      { title: "Last", num: true, value: (r) => r.last_trial },
    ], c.failures, { onRow: (r) => showTrial(r.first_trial) }) : el("div", { class: "empty", text: "no failed, invalid or timed-out trial" }));
  }

  async function loadBest() {
    drawBest((await api(`/api/runs/${runId}/best`)).best);
  }

  function drawSummary(s) {
    const title = el("h1", {}, `Run ${s.run_id}: ${s.problem} `, el("span", { class: "muted", text: argsText(s.problem_args) }), " ",
      el("span", { class: `badge ${s.run_state}`, id: "run-state", text: s.run_state }));
    const sub = el("div", { class: "sub" }, `device class ${s.device_class}`,
      s.name ? ` · ${s.name}` : "", s.stop_reason ? ` · stopped: ${s.stop_reason}` : "",
      s.max_trials ? ` · budget ${s.max_trials} trials` : "", s.max_seconds ? ` · ${duration(s.max_seconds)}` : "",
      s.coordinator_age_s !== null && s.run_state === "running" ? ` · coordinator heartbeat ${duration(s.coordinator_age_s)} ago` : "",
      s.standing_aside ? ` · ${s.standing_aside} worker(s) stand aside` : "");
    head.replaceChildren(title, sub);
    cards.replaceChildren(
      card("finished", "finished", finished(s)), card("done", "done", s.done), card("running", "running", s.running),
      card("pending", "pending", s.pending), card("invalid", "invalid", s.invalid), card("failed", "failed", s.failed),
      card("timed_out", "timed out", s.timed_out), card("cached", "from cache", s.cached),
      card("best", "best GFLOP/s" + bestMark(s.best_status), gflops(s.best_gflops)), card("rate", "eval / min", (s.evaluations_per_minute || 0).toFixed(1)),
      card("timing", "device timing", pct(s.timing_share)),
      card("workers", "live workers", s.live_workers), card("elapsed", "elapsed", duration(s.elapsed_s)));
    states.replaceChildren(el("h2", { text: `Trials by state (${s.trials})` }), stateBar(s, true), legend());
  }

  function drawBest(best) {
    if (!best) {
      bestBox.replaceChildren(el("h2", { text: "Best configuration" }), el("div", { class: "empty", text: "no successful trial yet" }));
    } else {
      const verdict = best.same_source === false ? ", DISAGREES: its cold build generated other code" : best.disagrees ? ", DISAGREES" : best.disagrees === false ? ", agrees" : ", not judged yet";
      const how = best.cold_build ? "cold re-measurement" : "re-measurement";
      const confirmed = best.confirmed ? `${how} at ${gflops(best.confirmed_gflops)} GFLOP/s (spread ${pct(best.spread)}${verdict})` : best.confirm_trial_id ? "re-measurement did not confirm it" : "not re-measured";
      // The figure every report quotes: the re-measurement's once it finished, else the search's.
      const status = best.disagrees ? "not reproduced" : best.confirmed && best.disagrees === false ? "confirmed" : "unconfirmed";
      const headline = best.confirmed ? best.confirmed_gflops : best.gflops;
      const headlineMedian = best.confirmed ? best.confirmed_median_s : best.median_s;
      const noise = best.measured_noise == null ? "-" : `${pct(best.measured_noise)} IQR/median${best.noisy ? ": NOISY (every launch the protocol allows)" : ""}`;
      bestBox.replaceChildren(el("h2", {}, "Best configuration: ", el("a", { href: `?trial=${best.trial_id}`, id: "best-trial", text: `trial ${best.trial_id}`, onclick: (e) => { e.preventDefault(); showTrial(best.trial_id); } })),
        el("dl", { class: "kv" }, el("dt", { text: "GFLOP/s" }), el("dd", { id: "best-gflops", text: gflops(headline) + bestMark(status) }),
          el("dt", { text: "Median" }), el("dd", { text: secs(headlineMedian) }),
          el("dt", { text: "Search" }), el("dd", { id: "best-search", text: `${gflops(best.gflops)} GFLOP/s, median ${secs(best.median_s)} (min ${secs(best.min_s)}), its first measurement` }),
          el("dt", { text: "Device" }), el("dd", { text: best.device_name || "-" }),
          el("dt", { text: "Confirmation" }), el("dd", { text: confirmed }),
          el("dt", { text: "Noise" }), el("dd", { id: "best-noise", class: best.noisy ? "noisy" : "", text: noise }),
          el("dt", { text: "Configuration" }), el("dd", { class: "config", text: configText(best.config) })),
        el("pre", { class: "cmd", id: "best-reproduce", text: best.reproduce }));
    }
  }

  poll(async () => {
    const data = await api(`/api/runs/${runId}`);
    summary = data.run;
    drawSummary(summary);
    // The heavier parts are asked for only when the run changed (in parallel).
    const key = JSON.stringify([summary.run_state, summary.trials, ...STATES.map((k) => summary[k]), summary.best_gflops, summary.confirmed]);
    if (key !== lastKey) {
      await Promise.all([loadCharts(summary), loadTimeline(), loadTable(), loadBest(), loadImportance()]);
      if (openTrial) await showTrial(openTrial);
      lastKey = key;
    }
    ready();
  });
}

function fleetPage() {
  document.getElementById("nav-fleet").classList.add("active");
  document.title = "Fleet · tunefleet";
  const holder = el("div", { class: "panel", id: "workers" });
  const aside = el("div", { class: "panel", id: "stand-asides" });
  main.replaceChildren(el("h1", { text: "Fleet" }), el("div", { class: "sub", id: "fleet-sub" }), holder, aside);
  poll(async () => {
    const data = await api("/api/fleet");
    const live = data.workers.filter((w) => w.alive).length;
    document.getElementById("fleet-sub").textContent = `${live} live worker(s); a worker is lost when its heartbeat is older than ${data.alive_s} s`;
    const liveness = (w) => w.state === "stopped" ? "stopped" : !w.alive ? "lost" : w.holding ? "busy" : "idle";
    const runLinks = (ids) => ids.length ? ids.flatMap((id, i) => [i ? ", " : "", el("a", { href: `/runs/${id}`, text: `#${id}` })]) : "-";
    holder.replaceChildren(el("h2", { text: "Workers" }), data.workers.length ? table([
      { title: "Worker", value: (w) => String(w.worker_id).slice(0, 8) },
      { title: "Host", value: (w) => w.host },
      { title: "PID", num: true, value: (w) => w.pid },
      { title: "Device", value: (w) => el("span", { title: w.platform ? `${w.platform}, driver ${w.driver_version || "-"}` : null, text: w.device_name || "-" }) },
      { title: "Class", value: (w) => w.device_class },
      { title: "State", value: (w) => el("span", { class: `badge ${liveness(w)}`, text: liveness(w) }) },
      { title: "Heartbeat", num: true, value: (w) => `${duration(w.heartbeat_age_s)} ago` },
      { title: "Codegen", num: true, value: (w) => w.prepare_workers === null ? "-" : `${w.prepare_workers} ${w.sizing || ""}` },
      { title: "Prefetch", num: true, value: (w) => num(w.prefetch) },
      { title: "Device timing", num: true, value: (w) => pct(w.device_busy) },
      { title: "Holding", num: true, value: (w) => w.holding ? `${w.holding} (trial ${w.current_trial})` : "0" },
      { title: "Working on", value: (w) => el("span", {}, runLinks(w.holding_runs)) },
      { title: "Serves", value: (w) => el("span", {}, runLinks(w.serves)) },
      { title: "Stands aside from", value: (w) => el("span", {}, runLinks(w.stands_aside.map((a) => a.run_id))) },
    ], data.workers, { rowId: (w) => w.worker_id }) : el("div", { class: "empty", text: "no worker has registered yet: start one with `tunefleet worker`" }));
    const asides = data.workers.flatMap((w) => w.stands_aside.map((a) => ({ ...a, host: w.host, worker_id: w.worker_id })));
    aside.replaceChildren(el("h2", { text: "Standing aside (their environment cannot run the run's problem)" }), asides.length ? table([
      { title: "Run", value: (a) => el("a", { href: `/runs/${a.run_id}`, text: `#${a.run_id}` }) },
      { title: "Worker", value: (a) => `${a.host} ${String(a.worker_id).slice(0, 8)}` },
      { title: "Reason", cls: "reason", value: (a) => a.reason },
    ], asides) : el("div", { class: "empty", text: "no worker stands aside" }));
    ready();
  });
}

// --- routing ------------------------------------------------------------------------------

(function route() {
  const path = location.pathname;
  const run = path.match(/^\/runs\/([1-9][0-9]*)$/);
  if (path === "/") runsPage();
  else if (path === "/fleet") fleetPage();
  else if (run) runPage(run[1]);
  else main.replaceChildren(el("h1", { text: "No such page" }), el("a", { href: "/", text: "all runs" }));
})();
