// Utilisation over time: the cluster's GPUs allocated as a share of all its GPUs, and each
// queue's share, over a chosen window; a table of GPU-hours per queue in the window.

import { api } from "../api.js";
import { chart, seriesUrl, windowPicker, windowSeconds } from "../chart.js";
import { errorBox, esc, num, pct, queueColour, swatch } from "../format.js";
import { debounce, every } from "../live.js";

export function mount(el, app, where) {
  let win = where.query.get("window") || sessionStorage.getItem("corral.window") || "1h";
  el.innerHTML = `
    <div class="page-head"><h1>Utilisation</h1><div id="figures" class="summary"></div>
      <span class="spacer"></span><span id="win"></span></div>
    <section class="card"><h2>Cluster: GPUs allocated / all GPUs</h2><div id="cluster-chart" class="chart-box"></div></section>
    <section class="card"><h2>Per queue: share of the cluster's GPUs</h2><div id="queue-chart" class="chart-box"></div></section>
    <section class="card"><h2>Per queue in this window</h2><div id="usage-table"></div></section>`;
  let alive = true;
  let data = null;
  const load = async () => {
    try {
      data = await api(seriesUrl(windowSeconds(win)));
      if (alive) draw(el, data, app);
    } catch (err) {
      if (alive) el.querySelector("#cluster-chart").innerHTML = errorBox(err, "cannot load utilisation");
    }
  };
  const showWindow = () => (el.querySelector("#win").innerHTML = windowPicker(win));
  el.querySelector("#win").addEventListener("click", (ev) => {
    const b = ev.target.closest("[data-win]");
    if (!b) return;
    win = b.dataset.win;
    sessionStorage.setItem("corral.window", win);
    showWindow();
    load();
  });
  showWindow();
  const refetch = debounce(load, 5000);
  const offLive = app.live.on((events) => {
    if (events.some((e) => e.event === "start" || e.event === "cluster" || e.attempt != null)) refetch();
  });
  const stop = every(30000, load);
  const onResize = debounce(() => alive && data && draw(el, data, app), 200);
  window.addEventListener("resize", onResize);
  load();
  return {
    unmount() {
      alive = false;
      offLive();
      stop();
      refetch.cancel();
      window.removeEventListener("resize", onResize);
      onResize.cancel();
    },
  };
}

function hoursText(h) {
  return num(h, h < 10 ? 2 : 1);
}

function mean(values) {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : 0;
}

function draw(el, s, app) {
  const gpus = s.gpus || 0;
  const share = (values) => values.map((v) => (gpus ? v / gpus : 0));
  const cluster = share(s.cluster.allocated);
  const avg = mean(cluster);
  const now = gpus ? s.cluster.allocated_now / gpus : 0;
  const peak = Math.max(now, ...cluster);
  el.querySelector("#figures").innerHTML =
    `<span>now <b>${pct(now, 1)}</b></span><span>average <b>${pct(avg, 1)}</b></span>` +
    `<span>peak <b>${pct(peak, 1)}</b></span><span>of <b>${num(gpus)}</b> GPUs</span>`;
  chart(el.querySelector("#cluster-chart"), {
    t: s.t,
    stacked: true,
    percent: true,
    series: [{ name: "allocated (all queues)", colour: "#4e79a7", values: cluster }],
    lines: [{ name: `average ${pct(avg, 1)}`, colour: "#e15759", value: avg }],
    empty: "No GPU was allocated in this window.",
  });
  chart(el.querySelector("#queue-chart"), {
    t: s.t,
    stacked: true,
    percent: true,
    series: s.queues.map((q) => ({ name: q.name, colour: queueColour(q.name), values: share(q.allocated) })),
    empty: "No GPU was allocated to a queue you may see in this window.",
  });
  const hours = s.step / 3600;
  const rows = s.queues
    .map((q) => {
      const used = q.allocated.reduce((a, b) => a + b, 0) * hours;
      const waited = q.pending.reduce((a, b) => a + b, 0) * hours;
      return (
        `<tr><th>${swatch(queueColour(q.name))}${esc(q.name)}</th><td class="num">${num(mean(q.allocated), 1)}</td>` +
        `<td class="num">${pct(gpus ? mean(q.allocated) / gpus : 0, 1)}</td><td class="num">${hoursText(used)}</td>` +
        `<td class="num">${hoursText(waited)}</td></tr>`
      );
    })
    .join("");
  const who = app.who.role === "admin" ? "" : `<p class="note muted">Queues you may use; the cluster line counts every queue.</p>`;
  el.querySelector("#usage-table").innerHTML = rows
    ? `<table class="grid"><thead><tr><th>Queue</th><th class="num">average GPUs in use</th><th class="num">share of the cluster</th>` +
      `<th class="num">GPU-hours used</th><th class="num">GPU-hours waited</th></tr></thead><tbody>${rows}</tbody></table>${who}`
    : `<p class="empty">Nothing ran or waited in this window.</p>`;
}
