// The cluster drawn as compact HTML: topology groups (nested boxes, one per level value), node
// tiles, and one small cell per GPU grouped by NVLink domain, coloured by queue or by job.
// Rendered once as one string; afterwards only the tiles of changed nodes are redrawn.
// One delegated listener shows the tooltip and opens a job on click.

import { esc, jobColour, queueClass } from "./format.js";
import { groupNodes, nvlinkGroups } from "./store.js";

const STATE_NOTE = { cordoned: "cordoned", draining: "draining", down: "down", lost: "lost" };

export class ClusterMap {
  constructor(el, store, { mode = "queue", only = null, mark = null, markColour = "#333" } = {}) {
    this.el = el;
    this.store = store;
    this.mode = mode;
    this.only = only; // a Set of node names to draw, or null for all
    this.mark = mark; // a Map node -> Set of GPU indices that stand out (a job's placement), or null
    this.markColour = markColour;
    this.tiles = new Map();
    this.tip = document.getElementById("tip");
    this.onMove = (ev) => this.hover(ev);
    this.onLeave = () => (this.tip.hidden = true);
    this.onClick = (ev) => this.pick(ev);
    el.addEventListener("mousemove", this.onMove);
    el.addEventListener("mouseleave", this.onLeave);
    el.addEventListener("click", this.onClick);
  }

  destroy() {
    this.el.removeEventListener("mousemove", this.onMove);
    this.el.removeEventListener("mouseleave", this.onLeave);
    this.el.removeEventListener("click", this.onClick);
    this.tip.hidden = true;
  }

  /** Draw everything; returns the milliseconds spent building and laying out the DOM. */
  render() {
    const started = performance.now();
    const list = [...this.store.nodes.values()].filter((n) => !this.only || this.only.has(n.name));
    const tree = groupNodes(list, this.store.levels);
    const html = [];
    this.group(tree, html, 0);
    this.el.innerHTML = list.length ? html.join("") : `<p class="muted">No nodes yet.</p>`;
    // bigger cells when there are few nodes; 10 px keeps 1,000 nodes of 8 GPUs on a few screens
    this.el.style.setProperty("--cell", list.length <= 32 ? "16px" : list.length <= 160 ? "13px" : "10px");
    this.tiles = new Map();
    for (const tile of this.el.querySelectorAll(".node")) this.tiles.set(tile.dataset.node, tile);
    void this.el.offsetHeight; // force layout: the figure includes it
    return performance.now() - started;
  }

  group(g, out, depth) {
    if (g.nodes) {
      out.push(`<div class="tiles">`);
      for (const name of g.nodes) out.push(this.tile(this.store.nodes.get(name)));
      out.push(`</div>`);
      return;
    }
    for (const child of g.children) {
      const label = child.value || `(no ${child.level})`;
      out.push(
        `<section class="grp d${depth}" data-level="${esc(child.level)}" data-value="${esc(child.value)}">` +
          `<h3><span class="lvl">${esc(child.level)}</span> ${esc(label)}</h3>`,
      );
      this.group(child, out, depth + 1);
      out.push(`</section>`);
    }
  }

  tile(n) {
    const owners = this.store.owners.get(n.name) || [];
    const bad = n.unhealthy || {};
    let others = n.others || 0;
    const marked = this.mark ? this.mark.get(n.name) || new Set() : null;
    const groups = nvlinkGroups(n).map((grp) => {
      const cells = grp.map((g) => {
        const owner = owners[g];
        if (marked && marked.has(g)) return `<i class="j hl" data-g="${g}" style="background:${this.markColour}"></i>`;
        if (bad[g] !== undefined || bad[String(g)] !== undefined) return `<i class="x" data-g="${g}"></i>`;
        if (owner) {
          const dim = marked ? " dim" : "";
          return `<i ${this.paint(owner, dim)} data-g="${g}"></i>`;
        }
        if (n.theirs ? n.theirs.has(g) : others > 0) {
          others--;
          return `<i class="o" data-g="${g}"></i>`;
        }
        return `<i class="f" data-g="${g}"></i>`;
      });
      return `<span class="nv">${cells.join("")}</span>`;
    });
    const note = STATE_NOTE[n.state] ? `<span class="nst">${STATE_NOTE[n.state]}</span>` : "";
    const body = n.gpus ? groups.join("") : `<span class="nogpu">no GPUs</span>`;
    return (
      `<div class="node st-${esc(n.state)}" data-node="${esc(n.name)}">` +
      `<div class="nh"><b>${esc(n.name)}</b>${note}</div><div class="gpus">${body}</div></div>`
    );
  }

  /** The class (and, by job, the colour) of a cell of `jobId`. */
  paint(jobId, extra) {
    if (this.mode === "job") return `class="j${extra}" style="background:${jobColour(jobId)}"`;
    const job = this.store.jobs.get(jobId);
    return `class="j ${queueClass(job ? job.queue : null)}${extra}"`;
  }

  /** Redraw the tiles of `names` only. */
  update(names) {
    for (const name of names) {
      const old = this.tiles.get(name);
      const node = this.store.nodes.get(name);
      if (!old || !node) continue;
      old.insertAdjacentHTML("beforebegin", this.tile(node));
      const fresh = old.previousElementSibling;
      old.remove();
      this.tiles.set(name, fresh);
    }
  }

  setMode(mode) {
    this.mode = mode;
    this.update([...this.tiles.keys()]);
  }

  at(ev) {
    const tile = ev.target.closest(".node");
    if (!tile || !this.el.contains(tile)) return null;
    const node = this.store.nodes.get(tile.dataset.node);
    const cell = ev.target.closest("i[data-g]");
    return { node, gpu: cell ? Number(cell.dataset.g) : null, cell };
  }

  hover(ev) {
    const hit = this.at(ev);
    if (!hit || !hit.node) {
      this.tip.hidden = true;
      return;
    }
    this.tip.innerHTML = hit.gpu === null ? this.nodeTip(hit.node) : this.gpuTip(hit.node, hit.gpu, hit.cell);
    this.tip.hidden = false;
    const pad = 14;
    const w = this.tip.offsetWidth;
    const h = this.tip.offsetHeight;
    const x = ev.clientX + pad + w > window.innerWidth ? ev.clientX - w - pad : ev.clientX + pad;
    const y = ev.clientY + pad + h > window.innerHeight ? ev.clientY - h - pad : ev.clientY + pad;
    this.tip.style.left = `${Math.max(4, x)}px`;
    this.tip.style.top = `${Math.max(4, y)}px`;
  }

  nodeTip(n) {
    const labels = Object.entries(n.labels || {})
      .map(([k, v]) => `${esc(k)}=${esc(v)}`)
      .join(", ");
    const bad = Object.keys(n.unhealthy || {}).length;
    return (
      `<b>${esc(n.name)}</b> <span class="badge n-${esc(n.state)}">${esc(n.state)}</span>` +
      (n.reason ? `<div>${esc(n.reason)}</div>` : "") +
      `<div>${n.gpus} × ${esc(n.gpu_model || "GPU")}: ${n.allocated} allocated, ${n.free} free` +
      (bad ? `, ${bad} unhealthy` : "") +
      `</div>` +
      (labels ? `<div class="muted">${labels}</div>` : "") +
      (n.heartbeat_age_s != null ? `<div class="muted">heartbeat ${n.heartbeat_age_s.toFixed(1)} s ago</div>` : "")
    );
  }

  gpuTip(n, g, cell) {
    const head = `<b>${esc(n.name)}</b> · GPU ${g}`;
    const bad = (n.unhealthy || {})[g];
    if (bad !== undefined) return `${head}<div class="bad">unhealthy: ${esc(bad || "no reason given")}</div>`;
    const owner = (this.store.owners.get(n.name) || [])[g];
    const job = owner && this.store.jobs.get(owner);
    if (job) {
      return (
        `${head}<div><b>${esc(job.id)}</b> ${esc(job.name)} <span class="badge s-${esc(job.state)}">` +
        `${esc(job.state)}</span></div><div>queue ${esc(job.queue || "?")} · user ${esc(job.user || "?")}</div>` +
        `<div class="muted">click to open the job</div>`
      );
    }
    if (cell && cell.classList.contains("o")) {
      const queue = n.theirs && n.theirs.get(g);
      return `${head}<div>allocated to another team's job${queue ? ` (queue ${esc(queue)})` : ""}</div>`;
    }
    if (n.state !== "up") return `${head}<div>node ${esc(n.state)}: no new work</div>`;
    return `${head}<div>free</div>`;
  }

  pick(ev) {
    const hit = this.at(ev);
    if (!hit || hit.gpu === null) return;
    const owner = (this.store.owners.get(hit.node.name) || [])[hit.gpu];
    if (owner) location.hash = `#/jobs/${encodeURIComponent(owner)}`;
  }
}
