// Queues: guaranteed quota, limit, GPUs in use, borrowed GPUs, share against fair share, pending
// demand; charts of GPUs in use and waiting per queue over a chosen window. Live: events about
// jobs refetch the queue table (debounced 1 s) and the series (debounced 5 s; every 30 s anyway).

import { api } from "../api.js";
import { chart, seriesUrl, windowPicker, windowSeconds } from "../chart.js";
import { errorBox, esc, num, pct, queueColour, swatch } from "../format.js";
import { debounce, every } from "../live.js";

export function mount(el, app, where) {
  let win = where.query.get("window") || sessionStorage.getItem("corral.window") || "1h";
  el.innerHTML = `
    <div class="page-head"><h1>Queues</h1><span class="spacer"></span><span id="win"></span></div>
    <div id="queue-table"><p class="muted">Loading queues…</p></div>
    <div class="cols">
      <section class="card"><h2>GPUs in use by queue</h2><div id="use-chart" class="chart-box"></div></section>
      <section class="card"><h2>GPUs waiting by queue <span class="muted">(pending demand)</span></h2><div id="wait-chart" class="chart-box"></div></section>
    </div>`;
  let alive = true;
  let queues = [];
  let series = null;

  const loadQueues = async () => {
    try {
      queues = (await api("/v1/queues")).queues;
      if (alive) table(el, queues, series);
    } catch (err) {
      if (alive) el.querySelector("#queue-table").innerHTML = errorBox(err, "cannot list queues");
    }
  };
  const loadSeries = async () => {
    try {
      series = await api(seriesUrl(windowSeconds(win)));
      if (!alive) return;
      charts(el, series);
      table(el, queues, series);
    } catch (err) {
      if (alive) el.querySelector("#use-chart").innerHTML = errorBox(err, "cannot load the series");
    }
  };
  const showWindow = () => {
    el.querySelector("#win").innerHTML = windowPicker(win);
  };
  el.querySelector("#win").addEventListener("click", (ev) => {
    const b = ev.target.closest("[data-win]");
    if (!b) return;
    win = b.dataset.win;
    sessionStorage.setItem("corral.window", win);
    showWindow();
    loadSeries();
  });
  showWindow();
  const refetchQueues = debounce(loadQueues, 1000);
  const refetchSeries = debounce(loadSeries, 5000);
  const offLive = app.live.on((events) => {
    if (events.some((e) => e.job || e.event === "cluster")) {
      refetchQueues();
      refetchSeries();
    }
  });
  const stop = every(30000, loadSeries);
  const onResize = debounce(() => alive && series && charts(el, series), 200);
  window.addEventListener("resize", onResize);
  loadQueues().then(loadSeries);
  return {
    unmount() {
      alive = false;
      offLive();
      stop();
      refetchQueues.cancel();
      refetchSeries.cancel();
      window.removeEventListener("resize", onResize);
      onResize.cancel();
    },
  };
}

function table(el, queues, series) {
  if (!queues.length) {
    el.querySelector("#queue-table").innerHTML = `<p class="empty">No queue you may use.</p>`;
    return;
  }
  const waiting = new Map(((series && series.queues) || []).map((q) => [q.name, q.pending_now]));
  const rows = queues
    .map((q) => {
      const cap = q.limit || Math.max(q.quota, q.allocated_gpus, 1);
      const use = Math.min(100, (q.allocated_gpus / cap) * 100);
      const quota = Math.min(100, (q.quota / cap) * 100);
      const top = Math.max(q.share, q.fair_share, 0.0001);
      return (
        `<tr data-queue="${esc(q.name)}">` +
        `<th>${swatch(queueColour(q.name))}<a href="#/jobs?queue=${encodeURIComponent(q.name)}&state=active">${esc(q.name)}</a></th>` +
        `<td>${esc(q.cohort || "–")}</td><td class="num">${num(q.weight, q.weight % 1 ? 2 : 0)}</td>` +
        `<td class="num">${num(q.quota)}</td><td class="num">${q.limit == null ? "∞" : num(q.limit)}</td>` +
        `<td class="num"><b>${num(q.allocated_gpus)}</b></td>` +
        `<td class="bar-cell"><div class="bar" title="${num(q.allocated_gpus)} in use; quota ${num(q.quota)}; limit ${q.limit == null ? "none" : num(q.limit)}">` +
        `<span class="fill" style="width:${use}%;background:${queueColour(q.name)}"></span>` +
        `<span class="mark" style="left:${quota}%"></span></div></td>` +
        `<td class="num">${q.over_quota ? `<b>${num(q.over_quota)}</b>` : "0"}</td>` +
        `<td class="share"><div class="pair"><span class="sbar" style="width:${(q.share / top) * 100}%;background:${queueColour(q.name)}"></span></div>` +
        `<div class="pair"><span class="sbar fair" style="width:${(q.fair_share / top) * 100}%"></span></div>` +
        `<span class="muted">${pct(q.share, 1)} of ${pct(q.fair_share, 1)}</span></td>` +
        `<td class="num">${num(q.pending_jobs)}</td><td class="num">${series ? num(waiting.get(q.name) || 0) : "…"}</td></tr>`
      );
    })
    .join("");
  el.querySelector("#queue-table").innerHTML =
    `<table class="grid queues"><thead><tr><th>Queue</th><th>Cohort</th><th class="num">Weight</th>` +
    `<th class="num">Quota</th><th class="num">Limit</th><th class="num">In use</th>` +
    `<th>in use (┃ quota) of the limit</th><th class="num">Borrowed</th><th>share of cluster / fair share</th>` +
    `<th class="num">Pending jobs</th><th class="num">GPUs waiting</th></tr></thead><tbody>${rows}</tbody></table>` +
    `<p class="note muted">Borrowed: GPUs in use above the guaranteed quota (lent by the cohort, reclaimable). ` +
    `Fair share: the queue's weight over all weights. GPUs waiting: the GPUs its pending jobs ask for.</p>`;
}

function charts(el, s) {
  const named = s.queues.map((q) => ({ ...q, colour: queueColour(q.name) }));
  chart(el.querySelector("#use-chart"), {
    t: s.t,
    stacked: true,
    unit: "GPUs",
    series: named.map((q) => ({ name: q.name, colour: q.colour, values: q.allocated })),
    lines: [{ name: `cluster: ${num(s.gpus)} GPUs`, colour: "#555", value: s.gpus }],
    empty: "No GPU was in use in this window.",
  });
  chart(el.querySelector("#wait-chart"), {
    t: s.t,
    stacked: false,
    unit: "GPUs",
    series: named.map((q) => ({ name: q.name, colour: q.colour, values: q.pending })),
    empty: "Nothing waited in this window.",
  });
}
