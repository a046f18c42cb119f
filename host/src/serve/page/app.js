// The Capstan page: chat with streamed replies and what the conversation's tool calls
// cost, the live panel of workers and branches, the task board, the calls waiting for
// approval, the policy matrix and the audit log with each call's receipt.
// Only this server is talked to.
"use strict";

const state = { token: sessionStorage.getItem("capstan-token") || "", auditNext: null };

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({}, options, { headers: headers((options || {}).headers) }));
  if (response.status === 401) {
    document.getElementById("token-form").hidden = false;
    throw new Error("this server needs a token");
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new Error(body && body.error ? body.error.message : response.statusText);
  return body;
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function say(kind, text) {
  const node = el("div", { class: "msg " + kind }, text);
  const box = document.getElementById("conversation");
  box.appendChild(node);
  box.scrollTop = box.scrollHeight;
  return node;
}

// Reads a text/event-stream body, calling `each(event, data, id)` per message.
async function readSse(response, each) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message", data = "", id = null;
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
        else if (line.startsWith("id:")) id = line.slice(3).trim();
      }
      if (data) each(event, data, id);
    }
  }
}

async function send(text, channel) {
  say("user", text);
  const reply = say("agent", "");
  reply.classList.add("streaming");
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", "X-Capstan-Conversation": channel }),
      body: JSON.stringify({ model: "capstan", stream: true, messages: [{ role: "user", content: text }] }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new Error(body && body.error ? body.error.message : response.statusText);
    }
    await readSse(response, (_event, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) reply.textContent += delta.content;
    });
  } catch (err) {
    reply.classList.add("error");
    reply.textContent = String(err.message || err);
  }
  reply.classList.remove("streaming");
  reply.classList.add("done");
  showCost(channel).catch((err) => activity(String(err.message || err), "denied"));
}

function micros(us) {
  if (us < 1000) return us + " µs";
  if (us < 1e6) return (us / 1e3).toFixed(1) + " ms";
  return (us / 1e6).toFixed(2) + " s";
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "-";
  if (bytes < 1024) return bytes + " B";
  if (bytes < 1048576) return (bytes / 1024).toFixed(1) + " KiB";
  return (bytes / 1048576).toFixed(1) + " MiB";
}

// What the conversation's tool calls (its workers' and branches' included) have cost.
async function showCost(channel) {
  const report = await api("/v1/audit/costs?by=conversation&conversation=" + encodeURIComponent(channel));
  const t = report.total;
  const requests = t.requests ? ", " + t.requests + " requests (" + size(t.request_bytes_sent) + " out, " +
    size(t.request_bytes_received) + " in)" : "";
  document.getElementById("cost").textContent = t.calls
    ? "Tool calls in " + channel + ": " + t.calls + ", " + micros(t.duration_us) + ", peak memory " +
      size(t.peak_memory_bytes) + requests
    : "No tool call in " + channel + " yet";
}

const processes = new Map();

function showProcess(id, what, stateName) {
  let item = processes.get(id);
  if (!item) {
    item = el("li", { "data-process": id });
    item.append(el("strong", {}, id + " "), el("span", { class: "state" }), el("div", { class: "what" }));
    processes.set(id, item);
    document.getElementById("processes").prepend(item);
  }
  const badge = item.querySelector(".state");
  badge.textContent = stateName;
  badge.className = "state " + stateName;
  if (what) item.querySelector(".what").textContent = what;
}

function activity(text, kind) {
  const list = document.getElementById("activity");
  list.prepend(el("li", kind ? { class: kind } : {}, text));
  while (list.children.length > 200) list.lastChild.remove();
}

function onEvent(e) {
  switch (e.type) {
    case "worker_started": showProcess(e.worker, e.task, "running"); break;
    case "worker_progress": showProcess(e.worker, e.message, "running"); break;
    case "worker_waiting": showProcess(e.worker, e.question, "waiting"); break;
    case "worker_ended": showProcess(e.worker, e.outcome, e.state); break;
    case "branch_started": showProcess(e.branch, e.question, "thinking"); break;
    case "branch_concluded": showProcess(e.branch, e.conclusion, "concluded"); break;
    case "branch_failed": showProcess(e.branch, e.error, "failed"); break;
    case "tool_called": activity(e.process + ": " + e.tool); break;
    case "tool_denied": activity(e.process + ": " + e.tool + " denied: " + e.reason, "denied"); break;
    case "tool_failed": activity(e.process + ": " + e.tool + " failed", "denied"); break;
    case "model_failed": activity(e.process + ": model failed: " + e.error, "denied"); break;
    case "approval_requested":
      activity(e.process + ": " + e.tool + " waits for approval #" + e.approval, "denied");
      showProcess(e.process, e.tool + " waits for approval #" + e.approval, "waiting");
      refreshApprovals();
      break;
  }
}

// The stream could not resume (the server restarted, or what was missed is gone): what is
// shown of live processes may be stale, so start the live panel over and read the state.
function recover(reason) {
  processes.clear();
  document.getElementById("processes").replaceChildren();
  const why = reason === "another_run" ? "the server restarted" : "events were missed";
  activity("(" + why + ": showing what happens from now on)");
  const active = document.querySelector("nav button.active");
  if (active) showView(active.dataset.view);
}

// Follows /v1/events, resuming after the last id seen when the connection drops.
async function follow() {
  let last = null;
  for (;;) {
    try {
      const h = last === null ? {} : { "Last-Event-ID": last };
      const response = await fetch("/v1/events", { headers: headers(h) });
      if (response.status === 401) { document.getElementById("token-form").hidden = false; return; }
      await readSse(response, (event, data, id) => {
        if (id !== null) last = id;
        if (event === "lost") activity("(" + JSON.parse(data).count + " events missed)");
        else if (event === "reset") recover(JSON.parse(data).reason);
        else onEvent(JSON.parse(data));
      });
    } catch (_) { /* reconnect below */ }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function table(id, head, rows, rowClass) {
  const t = document.getElementById(id);
  t.replaceChildren();
  const tr = el("tr");
  for (const h of head) tr.appendChild(el("th", {}, h));
  t.appendChild(tr);
  for (const row of rows) {
    const r = el("tr", rowClass ? { class: rowClass(row) } : {});
    for (const cell of row) r.appendChild(el("td", {}, cell === null || cell === undefined ? "" : String(cell)));
    t.appendChild(r);
  }
}

async function showTasks() {
  const { tasks } = await api("/v1/tasks");
  table("task-table", ["#", "status", "priority", "title", "by"],
    tasks.map((t) => [t.number, t.status, t.priority, t.title, t.creator]));
}

async function showPolicy() {
  const p = await api("/v1/policy");
  table("policy-table", ["tool"].concat(p.kinds), p.rows.map((r) => [r.tool].concat(p.kinds.map((k) => r.kinds[k]))));
}

async function showAudit(more) {
  const path = "/v1/audit?limit=50" + (more && state.auditNext ? "&before=" + state.auditNext : "");
  const page = await api(path);
  const rows = page.entries.map((e) => [new Date(e.at * 1000).toLocaleTimeString(), e.process, e.tool, e.outcome,
    micros(e.duration_us), size(e.peak_memory_bytes), e.requests, e.detail]);
  if (more) {
    const t = document.getElementById("audit-table");
    for (const row of rows) {
      const r = el("tr", { class: row[3] === "ok" ? "" : "denied" });
      for (const cell of row) r.appendChild(el("td", {}, String(cell)));
      t.appendChild(r);
    }
  } else {
    table("audit-table", ["time", "process", "tool", "outcome", "took", "peak memory", "requests", "detail"], rows,
      (r) => (r[3] === "ok" ? "" : "denied"));
  }
  state.auditNext = page.next;
  document.getElementById("audit-more").hidden = page.next === null || page.next === undefined;
}

// The pending approvals: each with its tool, canonical arguments and the labels that
// required it, and buttons to approve or deny it (and, for a call that carries handles'
// values, to approve and endorse them); the count shows in the nav.
async function showApprovals() {
  const { approvals } = await api("/v1/approvals");
  document.getElementById("approvals-waiting").textContent = approvals.length ? "(" + approvals.length + ")" : "";
  const t = document.getElementById("approval-table");
  t.replaceChildren();
  const head = el("tr");
  for (const h of ["#", "process", "tool", "arguments", "because", ""]) head.appendChild(el("th", {}, h));
  t.appendChild(head);
  for (const a of approvals) {
    const r = el("tr", { "data-approval": String(a.id) });
    for (const cell of [a.id, a.process, a.tool, a.arguments, a.label]) r.appendChild(el("td", {}, String(cell)));
    const actions = el("td");
    const verbs = [["approve", "Approve", {}], ["deny", "Deny", {}]];
    if (a.handles && a.handles.length) {
      const named = a.handles.map((h) => h.split(":")[0]).join(", ");
      verbs.splice(1, 0, ["approve", "Approve & endorse " + named, { endorse: true }]);
    }
    for (const [verb, label, body] of verbs) {
      const b = el("button", { class: body.endorse ? "endorse" : verb }, label);
      b.addEventListener("click", () => decide(a.id, verb, body));
      actions.appendChild(b);
    }
    r.appendChild(actions);
    t.appendChild(r);
  }
}

async function decide(id, verb, body) {
  try {
    const a = await api("/v1/approvals/" + id + "/" + verb, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
    });
    activity("approval #" + a.id + " " + a.state + (a.endorsed ? " and endorsed" : "") + " by " + a.decided_by);
  } catch (err) {
    activity(String(err.message || err), "denied");
  }
  refreshApprovals();
}

function refreshApprovals() {
  showApprovals().catch((err) => activity(String(err.message || err), "denied"));
}

function showView(name) {
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === name);
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== name;
  const load = { tasks: showTasks, policy: showPolicy, approvals: showApprovals, audit: () => showAudit(false) }[name];
  if (load) load().catch((err) => activity(String(err.message || err), "denied"));
}

document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => showView(b.dataset.view)));
document.getElementById("audit-more").addEventListener("click", () => showAudit(true));
document.getElementById("send").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("message");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  send(text, document.getElementById("channel").value.trim() || "main");
});
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = document.getElementById("token").value.trim();
  sessionStorage.setItem("capstan-token", state.token);
  document.getElementById("token-form").hidden = true;
  follow();
});
follow();
showApprovals().catch(() => {});
