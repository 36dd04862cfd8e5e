// The message page: one message (never its payload nor its state), and,
// with ACTIONS = on and signed in, the action that applies to it now.
"use strict";

const messageID = new URLSearchParams(location.search).get("id") || "";

async function refresh() {
  const error = document.getElementById("error");
  document.getElementById("title").textContent = "Message " + messageID;
  try {
    if (!/^[0-9]+$/.test(messageID)) throw new Error("no message id in the page's address (message.html?id=ID)");
    const r = await fetch("api/messages/" + encodeURIComponent(messageID), { cache: "no-store" });
    const m = await answer(r);
    if (!r.ok) throw new Error(m.error || "pepsi-httpd answered " + r.status);
    error.hidden = true;
    render(m);
  } catch (e) {
    error.hidden = false;
    error.textContent = String(e.message || e);
  }
}

function render(m) {
  const body = document.querySelector("#message tbody");
  body.replaceChildren();
  const rows = [
    ["stage", m.stage], ["status", m.status], ["attempts", String(m.attempts)],
    ["due", m.timeout ? new Date(m.timeout).toLocaleString() : "-"],
    ["created", new Date(m.created_at).toLocaleString()], ["updated", new Date(m.updated_at).toLocaleString()],
    ["failed by", m.by || "-"], ["reason", m.reason || "-"],
    ["order key", m.order_key || "-"],
    ["payload size", m.payload_size_error ? "unreadable: " + m.payload_size_error : bytes(m.payload_size)],
  ];
  for (const [k, v] of rows) {
    const tr = el("tr");
    tr.dataset.key = k;
    tr.append(el("th", k), el("td", v, k === "reason" ? "reason" : ""));
    body.append(tr);
  }
  if (m.status === "blocked") body.append(waitsBehind(m.waits_behind));
  body.append(lineage(m));
  renderHistory(m);
  const actions = document.getElementById("actions");
  actions.replaceChildren();
  if (!session.signedIn) return;
  for (const a of m.actions || []) actions.append(actionButton(a, m));
}

// renderHistory fills the history table: each event with the wait before a
// pass (since the event before it, or since the message was made) and how
// long the pass took (handed out to answered). The server sends the latest
// events only, and says when there are older ones (the first shown then
// has no event before it to wait from).
function renderHistory(m) {
  const body = document.querySelector("#history tbody");
  body.replaceChildren();
  const none = document.getElementById("history-none");
  none.hidden = m.history.length > 0;
  if (m.history_error) {
    none.hidden = false;
    none.textContent = "History unreadable: " + m.history_error;
  }
  document.getElementById("history-older").hidden = !m.history_older;
  let prev = m.history_older ? null : new Date(m.created_at);
  for (const h of m.history) {
    const at = new Date(h.at);
    let waited = "-", took = "-";
    if (h.handed_at) {
      const handed = new Date(h.handed_at);
      // (A wait below zero is two clocks apart: the dispatcher's stamps a
      // pass, the database's the message's creation.)
      if (prev && handed >= prev) waited = seconds(handed - prev);
      took = seconds(at - handed);
    }
    const tr = el("tr");
    tr.dataset.event = h.event;
    tr.append(el("td", at.toLocaleString()), el("td", h.stage), el("td", waited), el("td", took),
      el("td", h.worker_pid ? "pid " + h.worker_pid : "-"), el("td", String(h.attempts)),
      el("td", h.detail ? `${h.event}: ${h.detail}` : h.event, "reason"));
    body.append(tr);
    prev = at;
  }
}

// seconds writes a duration of ms milliseconds.
function seconds(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

// bytes writes a payload size: none (null), or bytes, with KiB or MiB
// beside them from 1 KiB on.
function bytes(n) {
  if (n === null || n === undefined) return "no payload";
  const exact = `${n.toLocaleString("en")} ${n === 1 ? "byte" : "bytes"}`;
  if (n < 1024) return exact;
  return n < 1048576 ? `${exact} (${(n / 1024).toFixed(1)} KiB)` : `${exact} (${(n / 1048576).toFixed(1)} MiB)`;
}

// link is a link to message id's page.
function link(id) {
  const a = el("a", "message " + id);
  a.href = "message.html?id=" + id;
  return a;
}

// lineage is the rows that name the message whose pass emitted this one
// (linked to its page) and the messages this one's passes emitted: how many,
// and the first of them (the API lists a bounded number), each linked.
function lineage(m) {
  const parent = el("tr");
  parent.dataset.key = "parent";
  const ptd = el("td", m.parent_id ? "" : "-");
  if (m.parent_id) ptd.append(link(m.parent_id), " (its pass emitted this message)");
  parent.append(el("th", "parent"), ptd);
  const children = el("tr");
  children.dataset.key = "children";
  const ctd = el("td", m.children ? "" : "none");
  if (m.children) {
    ctd.append(`${m.children}: `);
    m.first_children.forEach((id, i) => ctd.append(...(i ? [", "] : []), link(id)));
    if (m.children > m.first_children.length) ctd.append(`, and ${m.children - m.first_children.length} more`);
  }
  children.append(el("th", "children"), ctd);
  const frag = document.createDocumentFragment();
  frag.append(parent, children);
  return frag;
}

// waitsBehind is the row that says what a blocked message waits behind: its
// order key's head, linked to its page, and what that message is doing.
function waitsBehind(h) {
  const tr = el("tr");
  tr.dataset.key = "waits behind";
  const td = el("td", h ? "" : "no unfinished message of its key: pepsi-dispatch hands it the key next");
  if (h) {
    let doing = `${h.status} at ${h.stage}`;
    if (h.status === "paused" && h.attempts > 0) doing = `paused at ${h.stage} for retry ${h.attempts}`;
    if (h.timeout) doing += " until " + new Date(h.timeout).toLocaleString();
    td.append(link(h.id), ` (${doing})`);
  }
  tr.append(el("th", "waits behind"), td);
  return tr;
}

loadSession().then(refresh);
