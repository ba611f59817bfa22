// Cluster: every node and GPU by topology, coloured by queue or job; node states and unhealthy
// GPUs marked. Kept current from the event log; the node list is refetched every 15 s (node
// state changes are not in the event log) and jobs still `starting` are checked every 3 s.

import { ClusterMap } from "../clustermap.js";
import { errorBox, esc, num, queueColour, swatch } from "../format.js";
import { every } from "../live.js";

const NODE_STATES = ["up", "cordoned", "draining", "down", "lost"];

export function mount(el, app) {
  const mode = sessionStorage.getItem("corral.colour") || "queue";
  el.innerHTML = `
    <div class="page-head">
      <h1>Cluster</h1>
      <div id="summary" class="summary"></div>
      <span class="spacer"></span>
      <span class="seg" role="group" aria-label="colour by">
        <span class="seg-label">Colour by</span>
        <button type="button" data-mode="queue">queue</button><button type="button" data-mode="job">job</button>
      </span>
    </div>
    <div id="legend" class="legend"></div>
    <div id="map" class="map" aria-label="cluster map"><p class="muted">Loading the cluster…</p></div>`;
  const store = app.store;
  const map = new ClusterMap(el.querySelector("#map"), store, { mode });
  const buttons = el.querySelectorAll("[data-mode]");
  const showMode = () => buttons.forEach((b) => b.classList.toggle("on", b.dataset.mode === map.mode));
  showMode();
  buttons.forEach((b) =>
    b.addEventListener("click", () => {
      const started = performance.now();
      map.setMode(b.dataset.mode);
      window.__corral.recolourMs = performance.now() - started;
      sessionStorage.setItem("corral.colour", b.dataset.mode);
      showMode();
      legend(el, app, map);
    }),
  );

  const draw = () => {
    const ms = map.render();
    window.__corral.clusterRenderMs = ms; // building the DOM and laying it out
    window.__corral.clusterRenderedAt = performance.now();
    // two frames later the map has been painted (bench/dashboard_bench.py reads these)
    requestAnimationFrame(() => requestAnimationFrame(() => (window.__corral.clusterPaintedAt = performance.now())));
    el.querySelector("#map").dataset.rendered = String(store.nodes.size);
    summary(el, store);
    legend(el, app, map);
  };
  let alive = true;
  const off = store.on((change) => {
    if (!alive) return; // unmounted while a load was in flight
    if (change.full) draw();
    else if (change.nodes) {
      map.update(change.nodes);
      summary(el, store);
    }
  });
  if (store.ready) {
    draw();
    store.refreshNodes().catch(() => {});
  } else {
    const box = el.querySelector("#map");
    store.load().catch((err) => alive && (box.innerHTML = errorBox(err, "cannot load the cluster")));
  }
  const stopNodes = every(15000, () => store.refreshNodes().catch(() => {}));
  const stopStarting = every(3000, () => {
    const ids = store.starting();
    if (ids.length) store.fetchJobs(ids);
  });
  return {
    unmount() {
      alive = false;
      off();
      stopNodes();
      stopStarting();
      map.destroy();
    },
  };
}

function summary(el, store) {
  const states = Object.fromEntries(NODE_STATES.map((s) => [s, 0]));
  let gpus = 0;
  let allocated = 0;
  let unhealthy = 0;
  let free = 0;
  for (const n of store.nodes.values()) {
    states[n.state] = (states[n.state] || 0) + 1;
    const bad = Object.keys(n.unhealthy || {}).length;
    const used = store.owned(n.name) + (n.others || 0);
    gpus += n.gpus;
    allocated += used;
    unhealthy += bad;
    if (n.state === "up") free += Math.max(0, n.gpus - used - bad);
  }
  const nodeParts = NODE_STATES.filter((s) => states[s]).map(
    (s) => `<span class="ns-${s}">${num(states[s])} ${s}</span>`,
  );
  el.querySelector("#summary").innerHTML =
    `<span><b>${num(store.nodes.size)}</b> nodes: ${nodeParts.join(", ") || "none"}</span>` +
    `<span><b>${num(gpus)}</b> GPUs: <b>${num(allocated)}</b> allocated, <b>${num(free)}</b> free` +
    (unhealthy ? `, <b class="bad">${num(unhealthy)}</b> unhealthy` : "") +
    `</span>`;
}

function legend(el, app, map) {
  const store = app.store;
  const parts = [];
  if (map.mode === "queue") {
    for (const q of store.queueNames) parts.push(`<span>${swatch(queueColour(q))}${esc(q)}</span>`);
  } else {
    parts.push(`<span class="muted">one colour per job</span>`);
  }
  parts.push(`<span><i class="cell f"></i>free</span>`);
  if (app.who.role !== "admin") parts.push(`<span><i class="cell o"></i>another team's job</span>`);
  parts.push(`<span><i class="cell x"></i>unhealthy GPU</span>`);
  parts.push(`<span><span class="box st-cordoned"></span>cordoned</span>`);
  parts.push(`<span><span class="box st-draining"></span>draining</span>`);
  parts.push(`<span><span class="box st-down"></span>down</span>`);
  parts.push(`<span><span class="box st-lost"></span>lost</span>`);
  const levels = store.levels.length ? `${store.levels.join(" › ")} › node › NVLink domain` : "node › NVLink domain";
  el.querySelector("#legend").innerHTML = parts.join("") + `<span class="muted levels">grouped by ${esc(levels)}</span>`;
}
