// The dashboard page: renders the state pushed by the server (server-sent events).
// No framework, no build step; charts are inline SVG.
"use strict";

let state = null;        // the latest pushed state
let clockSkew = 0;       // server time minus browser time (seconds)
const cards = {};        // app name -> its card's elements
let selected = null;     // the app shown (from the address: #app=NAME), else the first

// an application's state (model.py AppModel.state) as its badge says it
const STATES = {
  active: ["running", "ok"], "no leader": ["no master elected", "warn"],
  stale: ["stale: no live process", "bad"], cancelled: ["cancelled", "warn"], done: ["done", "ok"],
};

const esc = (v) => String(v ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmt = (n) => (typeof n === "number" ? (Number.isInteger(n) ? n.toLocaleString("en")
  : n.toLocaleString("en", { maximumFractionDigits: 2 })) : esc(n));
const now = () => Date.now() / 1000 + clockSkew;

function ago(t) {
  if (typeof t !== "number") return "-";
  const s = Math.max(0, now() - t);
  return s < 60 ? `${s.toFixed(0)}s ago` : s < 3600 ? `${(s / 60).toFixed(0)}m ago`
    : `${(s / 3600).toFixed(1)}h ago`;
}

function connect() {
  const source = new EventSource("/events");
  const link = document.getElementById("link");
  source.onopen = () => { link.textContent = "live"; link.className = "pill ok"; };
  source.onerror = () => { link.textContent = "reconnecting…"; link.className = "pill bad"; };
  source.onmessage = (event) => {
    state = JSON.parse(event.data);
    clockSkew = state.at - Date.now() / 1000;
    render();
  };
}

function render() {
  const zk = document.getElementById("zk");
  zk.textContent = `ZooKeeper: ${state.session}`;
  zk.className = "pill " + (state.session === "connected" ? "ok" : "bad");
  const mode = document.getElementById("mode");
  mode.textContent = state.allow_actions ? "actions enabled" : "read-only";
  mode.className = "pill " + (state.allow_actions ? "warn" : "");
  document.getElementById("viewers").textContent =
    `${state.viewers} viewer${state.viewers === 1 ? "" : "s"}`;
  const main = document.getElementById("apps");
  const empty = document.getElementById("empty");
  empty.textContent = state.apps.length ? "" : "No application under /apps yet.";
  empty.style.display = state.apps.length ? "none" : "";
  const names = new Set(state.apps.map((a) => a.name));
  for (const name of Object.keys(cards)) {
    if (!names.has(name)) { cards[name].root.remove(); delete cards[name]; }
  }
  const wanted = decodeURIComponent((location.hash.match(/^#app=(.*)$/) || [])[1] ?? "");
  // the apps come running first: without a choice in the address, the first is shown; an
  // app the address names that is not there is said, never replaced by another
  const missing = wanted !== "" && !names.has(wanted);
  selected = missing ? null : wanted || ((state.apps[0] ?? {}).name ?? null);
  if (missing) {
    empty.textContent = `No application "${wanted}" in this ZooKeeper` +
      (state.apps.length ? ": choose one above." : ".");
    empty.style.display = "";
    empty.dataset.missing = wanted;
  } else {
    delete empty.dataset.missing;
  }
  renderSelector();
  for (const app of state.apps) {
    if (!cards[app.name]) { cards[app.name] = makeCard(app.name); main.appendChild(cards[app.name].root); }
    const shown = app.name === selected;
    cards[app.name].root.hidden = !shown;
    if (shown) fillCard(cards[app.name], app);
  }
}

function renderSelector() {
  setHTML(document.getElementById("selector"), state.apps.map((app) => {
    const [label] = STATES[app.state] ?? [app.state];
    const members = app.workers.length;
    return `<a href="#app=${encodeURIComponent(app.name)}" class="app-link ${esc(app.state)}` +
      `${app.name === selected ? " selected" : ""}" data-app="${esc(app.name)}" ` +
      `data-state="${esc(app.state)}"><b>${esc(app.name)}</b>` +
      `<span class="badge ${esc((STATES[app.state] ?? [])[1] ?? "")}">${esc(label)}</span>` +
      `<span class="count">${fmt(members)} member${members === 1 ? "" : "s"}, ` +
      `${fmt(app.queue.depth)} queued</span></a>`;
  }).join(""));
}

function makeCard(name) {
  const root = document.createElement("article");
  root.className = "app";
  root.id = `app-${name}`;
  root.dataset.app = name;
  root.innerHTML = `
    <h2><span>${esc(name)}</span><span class="badge job"></span></h2>
    <div class="stats"></div>
    <div class="grid">
      <section><h3>Masters</h3><div class="masters"></div></section>
      <section><h3>Queue depth</h3><div class="chart-depth"></div>
        <div class="queues"></div></section>
      <section><h3>Throughput (tasks/s)</h3><div class="chart-rate"></div></section>
      <section><h3>Task durations (timed by the workers)</h3><div class="durations"></div></section>
    </div>
    <section><h3>Members (workers/)</h3><div class="workers"></div></section>
    <div class="grid">
      <section><h3>Dead letters</h3><div class="dead"></div></section>
      <section><h3>Recent failures</h3><div class="failures"></div></section>
    </div>
    <section class="task-list"><h3>Tasks (recent results)</h3>
      <form class="task-filter">
        <label>type <select name="type"><option value="">all</option></select></label>
        <label>outcome <select name="outcome"><option value="">all</option>
          <option value="succeeded">succeeded</option><option value="failed">failed</option>
          <option value="revoked">revoked</option>
          <option value="expired">expired</option></select></label>
      </form>
      <div class="tasks"></div></section>
    <div class="grid">
      <section><h3>Delayed tasks</h3><div class="delayed"></div></section>
      <section><h3>Schedules</h3><div class="schedules"></div></section>
    </div>
    <div class="grid">
      <section><h3>Result lookup</h3>
        <form class="lookup"><input name="key" placeholder="task id or key" size="24">
          <button type="submit">Look up</button></form>
        <div class="lookup-result"></div></section>
      <section><h3>Configuration</h3><div class="config"></div></section>
      <section><h3>Shard assignments</h3><div class="shards"></div></section>
      <section><h3>Application counters</h3><div class="app-counters"></div></section>
    </div>`;
  const card = { root, name };
  for (const cls of ["job", "stats", "masters", "chart-depth", "queues", "chart-rate", "durations", "workers", "dead",
                     "failures", "lookup-result", "config", "shards", "app-counters", "tasks",
                     "delayed", "schedules", "task-filter"]) {
    card[cls] = root.querySelector("." + cls);
  }
  root.querySelector("form.lookup").addEventListener("submit", (event) => {
    event.preventDefault();
    lookup(card, event.target.key.value.trim());
  });
  root.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) act(card, button.dataset.action, button.dataset.name, button);
  });
  card["task-filter"].addEventListener("change", () => { if (card.app) fillTasks(card, card.app); });
  return card;
}

function setHTML(element, html) {
  if (element._html !== html) { element.innerHTML = html; element._html = html; }
}

function fillCard(card, app) {
  const [label, tone] = STATES[app.state] ?? [app.state, ""];
  card.job.textContent = app.done ? `job finished by ${app.done.master ?? "?"}` : label;
  card.job.className = `badge job ${tone}`;
  card.job.dataset.state = app.state;
  const stat = (label, value, title) =>
    `<div class="stat" data-stat="${label}" title="${esc(title)}"><b>${fmt(value)}</b>` +
    `<span>${label}</span></div>`;
  const seen = "counted from the members' status reports since this dashboard started";
  setHTML(card.stats, [
    stat("queue depth", app.queue.depth, "tasks queued or being handled"),
    stat("claimed", app.queue.claimed, "tasks a worker has claimed"),
    stat("running", app.running, "tasks being handled now"),
    stat("members", app.workers.length, "live members of the app's workers/ group"),
    stat("results", app.results ?? "…", "the app's result records: tasks that succeeded, " +
      "failed for good or were revoked (framework status counts them the same way)"),
    stat("dead letters", app.dead_total, "tasks given up and not requeued or deleted"),
    stat("done (seen)", app.totals.done, `tasks done: ${seen}`),
    stat("failed attempts (seen)", app.totals.failed, `failed attempts: ${seen}`),
    stat("retried (seen)", app.totals.retried, `retries: ${seen}`),
    stat("leader changes", app.totals.leader_changes, "seen by this dashboard"),
    stat("duties", app.duty_holder ?? "-", "the worker elected to move delayed tasks, fire " +
      "schedules and apply retention when no master leads (worker-only deployments)")].join(""));
  const who = (m) => `${esc(m.name ?? m.node)} <span class="muted">${esc(m.host ?? "")}` +
    `${m.pid ? ":" + esc(m.pid) : ""} ${esc(m.address ?? "")}</span>`;
  setHTML(card.masters, app.leader
    ? `<div class="leader" data-leader="${esc(app.leader.name)}"><span class="dot ok"></span>` +
      `leader <b class="leader-name">${who(app.leader)}</b> ` +
      `<span class="muted">token ${esc(app.leader.token)}</span></div>` +
      (app.standbys.length ? app.standbys.map((m) =>
        `<div class="standby" data-standby="${esc(m.name)}"><span class="dot warn"></span>standby ${who(m)}</div>`).join("")
        : `<div class="muted">no standby</div>`)
    : `<div class="leader none"><span class="dot bad"></span>no master elected</div>`);
  const s = app.series;
  setHTML(card["chart-depth"], chart(s.t, [{ values: s.depth, color: "#2f6fde", label: "items" }]));
  setHTML(card.queues, queuesTable(app.queue.queues ?? []));
  setHTML(card["chart-rate"], chart(s.t, [
    { values: s.done_rate, color: "#1f9d55", label: "done/s" },
    { values: s.failed_rate, color: "#d64545", label: "failed/s" }]));
  setHTML(card.durations, histogram(app.durations));
  setHTML(card.workers, workersTable(app.workers, state.allow_actions));
  card.app = app;
  fillTasks(card, app);
  setHTML(card.delayed, delayedTable(app, state.allow_actions));
  setHTML(card.schedules, schedulesTable(app.schedules));
  setHTML(card.dead, deadTable(app, state.allow_actions));
  setHTML(card.failures, app.failures.length ? `<table><tr><th>task</th><th>worker</th>` +
    `<th>attempt</th><th>error</th></tr>` + app.failures.map((f) =>
      `<tr class="failure"><td>${esc(f.key ?? f.task_id)}</td><td>${esc(f.worker)}</td>` +
      `<td>${esc(f.attempts)}</td><td><pre class="error">${esc(f.error)}</pre>` +
      traceback(f.traceback) +
      `<span class="muted">${ago(f.finished_at)}</span></td></tr>`).join("") + `</table>`
    : `<div class="muted">none</div>`);
  setHTML(card.config, app.config ? `<div class="muted">version ${esc(app.config.version)}</div>` +
    `<pre>${esc(JSON.stringify(app.config.value, null, 2))}</pre>` : `<div class="muted">none published</div>`);
  const shards = Object.entries(app.assignments);
  setHTML(card.shards, shards.length ? `<table><tr><th>shard</th><th>worker</th></tr>` +
    shards.map(([sh, w]) => `<tr><td>${esc(sh)}</td><td>${esc(w)}</td></tr>`).join("") + `</table>`
    : `<div class="muted">${app.shards.length ? app.shards.length + " shards, none assigned" : "no shards"}</div>`);
  const counters = { ...app.worker_counters, ...app.counters };
  const entries = Object.entries(counters).filter(([k]) => k !== "at");
  setHTML(card["app-counters"], entries.length ? `<div class="counters">` + entries.map(([k, v]) =>
    `<span data-counter="${esc(k)}">${esc(k)} <b>${typeof v === "object" ? esc(JSON.stringify(v)) : fmt(v)}</b></span>`).join("") +
    `</div>` : `<div class="muted">none (see docs/dashboard.md: the counters hook)</div>`);
}

// what the actions switch allows, or why a button is disabled
function actionAttrs(allowed) {
  return allowed ? "" : ' disabled title="read-only: start the dashboard with --allow-actions"';
}

function revokeButton(taskId, allowed, revoked) {
  if (revoked) return `<span class="badge warn revoked">revoked</span>`;
  return `<button class="revoke" data-action="revoke" data-name="${esc(taskId)}"${actionAttrs(allowed)}>revoke</button>`;
}

const seconds = (d) => (typeof d !== "number" ? "-" : d < 1 ? `${(d * 1000).toFixed(1)} ms` : `${d.toFixed(2)} s`);

function until(t) {
  if (typeof t !== "number") return "-";
  const s = t - now();
  const when = new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  return `${when} <span class="muted">(${s >= 0 ? "in " + s.toFixed(0) + "s" : ago(t)})</span>`;
}

function fillTasks(card, app) {
  const form = card["task-filter"];
  const select = form.elements.namedItem("type");
  const types = [...new Set(app.recent.map((r) => r.type))].sort();
  const options = ["", ...types].join("\n");
  if (select._options !== options) {
    const chosen = select.value;
    select.innerHTML = `<option value="">all</option>` +
      types.map((t) => `<option value="${esc(t)}">${esc(t)}</option>`).join("");
    select.value = types.includes(chosen) ? chosen : "";
    select._options = options;
  }
  const type = select.value, outcome = form.elements.namedItem("outcome").value;
  const rows = app.recent.filter((r) => (!type || r.type === type) && (!outcome || r.outcome === outcome));
  const tone = { succeeded: "ok", failed: "bad", revoked: "warn", expired: "warn" };
  setHTML(card.tasks, rows.length ? `<table><tr><th>task</th><th>type</th><th>outcome</th>` +
    `<th>duration</th><th>worker</th><th>attempts</th><th>finished</th></tr>` + rows.map((r) =>
      `<tr class="result" data-task="${esc(r.key)}" data-type="${esc(r.type)}" data-outcome="${esc(r.outcome)}">` +
      `<td>${esc(r.key)}</td><td>${esc(r.type)}</td>` +
      `<td><span class="badge ${tone[r.outcome] ?? ""}">${esc(r.outcome)}</span>` +
      (r.error && r.error !== r.outcome ? ` <span class="muted error-text">${esc(String(r.error).slice(0, 120))}</span>` : "") + `</td>` +
      `<td>${seconds(r.duration)}</td><td>${esc(r.worker)}</td><td>${esc(r.attempts)}</td>` +
      `<td>${ago(r.finished_at)}</td></tr>`).join("") + `</table>` +
    `<div class="muted">${rows.length} of the ${app.recent.length} most recent results shown</div>`
    : `<div class="muted">${app.recent.length ? "no result matches the filter" : "no result yet"}</div>`);
}

function delayedTable(app, allowed) {
  if (!app.delayed_total) return `<div class="muted">none</div>`;
  return `<table><tr><th>task</th><th>type</th><th>due (UTC)</th><th>priority</th><th></th></tr>` +
    app.delayed.map((d) =>
      `<tr class="delayed-task" data-task="${esc(d.task_id)}"><td>${esc(d.task_id)}</td><td>${esc(d.type)}</td>` +
      `<td>${until(d.due)}</td><td>${esc(d.priority)}</td><td>${revokeButton(d.task_id, allowed, d.revoked)}</td></tr>`
    ).join("") + `</table>` +
    (app.delayed_total > app.delayed.length ? `<div class="muted">and ${app.delayed_total - app.delayed.length} more</div>` : "");
}

function queuesTable(queues) {
  // one row per queue (default first): its depth, claims and the running workers serving it
  if (!queues.length) return "";
  return `<table class="queue-table"><tr><th>queue</th><th>queued</th><th>claimed</th><th>served by</th></tr>` +
    queues.map((q) =>
      `<tr class="queue-row" data-queue="${esc(q.name)}"><td>${esc(q.name)}</td>` +
      `<td class="queue-depth">${fmt(q.depth)}</td><td>${fmt(q.claimed)}</td>` +
      `<td class="queue-workers">${q.workers.length ? esc(q.workers.join(", "))
        : '<span class="muted" title="no running worker serves this queue: its tasks wait (framework run ... -Q)">none</span>'}</td></tr>`
    ).join("") + `</table>`;
}

function schedulesTable(schedules) {
  if (!schedules.length) return `<div class="muted">none recorded (schedules/)</div>`;
  return `<table><tr><th>schedule</th><th>task</th><th>every</th><th>last slot</th><th>fires</th><th>next fire</th></tr>` +
    schedules.map((s) =>
      `<tr class="schedule" data-schedule="${esc(s.name)}"><td>${esc(s.name)}</td><td>${esc(s.task ?? "-")}</td>` +
      `<td>${esc(s.every ?? "-")}</td><td>${s.last_slot ? until(s.last_slot) : "-"}</td><td>${fmt(s.fires)}</td>` +
      `<td class="next-fire">${s.next_fire ? until(s.next_fire) : '<span class="muted" title="start the dashboard with --schedules MODULE:CLASS">unknown</span>'}</td></tr>`
    ).join("") + `</table>`;
}

function workersTable(workers, allowed) {
  if (!workers.length) return `<div class="muted">no live member</div>`;
  const rows = workers.map((w) => {
    const ok = (w.health ?? {}).ok !== false;
    const load = Math.min(1, Math.max(0, w.load ?? 0));
    const tasks = (w.tasks ?? []).map((t) => {
      const frac = t.total ? Math.min(1, t.done / t.total) : null;
      return `<div class="task" data-task="${esc(t.task)}">${esc(t.task)} ` +
        (t.type ? `<span class="kind">${esc(t.type)}</span> ` : "") +
        (frac !== null ? `<span class="bar"><i style="width:${(frac * 100).toFixed(0)}%"></i></span> ` +
          `${fmt(t.done)}/${fmt(t.total)}` : `<span class="muted">started ${ago(t.started)}</span>`) +
        (t.message ? ` <span class="muted">${esc(t.message)}</span>` : "") +
        ` ${revokeButton(t.task, allowed, t.revoked)}</div>`;
    }).join("");
    const counters = Object.entries(w.counters ?? {}).map(([k, v]) =>
      `<span>${esc(k)} <b>${fmt(v)}</b></span>`).join("");
    return `<tr class="worker" data-worker="${esc(w.name)}" data-kind="${esc(w.kind)}">` +
      `<td><span class="dot ${ok ? "ok" : "bad"}"></span><b>${esc(w.name)}</b> ` +
      `<span class="kind">${esc(w.kind)}</span>` +
      `<div class="muted">${esc(w.host ?? "")}${w.pid ? ":" + esc(w.pid) : ""}</div></td>` +
      `<td>${esc(w.state)}</td>` +
      `<td class="duties" data-duties="${esc(w.duties ?? "")}">${esc(w.duties ?? "-")}</td>` +
      `<td><span class="bar"><i style="width:${(load * 100).toFixed(0)}%"></i></span> ${(load * 100).toFixed(0)}%</td>` +
      `<td>${fmt(w.in_flight ?? 0)}</td><td>${fmt(w.done ?? 0)}</td><td>${fmt(w.failed ?? 0)}</td>` +
      `<td>${tasks || '<span class="muted">idle</span>'}</td>` +
      `<td><div class="counters">${counters}</div></td>` +
      `<td class="heartbeat muted" data-at="${esc(w.at)}">${ago(w.at)}</td></tr>`;
  }).join("");
  // a listed member is alive (its session keeps its node: no status writes needed); its
  // status is written when it changes, so a busy, healthy member may not have written lately
  return `<table><tr><th>member</th><th>state</th><th title="the app's duties (delayed tasks, ` +
    `schedules, retention) in worker-only deployments: held, deferred (a master leads), ` +
    `standby or off">duties</th><th>load</th><th>in flight</th><th>done</th>` +
    `<th>failed</th><th>progress</th><th>counters</th><th title="a listed member is alive ` +
    `(its ZooKeeper session keeps it listed); this is when it last changed its status">` +
    `status changed</th></tr>${rows}</table>`;
}

// the durations histogram: tasks per bucket (the cumulative counts, differenced)
function histogram(h) {
  const total = h.counts[h.counts.length - 1] ?? 0;
  if (!total) return `<div class="muted">no task finished yet</div>`;
  const per = h.counts.map((c, i) => c - (i ? h.counts[i - 1] : 0));
  const labels = h.bounds.map((b) => `≤${b < 1 ? (b * 1000).toFixed(0) + "ms" : b + "s"}`).concat(["more"]);
  const W = 320, H = 110, B = 16, n = per.length, bw = (W - 8) / n, max = Math.max(...per);
  const bars = per.map((c, i) => {
    const h2 = c ? Math.max(1, (H - B - 14) * c / max) : 0;
    return `<rect x="${(4 + i * bw).toFixed(1)}" y="${(H - B - h2).toFixed(1)}" width="${(bw - 2).toFixed(1)}" ` +
      `height="${h2.toFixed(1)}" fill="#2f6fde"><title>${labels[i]}: ${c}</title></rect>` +
      (c ? `<text x="${(4 + i * bw + bw / 2).toFixed(1)}" y="${(H - B - h2 - 2).toFixed(1)}" text-anchor="middle">${fmt(c)}</text>` : "") +
      (i % 3 === 0 ? `<text x="${(4 + i * bw + bw / 2).toFixed(1)}" y="${H - 3}" text-anchor="middle">${labels[i]}</text>` : "");
  }).join("");
  return `<svg class="chart" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none">${bars}</svg>` +
    `<div class="legend" data-durations="${total}">${fmt(total)} attempts, mean ` +
    `${(h.sum / total * 1000).toFixed(1)} ms</div>`;
}

function traceback(text) {
  return text ? `<details class="traceback"><summary>traceback</summary><pre>${esc(text)}</pre></details>` : "";
}

function deadTable(app, allowed) {
  if (!app.dead_letters.length) return `<div class="muted">none</div>`;
  const title = allowed ? "" : ' title="read-only: start the dashboard with --allow-actions"';
  const disabled = allowed ? "" : " disabled";
  return `<table><tr><th>task</th><th>deliveries</th><th>error</th><th></th></tr>` +
    app.dead_letters.map((d) =>
      `<tr class="dead-letter" data-task="${esc(d.task_id)}" data-name="${esc(d.name)}">` +
      `<td><b>${esc(d.task_id)}</b><pre>${esc(JSON.stringify(d.payload))}</pre></td>` +
      `<td>${esc(d.attempts)}</td><td><pre class="error">${esc(d.error ?? "-")}</pre>` +
      `${traceback(d.traceback)}</td>` +
      `<td><button class="requeue" data-action="requeue" data-name="${esc(d.name)}"${disabled}${title}>requeue</button> ` +
      `<button class="discard" data-action="discard" data-name="${esc(d.name)}"${disabled}${title}>discard</button></td></tr>`
    ).join("") + `</table>` +
    (app.dead_total > app.dead_letters.length ? `<div class="muted">and ${app.dead_total - app.dead_letters.length} more</div>` : "");
}

function chart(times, series) {
  const W = 320, H = 110, L = 42, B = 16;
  const all = series.flatMap((s) => s.values);
  const max = Math.max(1, ...all);
  const n = times.length;
  const x = (i) => L + (n > 1 ? (i / (n - 1)) * (W - L - 4) : 0);
  const y = (v) => 4 + (H - B - 4) * (1 - v / max);
  const lines = series.map((s) => s.values.length > 1
    ? `<polyline fill="none" stroke="${s.color}" stroke-width="1.6" points="${
        s.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ")}"/>` : "").join("");
  const span = n > 1 ? Math.round(times[n - 1] - times[0]) : 0;
  const last = series.map((s) => s.values.length ? fmt(s.values[s.values.length - 1]) : "-");
  return `<svg class="chart" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none">` +
    `<line x1="${L}" y1="${H - B}" x2="${W}" y2="${H - B}" stroke="#ccd"/>` +
    `<line x1="${L}" y1="4" x2="${L}" y2="${H - B}" stroke="#ccd"/>` +
    `<text x="${L - 4}" y="12" text-anchor="end">${fmt(max)}</text>` +
    `<text x="${L - 4}" y="${H - B}" text-anchor="end">0</text>` +
    `<text x="${L}" y="${H - 3}">-${span}s</text><text x="${W - 4}" y="${H - 3}" text-anchor="end">now</text>` +
    lines + `</svg><div class="legend">` + series.map((s, i) =>
      `<i style="background:${s.color}"></i>${esc(s.label)} ${last[i]}`).join("") + `</div>`;
}

async function lookup(card, key) {
  const out = card["lookup-result"];
  if (!key) return;
  out.innerHTML = `<span class="muted">looking up…</span>`;
  const response = await fetch(`/api/result?app=${encodeURIComponent(card.name)}&key=${encodeURIComponent(key)}`);
  const doc = await response.json();
  if (!response.ok) { out.innerHTML = `<span class="error">${esc(doc.error)}</span>`; return; }
  if (!doc.found) { out.innerHTML = `<span class="lookup-status" data-status="missing">no result for ${esc(key)}</span>`; return; }
  const r = doc.result;
  const outcome = r.outcome ?? (r.ok ? "succeeded" : "failed");
  out.innerHTML = `<div class="lookup-status" data-status="${r.ok ? "ok" : "failed"}" data-outcome="${esc(outcome)}">` +
    `<span class="dot ${r.ok ? "ok" : "bad"}"></span>${esc(outcome)} ` +
    `on ${esc(r.worker)} after ${esc(r.attempts)} attempt(s)</div>` +
    `<pre>${esc(JSON.stringify(r.ok ? r.result : r.error, null, 2))}</pre>`;
}

async function act(card, action, name, button) {
  if (action === "discard" && !confirm(`Discard dead letter ${name} for good?`)) return;
  if (action === "revoke" && !confirm(`Revoke task ${name}? It will not run (cancelled if running).`)) return;
  button.disabled = true;
  const response = await fetch(`/api/${action}`, {
    method: "POST", headers: { "Content-Type": "application/json", "X-Dashboard-Action": "1" },
    body: JSON.stringify({ app: card.name, name }) });
  const doc = await response.json();
  if (!response.ok) { alert(doc.error); button.disabled = false; }
}

// the ages ("3s ago") move on between pushes
setInterval(() => {
  for (const cell of document.querySelectorAll("td.heartbeat")) {
    cell.textContent = ago(parseFloat(cell.dataset.at));
  }
}, 1000);

window.addEventListener("hashchange", () => { if (state) render(); });

connect();
