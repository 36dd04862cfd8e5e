// The page's actions (pepsi-httpd with ACTIONS = on): signing in with a token,
// and retry or discard of one message, each after a confirmation that says
// what the action would do (the server's dry run). Every action carries the
// session's CSRF token; the session cookie itself is HttpOnly. Without
// ACTIONS the page shows none of this.
"use strict";

const session = { actions: false, signedIn: false, csrf: "" };

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

// loadSession asks the server whether the page offers actions and whether
// this browser is signed in, and draws the sign-in box.
async function loadSession() {
  try {
    const r = await fetch("api/session", { cache: "no-store" });
    if (r.ok) Object.assign(session, toSession(await r.json()));
  } catch (e) {
    // The status poll says when pepsi-httpd cannot be reached.
  }
  renderSignIn();
}

function toSession(j) {
  return { actions: !!j.actions, signedIn: !!j.signed_in, csrf: j.csrf || "" };
}

function renderSignIn() {
  const box = document.getElementById("signin");
  box.replaceChildren();
  if (!session.actions) return;
  if (session.signedIn) {
    const out = el("button", "sign out");
    out.id = "signout";
    out.type = "button";
    out.addEventListener("click", signOut);
    box.append(el("span", "signed in: retry and discard offered", "muted"), out);
    return;
  }
  const form = el("form");
  form.id = "signin-form";
  const token = el("input");
  token.type = "password";
  token.id = "token";
  token.placeholder = "token";
  token.autocomplete = "current-password";
  const go = el("button", "sign in to act");
  go.type = "submit";
  form.append(token, go);
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    await signIn(token.value);
  });
  box.append(form);
}

async function signIn(token) {
  let r, j;
  try {
    r = await fetch("api/session", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }),
    });
    j = await answer(r);
  } catch (e) {
    notice("sign-in failed: " + (e.message || e), true);
    return;
  }
  if (!r.ok) {
    notice("sign-in refused: " + (j.error || "pepsi-httpd answered " + r.status), true);
    return;
  }
  Object.assign(session, toSession(j));
  notice("signed in");
  renderSignIn();
  refresh();
}

async function signOut() {
  await post("api/session", null, "DELETE");
  Object.assign(session, { signedIn: false, csrf: "" });
  notice("signed out");
  renderSignIn();
  refresh();
}

// answer is r's JSON body; {} for an error answer that is not JSON (a
// reverse proxy's page when pepsi-httpd is down, a 404 of no route), so
// that the caller says its status rather than a JSON syntax error.
async function answer(r) {
  try {
    return await r.json();
  } catch (e) {
    if (r.ok) throw e;
    return {};
  }
}

// post sends body as JSON with the session's CSRF token.
async function post(path, body, method) {
  const r = await fetch(path, {
    method: method || "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": session.csrf },
    body: body === null ? undefined : JSON.stringify(body),
  });
  const j = await answer(r);
  if (!r.ok) throw new Error(j.error || "pepsi-httpd answered " + r.status);
  return j;
}

const verbs = {
  retry: { button: "retry", ask: "Retry", done: "made pending again at its stage" },
  discard: { button: "discard", ask: "Discard", done: "ended failed, its reason naming the page" },
};

// actionButton returns the button of action (retry or discard) for message
// m (its id, and the stage and status the page shows of it).
function actionButton(action, m) {
  const b = el("button", verbs[action].button, "action");
  b.type = "button";
  b.dataset.action = action;
  b.dataset.id = String(m.id);
  b.addEventListener("click", () => act(action, m));
  return b;
}

// act asks the server what action would do to message m (a dry run), asks
// the operator to confirm, and then does it. Both requests carry the stage
// and status the confirmation names: a message that changed since the page
// showed it (moved on, claimed, finished) is left alone.
async function act(action, m) {
  const id = m.id, seen = { stage: m.stage, status: m.status };
  const path = `api/messages/${id}/${action}`;
  try {
    const dry = await post(path, { dry_run: true, ...seen });
    if (dry.count === 0) {
      notice(`nothing to ${action}: message ${id} is no longer ${m.status} at ${m.stage}`, true);
      refresh();
      return;
    }
    if (!await confirmed(`${verbs[action].ask} message ${id} (${m.status} at ${m.stage})? It will be ${verbs[action].done}.`)) {
      notice(`${action} of message ${id} cancelled`);
      return;
    }
    const done = await post(path, { dry_run: false, ...seen });
    notice(done.count === 1 ? `message ${id}: ${action} done` : `message ${id}: nothing to ${action}: it is no longer ${m.status} at ${m.stage}`, done.count !== 1);
  } catch (e) {
    notice(`${action} of message ${id} failed: ${e.message}`, true);
  }
  refresh();
}

// confirmed shows the confirmation dialog with text and resolves to the
// operator's answer.
function confirmed(text) {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise(resolve => {
    const yes = document.getElementById("confirm-yes"), no = document.getElementById("confirm-no");
    const done = answer => {
      yes.onclick = no.onclick = null;
      d.close();
      resolve(answer);
    };
    yes.onclick = () => done(true);
    no.onclick = () => done(false);
    d.showModal();
  });
}

function notice(text, bad) {
  const n = document.getElementById("notice");
  n.textContent = text;
  n.className = bad ? "error" : "muted";
  n.hidden = false;
}
