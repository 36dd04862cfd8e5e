// The PEPSI status page: polls /api/status and draws what it says. Plain
// JavaScript, no libraries, nothing fetched from elsewhere.
"use strict";

const pollMillis = 2000;
const colors = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2", "#dc2626", "#4b5563"];
const colorOf = Object.create(null); // no prototype: a stage may be named "constructor"

function color(stage) {
  if (!(stage in colorOf)) colorOf[stage] = colors[Object.keys(colorOf).length % colors.length];
  return colorOf[stage];
}

function duration(s) {
  if (s < 1) return s > 0 ? "<1s" : "-";
  if (s < 60) return Math.round(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function meanPass(seconds, passes) {
  if (!passes) return "-";
  const ms = (seconds / passes) * 1000;
  return ms < 1 ? (ms * 1000).toFixed(0) + "µs" : ms < 1000 ? ms.toFixed(1) + "ms" : (ms / 1000).toFixed(2) + "s";
}

// rate returns stage passes ok per second over the history's last minute.
function rate(history, stage) {
  if (history.length < 2) return null;
  const last = history[history.length - 1];
  let first = history[0];
  for (let i = history.length - 2; i >= 0; i--) {
    first = history[i];
    if (Date.parse(last.at) - Date.parse(first.at) >= 60000) break;
  }
  const dt = (Date.parse(last.at) - Date.parse(first.at)) / 1000;
  const a = (first.stages[stage] || {}).passes_ok || 0;
  const b = (last.stages[stage] || {}).passes_ok || 0;
  return dt > 0 ? Math.max(b - a, 0) / dt : null;
}

// healthLabel is how the page names a stage_health state.
const healthLabel = { ok: "ok", cannot_start: "cannot start", crashing: "crashing", pressure_held: "held by back-pressure", rate_held: "held by its RATE" };

// unhealthy says whether a stage_health state needs an operator.
function unhealthy(h) {
  return h.state === "cannot_start" || h.state === "crashing";
}

// healths returns what pepsi-dispatch recorded of each stage, by stage: only
// while a dispatcher holds the lock, as the record is its own then.
function healths(snap) {
  const out = Object.create(null);
  if (snap.dispatcher_locked) for (const h of snap.health || []) out[h.stage] = h;
  return out;
}

// healthReason says why a stage is unhealthy, since when and, for one whose
// program cannot start, when it tries next (by the database's clock).
function healthReason(h, at) {
  const now = Date.parse(at);
  let text = `${h.stage}: ${h.reason} (for ${duration((now - Date.parse(h.since)) / 1000)}`;
  if (h.until) {
    const left = (Date.parse(h.until) - now) / 1000;
    text += left > 0 ? `; next try in ${duration(left)}` : "; next try when a message waits";
  }
  return text + ")";
}

function renderStages(snap, history) {
  const stats = Object.create(null);
  for (const s of snap.stages || []) stats[s.stage] = s;
  const health = healths(snap);
  const body = document.querySelector("#stages tbody");
  body.replaceChildren();
  for (const l of snap.live) {
    const s = stats[l.stage] || {};
    const tr = el("tr");
    tr.dataset.stage = l.stage;
    const name = el("td", l.stage);
    name.style.borderLeft = "4px solid " + color(l.stage);
    tr.append(name);
    const h = health[l.stage];
    const state = el("td", h ? healthLabel[h.state] || h.state : "-", "health");
    state.dataset.key = "health";
    if (h) {
      state.dataset.state = h.state;
      if (h.reason) state.title = h.reason;
      if (unhealthy(h)) tr.classList.add("unhealthy");
    }
    tr.append(state);
    const cells = [
      ["pending", l.messages.pending], ["running", l.messages.running], ["paused", l.messages.paused],
      ["retry_waiting", l.retry_waiting ?? 0],
      ["failed", l.messages.failed, l.messages.failed > 0], ["timeout", l.messages.timeout, l.messages.timeout > 0],
      ["oldest", l.messages.pending ? duration(l.oldest_pending_seconds) : "-"],
    ];
    const r = rate(history, l.stage);
    cells.push(["rate", r === null ? "-" : r.toFixed(r < 10 ? 2 : 0)]);
    cells.push(["passes_ok", s.passes_ok ?? 0]);
    cells.push(["failed_by_dispatcher", s.failed_by_dispatcher ?? 0, s.failed_by_dispatcher > 0]);
    cells.push(["watchdog_timeouts", s.watchdog_timeouts ?? 0, s.watchdog_timeouts > 0]);
    cells.push(["retries", s.retries ?? 0]);
    cells.push(["worker_crashes", s.worker_crashes ?? 0, s.worker_crashes > 0]);
    cells.push(["mean", meanPass(s.processing_seconds || 0, s.passes_ok || 0)]);
    for (const [key, value, warn] of cells) {
      const td = el("td", String(value), "num" + (warn ? " warn" : ""));
      td.dataset.key = key;
      tr.append(td);
    }
    body.append(tr);
    if (h && unhealthy(h)) {
      const why = el("tr", undefined, "health-reason");
      why.dataset.stage = l.stage;
      const td = el("td", healthReason(h, snap.at));
      td.colSpan = tr.children.length;
      why.append(td);
      body.append(why);
    }
  }
  document.getElementById("totals").textContent =
    `pepsi-dispatch counted ${snap.stage_passes} stage passes and ${snap.messages_left} messages that left the pipeline` +
    ` (last flush ${new Date(snap.flushed_at).toLocaleTimeString()}).`;
}

function renderFailures(snap) {
  const body = document.querySelector("#failures tbody");
  body.replaceChildren();
  const fs = snap.failures || [];
  const acting = session.signedIn;
  document.getElementById("failures-action").hidden = !acting;
  if (fs.length === 0) {
    const tr = el("tr");
    const td = el("td", "none", "muted");
    td.colSpan = acting ? 7 : 6;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const f of fs) {
    const tr = el("tr");
    tr.dataset.id = String(f.id);
    const id = el("td", undefined, "num");
    const link = el("a", String(f.id));
    link.href = "message.html?id=" + f.id;
    id.append(link);
    tr.append(id, el("td", f.stage), el("td", f.status),
      el("td", new Date(f.updated_at).toLocaleString()), el("td", f.by || "-"), el("td", f.reason, "reason"));
    if (acting) {
      const td = el("td");
      td.append(actionButton("retry", f));
      tr.append(td);
    }
    body.append(tr);
  }
}

// series turns the history into one line per stage with value(prev, cur).
function series(history, value) {
  const lines = Object.create(null);
  for (let i = 0; i < history.length; i++) {
    const t = Date.parse(history[i].at);
    for (const stage of Object.keys(history[i].stages)) {
      const v = value(i > 0 ? history[i - 1] : null, history[i], stage);
      if (v === null) continue;
      (lines[stage] = lines[stage] || []).push([t, v]);
    }
  }
  return lines;
}

// draw plots lines (stage -> [[t, v]...]) on canvas id; returns the points drawn.
function draw(id, lines) {
  const c = document.getElementById(id);
  const g = c.getContext("2d");
  const w = c.width, h = c.height, left = 48, bottom = 18, top = 8, right = 8;
  g.clearRect(0, 0, w, h);
  g.fillStyle = "#fff";
  g.fillRect(0, 0, w, h);
  let t0 = Infinity, t1 = -Infinity, vmax = 0, points = 0;
  for (const pts of Object.values(lines)) {
    for (const [t, v] of pts) { t0 = Math.min(t0, t); t1 = Math.max(t1, t); vmax = Math.max(vmax, v); points++; }
  }
  g.strokeStyle = "#d8dce3";
  g.fillStyle = "#6b7280";
  g.font = "11px system-ui, sans-serif";
  g.beginPath();
  g.moveTo(left, top); g.lineTo(left, h - bottom); g.lineTo(w - right, h - bottom);
  g.stroke();
  if (points === 0) {
    g.fillText("waiting for samples…", left + 10, h / 2);
    c.dataset.points = "0";
    return 0;
  }
  const top1 = vmax > 0 ? vmax * 1.1 : 1;
  g.textAlign = "right";
  g.fillText(formatNum(top1), left - 4, top + 8);
  g.fillText("0", left - 4, h - bottom);
  g.textAlign = "left";
  if (t1 > t0) {
    g.fillText("-" + duration((t1 - t0) / 1000), left + 2, h - 4);
    g.textAlign = "right";
    g.fillText("now", w - right, h - 4);
  }
  const x = t => t1 > t0 ? left + (t - t0) / (t1 - t0) * (w - left - right) : w - right;
  const y = v => h - bottom - v / top1 * (h - bottom - top);
  for (const [stage, pts] of Object.entries(lines)) {
    g.strokeStyle = color(stage);
    g.fillStyle = color(stage);
    g.lineWidth = 2;
    g.beginPath();
    pts.forEach(([t, v], i) => i === 0 ? g.moveTo(x(t), y(v)) : g.lineTo(x(t), y(v)));
    g.stroke();
    if (pts.length === 1) g.fillRect(x(pts[0][0]) - 2, y(pts[0][1]) - 2, 4, 4);
  }
  c.dataset.points = String(points);
  return points;
}

function formatNum(v) {
  return v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e3 ? (v / 1e3).toFixed(1) + "k" : v >= 10 ? v.toFixed(0) : v.toFixed(2);
}

function renderCharts(history) {
  draw("chart-pending", series(history, (_, cur, s) => cur.stages[s].pending ?? 0));
  draw("chart-rate", series(history, (prev, cur, s) => {
    if (!prev || !prev.stages[s]) return null;
    const dt = (Date.parse(cur.at) - Date.parse(prev.at)) / 1000;
    return dt > 0 ? Math.max((cur.stages[s].passes_ok || 0) - (prev.stages[s].passes_ok || 0), 0) / dt : null;
  }));
  draw("chart-failed", series(history, (_, cur, s) => (cur.stages[s].failed ?? 0) + (cur.stages[s].timeout ?? 0)));
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  for (const stage of Object.keys(colorOf)) {
    const s = el("span", stage);
    s.style.setProperty("--c", colorOf[stage]);
    legend.append(s);
  }
}

function render(st) {
  const db = document.getElementById("db");
  const error = document.getElementById("error");
  db.textContent = st.ok ? "database ok" : "database unreachable";
  db.className = "badge " + (st.ok ? "ok" : "bad");
  error.hidden = st.ok;
  error.textContent = st.ok ? "" : st.error + (st.snapshot ? " (showing the last good read)" : "");
  const snap = st.snapshot;
  if (!snap) return;
  const lock = document.getElementById("lock");
  if (st.ok) {
    const sick = Object.values(healths(snap)).filter(unhealthy);
    lock.textContent = !snap.dispatcher_locked ? "no dispatcher holds the lock" :
      sick.length === 0 ? "dispatcher running" :
      "dispatcher running; " + sick.map(h => `stage ${h.stage} ${healthLabel[h.state]}`).join(", ");
    lock.className = "badge " + (snap.dispatcher_locked && sick.length === 0 ? "ok" : "bad");
  } else {
    lock.textContent = "dispatcher: unknown";
    lock.className = "badge";
  }
  document.getElementById("updated").textContent = (st.ok ? "read at " : "last good read at ") + new Date(snap.at).toLocaleTimeString();
  for (const l of snap.live) color(l.stage);
  renderStages(snap, st.history || []);
  renderFailures(snap);
  renderCharts(st.history || []);
  document.body.dataset.reads = String(Number(document.body.dataset.reads || 0) + 1);
}

// pollTimer is the next poll's timer; refresh polls at once instead.
let pollTimer = null;

function refresh() {
  clearTimeout(pollTimer);
  poll();
}

async function poll() {
  try {
    const r = await fetch("api/status", { cache: "no-store" });
    if (!r.ok) throw new Error("pepsi-httpd answered " + r.status);
    render(await r.json());
  } catch (e) {
    const db = document.getElementById("db");
    db.textContent = "pepsi-httpd unreachable";
    db.className = "badge bad";
    const error = document.getElementById("error");
    error.hidden = false;
    error.textContent = String(e);
  }
  clearTimeout(pollTimer);
  pollTimer = setTimeout(poll, pollMillis);
}

loadSession().then(poll);
