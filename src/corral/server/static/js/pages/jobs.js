// Jobs: a table filtered by state, queue and user, newest first, 50 rows a page. Live: a burst
// of events about jobs costs one refetch of this page (debounced); rows still `starting` or
// `stopping` are checked again after 0.5, 1, 2, 4 s (those changes have no event of their own).

import { api } from "../api.js";
import { ago, badge, duration, errorBox, esc, JOB_STATES, num, queueColour, reasonText, swatch } from "../format.js";
import { debounce, FollowUp } from "../live.js";

const PAGE = 50;
const NEWEST = Number.MAX_SAFE_INTEGER;

export function mount(el, app, where) {
  const q = where.query;
  const filters = { state: q.get("state") || "", queue: q.get("queue") || "", user: q.get("user") || "" };
  el.innerHTML = `
    <div class="page-head">
      <h1>Jobs</h1>
      <form id="filters" class="filters">
        <label>State <select name="state">
          <option value="">any</option><option value="active">active (pending or live)</option>
          ${JOB_STATES.map((s) => `<option value="${s}">${s}</option>`).join("")}
        </select></label>
        <label>Queue <select name="queue"><option value="">any</option></select></label>
        <label>User <input name="user" type="search" placeholder="any" size="12"></label>
      </form>
      <span class="spacer"></span>
      <span id="count" class="muted"></span>
    </div>
    <div id="table"><p class="muted">Loading jobs…</p></div>
    <div class="pager">
      <button type="button" id="newer" disabled>← Newer</button>
      <span id="page" class="muted"></span>
      <button type="button" id="older" disabled>Older →</button>
    </div>`;
  const form = el.querySelector("#filters");
  form.state.value = filters.state;
  form.user.value = filters.user;
  api("/v1/queues")
    .then(({ queues }) => {
      for (const queue of queues) form.queue.insertAdjacentHTML("beforeend", `<option>${esc(queue.name)}</option>`);
      form.queue.value = filters.queue;
    })
    .catch(() => {});

  let cursors = [NEWEST]; // `before` of each page we went through; the last is this page's
  let rows = [];
  let alive = true;

  const load = async () => {
    const params = new URLSearchParams({ limit: String(PAGE + 1), before: String(cursors[cursors.length - 1]) });
    if (filters.state) params.set("state", filters.state);
    if (filters.queue) params.set("queue", filters.queue);
    if (filters.user) params.set("user", filters.user);
    try {
      const { jobs } = await api(`/v1/jobs?${params}`);
      if (!alive) return;
      rows = jobs.slice(0, PAGE);
      render(el, rows, jobs.length > PAGE, cursors.length);
      follow.check(rows.some((r) => r.state === "starting" || r.state === "stopping"));
    } catch (err) {
      if (alive) el.querySelector("#table").innerHTML = errorBox(err, "cannot list jobs");
    }
  };
  const refetch = debounce(load, 400);
  // `starting` -> `running` has no event: look again soon, then less often
  const follow = new FollowUp(load);

  const setFilters = () => {
    if (!alive) return; // a debounced keystroke after leaving the page
    filters.state = form.state.value;
    filters.queue = form.queue.value;
    filters.user = form.user.value.trim();
    const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    history.replaceState(null, "", `#/jobs${query.toString() ? "?" + query : ""}`);
    cursors = [NEWEST];
    load();
  };
  form.addEventListener("change", setFilters);
  form.user.addEventListener("input", debounce(setFilters, 400));
  form.addEventListener("submit", (ev) => ev.preventDefault());
  el.querySelector("#older").addEventListener("click", () => {
    if (rows.length) cursors.push(rows[rows.length - 1].seq);
    load();
  });
  el.querySelector("#newer").addEventListener("click", () => {
    if (cursors.length > 1) cursors.pop();
    load();
  });
  el.querySelector("#table").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-job]");
    if (tr && !ev.target.closest("a")) location.hash = `#/jobs/${encodeURIComponent(tr.dataset.job)}`;
  });

  const offLive = app.live.on((events) => {
    const shown = new Set(rows.map((r) => r.id));
    const touches = events.some((e) => e.job && (cursors.length === 1 || shown.has(e.job)));
    if (touches) {
      follow.reset();
      refetch();
    }
  });
  load();
  return {
    unmount() {
      alive = false;
      offLive();
      follow.cancel();
      refetch.cancel();
    },
  };
}

function render(el, rows, more, page) {
  const now = Date.now() / 1000;
  el.querySelector("#newer").disabled = page <= 1;
  el.querySelector("#older").disabled = !more;
  el.querySelector("#page").textContent = rows.length ? `page ${page} · newest first` : "";
  el.querySelector("#count").textContent = rows.length ? `${num(rows.length)}${more ? "+" : ""} shown` : "";
  if (!rows.length) {
    el.querySelector("#table").innerHTML = `<p class="empty">No jobs match.</p>`;
    return;
  }
  const body = rows
    .map((j) => {
      const waited = j.start_time ? j.start_time - j.submit_time : (j.end_time || now) - j.submit_time;
      const ran = j.start_time ? (j.end_time || now) - j.start_time : null;
      const why = j.state === "pending" || j.state === "failed" || j.state === "rejected" ? reasonText(j.reason, j.reason_at, now) : "";
      const gpus = j.replicas > 1 ? `${j.replicas} × ${j.gpus_per_replica}` : `${j.gpus}`;
      return (
        `<tr data-job="${esc(j.id)}" class="click">` +
        `<td><a href="#/jobs/${encodeURIComponent(j.id)}">${esc(j.id)}</a></td>` +
        `<td class="name">${esc(j.name)}</td><td>${badge(j.state)}${j.held ? ' <span class="badge held">held</span>' : ""}</td>` +
        `<td>${swatch(queueColour(j.queue))}${esc(j.queue)}</td><td>${esc(j.user)}</td>` +
        `<td class="num">${gpus}</td><td>${esc(j.priority_class)}</td>` +
        `<td title="${esc(new Date(j.submit_time * 1000).toLocaleString())}">${ago(j.submit_time, now)}</td>` +
        `<td class="num">${duration(waited)}</td><td class="num">${ran == null ? "–" : duration(ran)}</td>` +
        `<td class="reason" title="${esc(why)}">${esc(why)}</td></tr>`
      );
    })
    .join("");
  el.querySelector("#table").innerHTML =
    `<table class="grid jobs"><thead><tr><th>Job</th><th>Name</th><th>State</th><th>Queue</th><th>User</th>` +
    `<th class="num">GPUs</th><th>Priority</th><th>Submitted</th><th class="num">Waited</th>` +
    `<th class="num">Ran</th><th>Reason</th></tr></thead><tbody>${body}</tbody></table>`;
}
