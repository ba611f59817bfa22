// One job: its spec, state and reason (with the history of reasons), its placement drawn on the
// cluster, its attempts and events, and the tail of a rank's log. Live: events about this job
// refetch it (debounced); a `starting` or `stopping` job is rechecked after 0.5, 1, 2, 4 s; a
// running job's log is followed every 3 s from the last byte read.

import { api } from "../api.js";
import { ClusterMap } from "../clustermap.js";
import { badge, clock, duration, errorBox, esc, queueColour, reasonText, swatch } from "../format.js";
import { debounce, ENDINGS, every, FollowUp } from "../live.js";

const TAIL = 16384;
const MAX_CONTEXT_NODES = 48;

export function mount(el, app, where) {
  const id = where.rest[0];
  el.innerHTML = `<p class="muted">Loading job ${esc(id)}…</p>`;
  let alive = true;
  let job = null;
  let map = null;
  const logs = { rank: 0, attempt: null, offset: 0, text: "", note: "" };

  const load = async () => {
    try {
      const [j, history] = await Promise.all([
        api(`/v1/jobs/${encodeURIComponent(id)}`),
        api(`/v1/jobs/${encodeURIComponent(id)}/events`),
      ]);
      if (!alive) return;
      const first = job === null;
      job = j;
      render(el, j, history, first);
      follow.check(j.state === "starting" || j.state === "stopping");
      await drawPlacement(history);
      if (first) await loadLog(true);
    } catch (err) {
      if (alive && job === null) el.innerHTML = errorBox(err, `job ${id}`);
    }
  };

  const drawPlacement = async (history) => {
    const box = el.querySelector("#placement-map");
    if (!box) return;
    const starts = history.events.filter((e) => e.event === "start");
    const placement = job.placement.length ? job.placement : starts.length ? starts[starts.length - 1].placement : [];
    const caption = el.querySelector("#placement-caption");
    if (!placement.length) {
      box.innerHTML = `<p class="muted">Not placed yet.</p>`;
      return;
    }
    if (!job.placement.length) caption.textContent = `last placement (attempt ${starts[starts.length - 1].attempt})`;
    try {
      await app.store.load();
    } catch (err) {
      box.innerHTML = errorBox(err, "cannot load the cluster");
      return;
    }
    if (!alive) return;
    const mark = new Map();
    for (const p of placement) {
      if (!mark.has(p.node)) mark.set(p.node, new Set());
      p.gpus.forEach((g) => mark.get(p.node).add(g));
    }
    if (map) map.destroy();
    map = new ClusterMap(box, app.store, { only: context(app.store, mark), mark, markColour: queueColour(job.queue) });
    map.render();
  };

  const loadLog = async (fresh) => {
    if (!alive) return; // a timer after leaving: the page may show another job now
    const box = el.querySelector("#log");
    if (!box || !job) return;
    if (!job.attempt) {
      box.innerHTML = `<p class="muted">No log yet: the job has not started.</p>`;
      return;
    }
    try {
      if (fresh) {
        const head = await api(logUrl(id, logs.rank, 0, 0), { raw: true });
        const size = Number(head.headers.get("X-Corral-Size") || 0);
        logs.offset = Math.max(0, size - TAIL);
        logs.text = "";
        logs.note = logs.offset > 0 ? `… the last ${TAIL / 1024} KiB of ${Math.round(size / 1024)} KiB` : "";
      }
      const res = await api(logUrl(id, logs.rank, logs.offset, TAIL * 4), { raw: true });
      const chunk = await res.text();
      logs.attempt = res.headers.get("X-Corral-Attempt");
      logs.offset += new TextEncoder().encode(chunk).length;
      logs.text = (logs.text + chunk).slice(-TAIL * 2);
      if (!alive) return;
      const where = `rank ${logs.rank}, attempt ${esc(logs.attempt || "?")}, node ${esc(res.headers.get("X-Corral-Node") || "?")}`;
      box.innerHTML =
        `<div class="muted">${where}${logs.note ? " · " + esc(logs.note) : ""}</div>` +
        `<pre class="log">${esc(logs.text) || '<span class="muted">(empty so far)</span>'}</pre>`;
      const pre = box.querySelector("pre");
      pre.scrollTop = pre.scrollHeight;
    } catch (err) {
      if (!alive) return;
      box.innerHTML =
        `<p class="muted unavailable">Logs not available: ${esc(err.message)}</p>` +
        (err.fix ? `<p class="muted">${esc(err.fix)}</p>` : "");
    }
  };

  const refetch = debounce(load, 300);
  const follow = new FollowUp(load);
  const offLive = app.live.on((events) => {
    if (!events.some((e) => e.job === id)) return;
    follow.reset();
    refetch();
    if (events.some((e) => e.job === id && (e.event === "start" || ENDINGS.has(e.event)))) setTimeout(() => loadLog(true), 600);
  });
  const stopLog = every(3000, () => {
    if (job && job.state === "running") loadLog(false);
  });
  el.addEventListener("change", (ev) => {
    if (ev.target.id === "rank") {
      logs.rank = Number(ev.target.value);
      loadLog(true);
    }
  });
  load();
  return {
    unmount() {
      alive = false;
      offLive();
      follow.cancel();
      stopLog();
      refetch.cancel();
      if (map) map.destroy();
    },
  };
}

function logUrl(id, rank, offset, limit) {
  return `/v1/jobs/${encodeURIComponent(id)}/logs?rank=${rank}&offset=${offset}&limit=${limit}`;
}

/** The nodes to draw: the placement's, plus the rest of their innermost topology groups when few. */
function context(store, mark) {
  const names = new Set(mark.keys());
  const level = store.levels[store.levels.length - 1];
  if (!level) return names;
  const groups = new Set([...names].map((n) => (store.nodes.get(n) || { labels: {} }).labels[level]));
  const around = [...store.nodes.values()].filter((n) => groups.has(n.labels && n.labels[level]));
  if (around.length <= MAX_CONTEXT_NODES) around.forEach((n) => names.add(n.name));
  return names;
}

/** An argv word as a shell would need it written (for reading; jobs never run through a shell). */
function shellWord(a) {
  if (/^[\w@%+=:,./-]+$/.test(a)) return a;
  if (!a.includes("'")) return `'${a}'`;
  return `"${a.replace(/(["\\$`])/g, "\\$1")}"`;
}

function field(label, value) {
  return `<dt>${esc(label)}</dt><dd>${value}</dd>`;
}

/** A pending or running job's run-time estimate from history (never a limit; cli.md "Jobs"). */
function estimateText(j) {
  const n = j.estimate_drawn_on;
  const source = n ? `from ${n} finished job${n === 1 ? "" : "s"} of ${j.estimate_basis}` : j.estimate_basis;
  const end = j.estimated_end != null ? `ends about ${clock(j.estimated_end)} · ` : "";
  return `${end}${duration(j.estimate)} in all <span class="muted">(${esc(source)}; not a limit)</span>`;
}

function render(el, j, history, first) {
  const spec = [
    field("queue", `${swatch(queueColour(j.queue))}<a href="#/jobs?queue=${encodeURIComponent(j.queue)}">${esc(j.queue)}</a>`),
    field("user", `${esc(j.user)} <span class="muted">(team ${esc(j.team || "–")})</span>`),
    field("priority", `${esc(j.priority_class)} <span class="muted">(${esc(j.priority)})</span>`),
    field("GPUs", `${j.replicas} × ${j.gpus_per_replica} = <b>${j.gpus}</b> <span class="muted">launch ${esc(j.launch)}</span>`),
    field("GPU model", esc((j.gpu_model || []).join(", ") || "any")),
    field("topology", `pack ${esc(j.topology.pack || "tightest")}${j.topology.required ? " (required)" : ""}`),
    field("time limit", j.time_limit ? duration(j.time_limit) : "none"),
    ...(j.estimate != null ? [field("estimate", estimateText(j))] : []),
    ...(j.reserved_start != null ? [field("reserved", `to start at ${clock(j.reserved_start)}`)] : []),
    field("preemptible", j.preemptible ? "yes" : "no"),
    field("attempt", `${j.attempt} <span class="muted">(restarts ${j.restarts} of ${j.max_restarts})</span>`),
    field("submitted", clock(j.submit_time)),
    field("started", clock(j.start_time)),
    field("ended", j.end_time ? `${clock(j.end_time)}${j.exit_code != null ? ` · exit code ${j.exit_code}` : ""}` : "–"),
  ].join("");
  const command = (j.command || []).map(shellWord).join(" ");
  const place = j.placement.length
    ? `<table class="grid compact"><thead><tr><th>rank</th><th>node</th><th>GPUs</th></tr></thead><tbody>` +
      j.placement.map((p, r) => `<tr><td>${r}</td><td>${esc(p.node)}</td><td>${p.gpus.join(", ")}</td></tr>`).join("") +
      `</tbody></table>`
    : "";
  const html = `
    <div class="page-head">
      <h1><a href="#/jobs" class="crumb">Jobs</a> › ${esc(j.id)} <span class="jobname">${esc(j.name)}</span></h1>
      <span id="job-state">${badge(j.state, "big")}${j.held ? ' <span class="badge held big">held</span>' : ""}</span>
    </div>
    ${reasonBox(j, history)}
    <div class="cols">
      <section class="card"><h2>Spec</h2><dl class="spec">${spec}</dl>
        <div class="cmd"><span class="muted">command</span><code>${esc(command)}</code></div></section>
      <section class="card"><h2>Placement <span id="placement-caption" class="muted"></span></h2>${place}
        <div id="placement-map" class="map small"></div></section>
    </div>
    <section class="card"><h2>Attempts</h2>${attempts(history.events)}</section>
    <section class="card"><h2>Events</h2>${events(history.events)}</section>
    <section class="card"><h2>Log <span class="muted">(tail)</span>
      ${j.replicas > 1 ? `<label class="rank">rank <select id="rank">${Array.from({ length: j.replicas }, (_, r) => `<option>${r}</option>`).join("")}</select></label>` : ""}
      </h2><div id="log"><p class="muted">Loading the log…</p></div></section>`;
  if (first) {
    el.innerHTML = html;
    return;
  }
  // later refetches keep the log and the map; the rest is redrawn
  const log = el.querySelector("#log");
  const rank = el.querySelector("#rank");
  const chosen = rank ? rank.value : "0";
  el.innerHTML = html;
  el.querySelector("#log").replaceWith(log);
  if (el.querySelector("#rank")) el.querySelector("#rank").value = chosen;
}

function reasonBox(j, history) {
  const reasons = history.reasons || [];
  const why = reasonText(j.reason, j.reason_at);
  const current = j.reason ? `<p class="why"><b>${esc(j.reason_code || "reason")}</b>: ${esc(why)}</p>` : "";
  if (!current && !reasons.length) return "";
  const title = j.state === "pending" ? (j.held ? "Held" : "Why it waits") : j.state === "stopping" ? "Why it stops" : "Reason";
  const rows = reasons
    .slice(-50)
    .reverse()
    .map((r) => `<tr><td>${clock(r.t)}</td><td><code>${esc(r.code)}</code></td><td>${esc(r.message)}</td></tr>`)
    .join("");
  const table = rows
    ? `<details${j.state === "pending" ? " open" : ""}><summary>history of reasons (${reasons.length})</summary>` +
      `<table class="grid compact"><thead><tr><th>when</th><th>code</th><th>reason</th></tr></thead><tbody>${rows}</tbody></table></details>`
    : "";
  return `<section class="card reason-card rc-${esc(j.state)}"><h2>${title}</h2>${current}${table}</section>`;
}

function attempts(list) {
  const rows = new Map();
  for (const e of list) {
    if (e.event === "start") rows.set(e.attempt, { start: e, end: null, preempting: null });
    else if (e.event === "preempting" && rows.has(e.attempt)) rows.get(e.attempt).preempting = e;
    else if (ENDINGS.has(e.event) && rows.has(e.attempt)) rows.get(e.attempt).end = e;
  }
  if (!rows.size) return `<p class="muted">No attempt yet.</p>`;
  const now = Date.now() / 1000;
  const body = [...rows.entries()]
    .map(([n, r]) => {
      const nodes = [...new Set(r.start.placement.map((p) => p.node))];
      const how = r.end
        ? `${esc(r.end.event)}${r.end.reason ? ": " + esc(r.end.reason) : ""}${r.end.exit_code != null ? ` (exit ${r.end.exit_code})` : ""}`
        : r.preempting
          ? `stopping: preempted by ${esc(r.preempting.by || "?")}`
          : "live";
      return (
        `<tr><td>${n}</td><td>${clock(r.start.t)}</td><td>${r.end ? clock(r.end.t) : "–"}</td>` +
        `<td class="num">${duration((r.end ? r.end.t : now) - r.start.t)}</td>` +
        `<td>${esc(nodes.slice(0, 6).join(", "))}${nodes.length > 6 ? ` +${nodes.length - 6}` : ""}</td><td>${how}</td></tr>`
      );
    })
    .join("");
  return (
    `<table class="grid compact"><thead><tr><th>#</th><th>started</th><th>ended</th><th class="num">ran</th>` +
    `<th>nodes</th><th>outcome</th></tr></thead><tbody>${body}</tbody></table>`
  );
}

const SHOWN = new Set(["seq", "t", "event", "job"]);

function detail(key, value) {
  if (key === "placement" && Array.isArray(value)) return value.map((p) => `${p.node}[${p.gpus.join(",")}]`).join(" ");
  if (key === "topology" && value && typeof value === "object") return `pack ${value.pack || "tightest"}${value.required ? " (required)" : ""}`;
  if (key === "deadline" && typeof value === "number") return clock(value);
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

function events(list) {
  if (!list.length) return `<p class="muted">No events.</p>`;
  const body = list
    .map((e) => {
      const rest = Object.entries(e)
        .filter(([k, v]) => !SHOWN.has(k) && v != null && !(typeof v === "object" && !Object.keys(v).length))
        .map(([k, v]) => `<span class="kv"><span class="k">${esc(k)}</span> ${esc(detail(k, v))}</span>`)
        .join(" ");
      return `<tr><td class="num">${e.seq}</td><td>${clock(e.t)}</td><td><b>${esc(e.event)}</b></td><td class="detail">${rest}</td></tr>`;
    })
    .join("");
  return `<table class="grid compact events"><thead><tr><th class="num">seq</th><th>when</th><th>event</th><th>details</th></tr></thead><tbody>${body}</tbody></table>`;
}
