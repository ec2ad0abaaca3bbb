// wok demo page: draws the events of /api/events (the server's own batch and tick events,
// and the load generator's figures) and sends the controls to /api/*. No libraries.
"use strict";

const S = {
  config: null,
  batches: [],   // batch events of the last WINDOW_S seconds
  ticks: [],     // {t, queued, running, faults}
  loads: [],     // load events
  dots: [],      // arrival animation
  policy: null,
  lastSent: null,
  // Sliders moved since the last Apply: these keep the user's value; the others follow the live policy.
  touched: { "max-batch": false, delay: false },
  open: false,   // the event stream is connected
  // The live texts as the events last set them; shown marked "last:" once their events stop.
  text: { "load-now": "", "policy-now": "", footer: "" },
};
const WINDOW_S = 10;
// The load events' period (TICK_S in demo/web.py): one older than this and a second is from a
// stream that has stopped, and its figures are no longer live.
const LOAD_PERIOD_S = 0.25;
// The ticks' period (TICK_S in server/admin.py; the simulator's too). None for four of them: the
// server's figures are no longer live, even with the stream up (the server stopped or stuck).
const TICK_PERIOD_S = 0.25;
const TICK_STALE_S = 4 * TICK_PERIOD_S;
const COLORS = { size: "#4c9aff", delay: "#f5a623", drain: "#8a97a6", failed: "#ff5c5c", deadline: "#8a97a6" };
const $ = (id) => document.getElementById(id);
const now = () => Date.now() / 1000;

function fmt(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toFixed(digits);
}

function setCard(id, value, digits = 0, over = false) {
  const el = $(id);
  el.textContent = fmt(value, digits);
  el.dataset.value = value === null || value === undefined ? "" : String(value);
  el.classList.toggle("over", over);
}

// No tick for TICK_STALE_S: what the page shows of the server is the last it heard, not now.
// Not only while the stream is down: it stays connected to a server that is stopped (SIGSTOP)
// or whose ticks are stuck, and then says nothing.
function stale() {
  const tick = S.ticks[S.ticks.length - 1];
  return !(tick && now() - tick.seen <= TICK_STALE_S);
}

// The last load event if it is live: the callers' figures, from the demo itself, which go on
// while the server behind it is stopped.
function liveLoad() {
  const last = S.loads[S.loads.length - 1];
  return last && now() - last.seen <= LOAD_PERIOD_S + 1 ? last : undefined;
}

function setText(id, text) {
  const el = $(id);
  if (el.textContent !== text) el.textContent = text;
}

function updateTexts(old = stale()) {
  const last = { "load-now": !liveLoad(), "policy-now": old };
  for (const id of ["load-now", "policy-now"]) {
    const text = S.text[id];
    setText(id, last[id] && text ? "last: " + text.replace(/^now: /, "") : text);
  }
  const why = S.open
    ? `the event stream is up but no tick came for over ${TICK_STALE_S} s (the server stopped or stuck?)`
    : "the event stream is down (reconnecting…)";
  setText("footer", old && S.text.footer
    ? `No live data: ${why}; the texts marked "last:" are the last received.`
    : S.text.footer);
}

function message(text, ok = false) {
  const el = $("message");
  el.textContent = text;
  el.classList.toggle("ok", ok);
}

// Every POST is JSON: the page's server refuses anything else (a cross-site form could send it).
async function api(path, body) {
  let r, answer;
  try {
    r = await fetch("/api/" + path, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    answer = await r.json();
  } catch (e) {
    message(`/api/${path}: the demo did not answer (${e.message}); is wok demo still running?`);
    throw e;
  }
  if (!r.ok) { message(answer.error || ("HTTP " + r.status)); throw new Error(answer.error); }
  return answer;
}

// The number in a field; an emptied or invalid field (its value is "") is refused, not sent as 0.
function num(id, what) {
  const text = $(id).value.trim();
  const v = Number(text);
  if (text === "" || !Number.isFinite(v)) {
    const e = new Error(`${what}: expected a number; got ${text === "" ? "nothing" : JSON.stringify(text)}`);
    message(e.message);
    throw e;
  }
  return v;
}

// ---- events ---------------------------------------------------------------------------
function onConfig(c) {
  S.config = c;
  const mode = $("mode");
  if (c.mode === "simulate") {
    mode.textContent = "SIMULATION: the batcher simulator (α = " + fmt(c.alpha_ms, 3) + " ms, β = " +
      fmt(c.beta_ms, 3) + " ms/sample), not a server";
    mode.className = "badge simulate";
    $("fault-note").textContent = "Faults are not modelled by the simulator.";
  } else {
    mode.textContent = "LIVE: wok server " + c.server.grpc + ", model " + c.model;
    mode.className = "badge live";
  }
  $("slo-label").textContent = "(SLO " + fmt(c.slo_ms) + ")";
  $("subtitle").textContent = c.mode === "simulate" ? "dynamic batching, simulated" : "dynamic batching, live";
  $("rate").value = c.load.rate; $("rate-slider").value = c.load.rate;
  if (c.batching) applyPolicy(c.batching);
  buildInstances(c.instances, c.faults);
  S.text.footer = c.mode === "simulate"
    ? "Teaching mode: every batch and latency here comes from wok's discrete-event simulator at wall-clock pace."
    : "Every figure here is live: batches and queue from the server's /events, latencies from this demo's callers.";
  updateTexts();
}

// The live policy: from every tick, so another tab's or the admin API's change shows here too.
function applyPolicy(p) {
  S.policy = p;
  $("max-batch").max = p.limit_batch_size;
  // A slider clamps its value to its max: widen it to the policy's window (e.g. --max-queue-delay 250ms),
  // or Apply would send the clamped one.
  $("delay").max = Math.max(Number($("delay").max), p.max_queue_delay_ms);
  S.text["policy-now"] = "now: max batch " + p.max_batch_size + ", delay " + fmt(p.max_queue_delay_ms, 1) + " ms";
  updateTexts();
  if (!S.touched["max-batch"]) {
    $("max-batch").value = p.max_batch_size; $("max-batch-v").textContent = p.max_batch_size;
  }
  if (!S.touched.delay) {
    $("delay").value = p.max_queue_delay_ms; $("delay-v").textContent = fmt(p.max_queue_delay_ms, 1);
  }
}

function buildInstances(n, faults) {
  const box = $("instances");
  box.innerHTML = "";
  for (let i = 0; i < n; i++) {
    const row = document.createElement("div");
    row.className = "inst";
    row.innerHTML = `<span class="name">instance ${i}</span><span class="state" id="state-${i}">idle</span>` +
      `<button id="fail-${i}">Fail</button><button id="slow-${i}">Slow</button><button id="restore-${i}">Restore</button>`;
    box.appendChild(row);
    for (const b of ["fail", "slow", "restore"]) {
      const el = row.querySelector(`#${b}-${i}`);
      el.disabled = !faults;
      el.onclick = () => fault(i, b);
    }
  }
}

async function fault(i, kind) {
  const body = { instance: i, mode: kind === "restore" ? "off" : kind };
  try {
    if (kind === "slow") body.delay_ms = num("slow-ms", "slow by (ms)");
    await api("faults", body);
    message(kind === "restore" ? `instance ${i} restored` : `instance ${i}: ${kind}`, true);
  } catch (e) { /* shown */ }
}

function onBatch(e) { S.batches.push(e); }

function onTick(e) {
  const name = Object.keys(e.models)[0];
  const m = e.models[name];
  S.ticks.push({ t: e.t, seen: now(), queued: m.queued, running: m.running, faults: e.faults || [] });
  if (m.policy) applyPolicy(m.policy);
}

function onLoad(e) {
  if (S.lastSent !== null) {
    const n = Math.min(40, Math.max(0, e.sent_total - S.lastSent));
    for (let k = 0; k < n; k++) S.dots.push({ t0: now() + Math.random() * 0.25, y: 40 + Math.random() * 150 });
  }
  S.lastSent = e.sent_total;
  e.seen = now();  // the page's own clock: the server's may differ from it
  S.loads.push(e);
  S.text["load-now"] = e.burst_rate ? `bursting at ${fmt(e.burst_rate)} req/s, ${fmt(e.burst_left_s, 1)} s left`
    : `steady at ${fmt(e.rate)} req/s`;
  updateTexts();
  // Arrivals not sent because the demo's cap of callers were all waiting: offered is short of the rate.
  // Over the callers' window, as offered: the warning ends once the demo keeps up again.
  const sk = $("skipped");
  sk.dataset.value = String(e.skipped);
  sk.textContent = e.skipped
    ? `${e.skipped} arrivals not sent in the last ${fmt(e.window_s)} s (too many callers waiting)` : "";
}

function connect() {
  const es = new EventSource("/api/events");
  es.onopen = () => { S.open = true; $("status").textContent = "connected"; $("status").dataset.state = "open"; updateTexts(); };
  es.onerror = () => { S.open = false; $("status").textContent = "reconnecting…"; $("status").dataset.state = "error"; };
  es.onmessage = (msg) => {
    const e = JSON.parse(msg.data);
    if (e.type === "batch") onBatch(e);
    else if (e.type === "tick") onTick(e);
    else if (e.type === "load") onLoad(e);
    else if (e.type === "config") onConfig(e);
  };
}

// ---- figures ---------------------------------------------------------------------------
function prune() {
  const edge = now() - WINDOW_S - 1;
  while (S.batches.length && S.batches[0].t_end < edge) S.batches.shift();
  while (S.ticks.length && S.ticks[0].t < edge - 50) S.ticks.shift();
  while (S.loads.length && S.loads[0].t < edge - 50) S.loads.shift();
}

// A figure whose window has no event (the stream ended, the demo stopped) shows "–", not its last value.
function updateCards() {
  const t = now();
  const l = liveLoad() || {};
  const slo = S.config ? S.config.slo_ms : Infinity;
  setCard("offered", l.sent_per_s);
  setCard("throughput", l.ok_per_s);
  setCard("p50", l.p50_ms, 1, l.p50_ms > slo);
  setCard("p95", l.p95_ms, 1, l.p95_ms > slo);
  setCard("p99", l.p99_ms, 1, l.p99_ms > slo);
  setCard("errors", l.errors_per_s, 0, l.errors_per_s > 0);
  const recent = S.ticks.filter((k) => k.seen > t - 1);
  setCard("queue", recent.length ? Math.max(...recent.map((k) => k.queued)) : null);
  // Batches that ran (ok: some request answered); a failed one is left out, as /metrics' wok_batch_size leaves it out.
  const bs = S.batches.filter((b) => b.t_end > t - 2 && b.ok);
  setCard("mean-batch", bs.length ? bs.reduce((a, b) => a + b.size, 0) / bs.length : null, 1);
}

function ctx2d(id) {
  const c = $(id);
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  g.font = "12px system-ui, sans-serif";
  return [c, g];
}

function faultOf(i, tick) {
  return tick ? tick.faults.find((f) => f.instance === i) : undefined;
}

// Stale (old): no queue, no instance busy or faulted (the last tick's are not now's), greyed and
// labelled; the canvas's data-stale, data-queued and data-busy say what it drew.
function drawPipeline(old) {
  const [c, g] = ctx2d("pipeline");
  const t = now();
  const tick = old ? undefined : S.ticks[S.ticks.length - 1];
  g.globalAlpha = old ? 0.4 : 1;
  const n = S.config ? S.config.instances : 1;
  const maxB = S.policy ? S.policy.max_batch_size : 32;
  // arrivals: dots flying into the queue
  g.fillStyle = "#8a97a6"; g.fillText("requests arriving", 10, 20);
  S.dots = S.dots.filter((d) => t - d.t0 < 0.6);
  g.fillStyle = "#dbe2ea";
  for (const d of S.dots) {
    const f = (t - d.t0) / 0.6;
    if (f < 0) continue;
    g.beginPath(); g.arc(20 + f * 260, d.y + (115 - d.y) * f, 3, 0, 7); g.fill();
  }
  // queue: one cell per queued request, up to 2 x max batch size drawn
  const qx = 300, qw = 250, qy = 70, qh = 90;
  g.strokeStyle = "#2a3441"; g.strokeRect(qx, qy, qw, qh);
  const queued = tick ? tick.queued : 0;
  const cap = 2 * maxB;
  const cell = qw / cap;
  g.fillStyle = queued > maxB ? "#ff5c5c" : "#4c9aff";
  for (let k = 0; k < Math.min(queued, cap); k++) g.fillRect(qx + qw - (k + 1) * cell + 1, qy + 20, Math.max(1, cell - 2), qh - 40);
  g.strokeStyle = "#f5a623"; g.setLineDash([4, 3]);
  g.beginPath(); g.moveTo(qx + qw - maxB * cell, qy - 6); g.lineTo(qx + qw - maxB * cell, qy + qh + 6); g.stroke();
  g.setLineDash([]);
  g.fillStyle = "#8a97a6";
  g.fillText(old ? "queue: –" : `queue: ${queued} waiting${queued > cap ? " (more than drawn)" : ""}`, qx, qy - 12);
  g.fillText(`full batch = ${maxB}`, qx + qw - maxB * cell - 30, qy + qh + 20);
  // instances: busy / idle, the last batch, its reason
  const ix = 620, ih = Math.min(60, (c.height - 20) / n - 8);
  let nBusy = 0;
  for (let i = 0; i < n; i++) {
    const y = 10 + i * (ih + 8);
    const last = [...S.batches].reverse().find((b) => b.instance === i);
    const busy = !old && ((tick && tick.running && tick.running[i] > 0) || (last && t - last.t_end < 0.05));
    nBusy += busy ? 1 : 0;
    const f = faultOf(i, tick);
    g.fillStyle = f ? (f.mode === "fail" ? "#4a1f24" : "#3a2a55") : busy ? "#123a5c" : "#1d2630";
    g.fillRect(ix, y, 260, ih);
    g.strokeStyle = busy ? "#4c9aff" : "#2a3441"; g.strokeRect(ix, y, 260, ih);
    g.fillStyle = "#dbe2ea";
    const state = old ? "–" : f ? f.mode.toUpperCase() + (f.mode === "slow" ? ` +${f.delay_ms} ms` : "") : busy ? "busy" : "idle";
    g.fillText(`instance ${i}: ${state}`, ix + 8, y + 18);
    if (last) {
      g.fillStyle = last.ok ? COLORS[last.reason] || "#8a97a6" : COLORS.failed;
      g.fillText(`last batch: ${last.size} (${last.ok ? last.reason : "failed"}), ${fmt(1e3 * (last.t_end - last.t_start), 1)} ms`, ix + 8, y + 36);
    }
    if ($("state-" + i)) setText("state-" + i, old ? "–" : f ? f.mode : busy ? "busy" : "idle");
    // arrows from the queue
    g.strokeStyle = "#2a3441"; g.beginPath(); g.moveTo(qx + qw, qy + qh / 2); g.lineTo(ix, y + ih / 2); g.stroke();
  }
  g.globalAlpha = 1;
  if (old) {
    g.fillStyle = "#ff5c5c";
    g.fillText(S.open ? "no live data (no tick)" : "no live data (event stream down)", qx + 12, qy + qh / 2 + 4);
  }
  Object.assign(c.dataset, { stale: String(old), queued: String(queued), busy: String(nBusy) });
}

function drawTimeline() {
  const [c, g] = ctx2d("timeline");
  const t = now();
  const n = S.config ? S.config.instances : 1;
  const lane = (c.height - 20) / n;
  const x = (ts) => 60 + ((ts - (t - WINDOW_S)) / WINDOW_S) * (c.width - 70);
  const maxB = S.policy ? S.policy.limit_batch_size : 32;
  g.fillStyle = "#8a97a6";
  for (let i = 0; i < n; i++) g.fillText(`inst ${i}`, 6, i * lane + lane / 2 + 4);
  for (let s = 0; s <= WINDOW_S; s += 2) g.fillText(`-${WINDOW_S - s}s`, x(t - WINDOW_S + s) - 10, c.height - 4);
  for (const b of S.batches) {
    const h = Math.max(2, (lane - 6) * Math.min(1, b.size / maxB));
    const y = b.instance * lane + (lane - 3) - h;
    g.fillStyle = b.ok ? COLORS[b.reason] || "#8a97a6" : COLORS.failed;
    g.fillRect(x(b.t_start), y, Math.max(1.5, x(b.t_end) - x(b.t_start)), h);
  }
}

function drawSeries(id, series, opts) {
  const [c, g] = ctx2d(id);
  const t = now(), span = 60;
  const x = (ts) => 40 + ((ts - (t - span)) / span) * (c.width - 50);
  let top = opts.min || 1;
  for (const s of series) for (const p of s.points) if (p[1] !== null && p[1] > top) top = p[1];
  if (opts.line) top = Math.max(top, opts.line * 1.2);
  top *= 1.1;
  const y = (v) => c.height - 18 - (v / top) * (c.height - 30);
  g.fillStyle = "#8a97a6";
  g.fillText(fmt(top, top < 10 ? 1 : 0), 2, 14); g.fillText("0", 2, c.height - 18);
  g.fillText("-60 s", 40, c.height - 4); g.fillText("now", c.width - 30, c.height - 4);
  if (opts.line) {
    g.strokeStyle = "#ff5c5c"; g.setLineDash([6, 4]);
    g.beginPath(); g.moveTo(40, y(opts.line)); g.lineTo(c.width - 10, y(opts.line)); g.stroke(); g.setLineDash([]);
  }
  let lx = 50;
  for (const s of series) {
    g.strokeStyle = s.color; g.lineWidth = 1.5; g.beginPath();
    let pen = false;
    for (const [ts, v] of s.points) {
      if (ts < t - span || v === null) { pen = false; continue; }
      if (pen) g.lineTo(x(ts), y(v)); else g.moveTo(x(ts), y(v));
      pen = true;
    }
    g.stroke(); g.lineWidth = 1;
    g.fillStyle = s.color; g.fillText(s.name, lx, 14); lx += g.measureText(s.name).width + 14;
  }
}

function drawCharts() {
  const L = S.loads;
  drawSeries("chart-throughput", [
    { name: "offered", color: "#8a97a6", points: L.map((l) => [l.t, l.sent_per_s]) },
    { name: "OK", color: "#3ecf8e", points: L.map((l) => [l.t, l.ok_per_s]) },
    { name: "errors", color: "#ff5c5c", points: L.map((l) => [l.t, l.errors_per_s]) },
  ], { min: 10 });
  drawSeries("chart-latency", [
    { name: "P50", color: "#3ecf8e", points: L.map((l) => [l.t, l.p50_ms]) },
    { name: "P95", color: "#f5a623", points: L.map((l) => [l.t, l.p95_ms]) },
    { name: "P99", color: "#ff8a5c", points: L.map((l) => [l.t, l.p99_ms]) },
  ], { min: 1, line: S.config ? S.config.slo_ms : null });
}

function frame() {
  prune();
  updateCards();
  const old = stale();
  updateTexts(old);
  drawPipeline(old);
  drawTimeline();
  drawCharts();
  requestAnimationFrame(frame);
}

// ---- controls ---------------------------------------------------------------------------
function wire() {
  $("rate-slider").oninput = () => { $("rate").value = $("rate-slider").value; };
  $("rate").oninput = () => { $("rate-slider").value = $("rate").value; };
  $("apply-rate").onclick = async () => {
    try { await api("load", { rate: num("rate", "rate") }); message(`rate set to ${$("rate").value} req/s`, true); } catch (e) { /* shown */ }
  };
  $("rate").onkeydown = (ev) => { if (ev.key === "Enter") $("apply-rate").click(); };
  $("burst").onclick = async () => {
    try {
      await api("load", { burst_rate: num("burst-rate", "burst rate"), burst_s: num("burst-s", "burst seconds") });
      message(`burst: ${$("burst-rate").value} req/s for ${$("burst-s").value} s`, true);
    } catch (e) { /* shown */ }
  };
  $("max-batch").oninput = () => { S.touched["max-batch"] = true; $("max-batch-v").textContent = $("max-batch").value; };
  $("delay").oninput = () => { S.touched.delay = true; $("delay-v").textContent = $("delay").value; };
  // Apply sends only the sliders moved since the last Apply, so it cannot undo a change made
  // elsewhere in the meantime (an untouched slider's value may be a tick old). With none moved it
  // sends both as shown, the live policy's, which the server needs at least one of: not the
  // sliders' values, which a range input snaps to its 0.5 ms step (a 2.3 ms window shown, 2.5 sent).
  $("apply-batching").onclick = async () => {
    const fields = { "max-batch": ["max_batch_size", "max batch size"], delay: ["max_queue_delay_ms", "delay window"] };
    const moved = Object.keys(fields).filter((id) => S.touched[id]);
    try {
      const body = {};
      if (moved.length || !S.policy) {
        for (const id of moved.length ? moved : Object.keys(fields)) body[fields[id][0]] = num(id, fields[id][1]);
      } else {
        body.max_batch_size = S.policy.max_batch_size;
        body.max_queue_delay_ms = S.policy.max_queue_delay_ms;
      }
      const sent = Object.fromEntries(moved.map((id) => [id, $(id).value]));
      const p = await api("batching", body);
      // A slider moved again while the request was out keeps its new value.
      for (const id of moved) if ($(id).value === sent[id]) S.touched[id] = false;
      applyPolicy(p);
      message(`batching: max ${p.max_batch_size}, delay ${p.max_queue_delay_ms} ms`, true);
    } catch (e) { /* shown */ }
  };
}

wire();
connect();
requestAnimationFrame(frame);
