// The cluster as the dashboard holds it: nodes, topology levels, queues, and which job holds
// each GPU. Loaded once; then kept current from the event log (start and ending events carry
// placements), with targeted refetches: one job when its queue is unknown, the node list on a
// `cluster` event or a slow timer (node states are not in the event log).

import { api, allJobs } from "./api.js";
import { ENDINGS } from "./live.js";
import { LIVE_STATES, setQueueOrder } from "./format.js";

const MAX_SUBMITS = 50000;

export class ClusterStore {
  constructor(who) {
    this.who = who;
    this.nodes = new Map(); // name -> node (GET /v1/nodes)
    this.levels = []; // topology levels, outermost first
    this.queues = []; // GET /v1/queues
    this.queueNames = [];
    this.jobs = new Map(); // live job id -> {id, name, queue, user, state, attempt, placement}
    this.owners = new Map(); // node -> array: job id per GPU index, or null
    this.submitted = new Map(); // job id -> queue, from submit events (to colour a start at once)
    this.loaded = null;
    this.ready = false;
    this.backlog = []; // events that came while the first load ran (applying them again is harmless)
    this.version = 0; // grows when the node set or topology changes (a full re-render)
    this.listeners = new Set();
  }

  on(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  emit(change) {
    // a listener may unmount a page (and remove its own or another's listener) meanwhile
    for (const fn of [...this.listeners]) if (this.listeners.has(fn)) fn(change);
  }

  /** The first load (shared by every page that draws the cluster). */
  load() {
    if (!this.loaded) this.loaded = this.reload();
    return this.loaded;
  }

  async reload() {
    const [config, nodes, queues, jobs] = await Promise.all([
      api("/v1/config").catch(() => null),
      api(this.nodesUrl()),
      api("/v1/queues").catch(() => ({ queues: [] })),
      allJobs(LIVE_STATES.map((s) => ["state", s])),
    ]);
    const body = (config && config.config) || {};
    this.levels = Array.isArray(body.topology) ? body.topology : [];
    this.queues = queues.queues;
    const configured = Array.isArray(body.queues) ? body.queues.map((q) => q.name) : [];
    this.queueNames = configured.length ? configured : this.queues.map((q) => q.name);
    setQueueOrder(this.queueNames);
    this.jobs = new Map(jobs.map((j) => [j.id, slim(j)]));
    this.setNodes(nodes.nodes, true);
    this.version++;
    this.ready = true;
    const backlog = this.backlog;
    this.backlog = [];
    if (backlog.length) this.apply(backlog);
    this.emit({ full: true });
  }

  /** Replace the node rows; recompute GPU owners from the live jobs. */
  setNodes(rows, rebuild = false) {
    const shape = (list) => list.map((n) => `${n.name}:${n.gpus}:${JSON.stringify(n.nvlink || [])}`).join("\n");
    const changed = shape([...this.nodes.values()]) !== shape(rows);
    this.nodes = new Map(rows.map((n) => [n.name, n]));
    if (rebuild || changed) {
      this.owners = new Map();
      for (const n of rows) this.owners.set(n.name, new Array(n.gpus).fill(null));
      for (const job of this.jobs.values()) this.assign(job, job.id);
    }
    // a member sees only their team's jobs: the rest of a node's allocated GPUs are other teams'
    // (`gpu_list` says which GPUs, and their queue, without the job)
    const admin = this.who.role === "admin";
    for (const n of rows) {
      n.others = admin ? 0 : Math.max(0, n.allocated - this.owned(n.name));
      n.theirs = null;
      if (!admin && Array.isArray(n.gpu_list)) {
        n.theirs = new Map(n.gpu_list.filter((g) => g.state === "allocated" && !g.job).map((g) => [g.index, g.queue]));
        n.others = n.theirs.size;
      }
      delete n.gpu_list;
    }
    return changed;
  }

  /** A refetch of the node list (states, health, others' allocations); full re-render if the set changed. */
  async refreshNodes() {
    const { nodes } = await api(this.nodesUrl());
    const changedSet = this.setNodes(nodes);
    if (changedSet) this.version++;
    this.emit({ full: changedSet, nodes: new Set(nodes.map((n) => n.name)) });
  }

  /** Members ask for each GPU's state too: which GPUs other teams' jobs hold. */
  nodesUrl() {
    return this.who.role === "admin" ? "/v1/nodes" : "/v1/nodes?gpus=true";
  }

  owned(node) {
    const row = this.owners.get(node);
    return row ? row.reduce((k, x) => k + (x ? 1 : 0), 0) : 0;
  }

  assign(job, value) {
    const touched = new Set();
    for (const p of job.placement || []) {
      const row = this.owners.get(p.node);
      if (!row) continue;
      for (const g of p.gpus) {
        if (value === null ? row[g] === job.id : true) row[g] = value;
      }
      touched.add(p.node);
    }
    return touched;
  }

  /** Apply a batch of events; returns job ids whose queue is unknown (the caller fetches them). */
  apply(events) {
    if (!this.ready) {
      if (this.loaded) this.backlog.push(...events);
      return { unknown: new Set(), cluster: false };
    }
    const nodes = new Set();
    const unknown = new Set();
    let cluster = false;
    for (const e of events) {
      if (e.event === "cluster") {
        cluster = true;
      } else if (e.event === "submit") {
        this.submitted.set(e.job, e.queue);
        if (this.submitted.size > MAX_SUBMITS) this.submitted.delete(this.submitted.keys().next().value);
      } else if (e.event === "start") {
        const old = this.jobs.get(e.job);
        const queue = old ? old.queue : this.submitted.get(e.job);
        const job = { ...(old || { id: e.job, name: "", user: "" }), queue, state: "starting" };
        job.attempt = e.attempt;
        job.placement = e.placement;
        if (old) this.assign(old, null).forEach((n) => nodes.add(n));
        this.jobs.set(e.job, job);
        this.assign(job, job.id).forEach((n) => nodes.add(n));
        if (!queue || !job.name) unknown.add(e.job);
      } else if (e.event === "preempting") {
        const job = this.jobs.get(e.job);
        if (job) {
          job.state = "stopping";
          (job.placement || []).forEach((p) => nodes.add(p.node));
        }
      } else if (ENDINGS.has(e.event)) {
        const job = this.jobs.get(e.job);
        if (job && (e.attempt == null || e.attempt === job.attempt)) {
          this.assign(job, null).forEach((n) => nodes.add(n));
          this.jobs.delete(e.job);
        }
      }
    }
    if (nodes.size) this.emit({ nodes });
    return { unknown, cluster };
  }

  /** Fill in jobs the events named without their queue or name (a few at a time). */
  async fetchJobs(ids) {
    const nodes = new Set();
    await Promise.all(
      [...ids].slice(0, 50).map(async (id) => {
        try {
          const j = await api(`/v1/jobs/${encodeURIComponent(id)}`);
          const have = this.jobs.get(id);
          if (have && LIVE_STATES.includes(j.state)) {
            Object.assign(have, slim(j), { placement: have.placement });
            (have.placement || []).forEach((p) => nodes.add(p.node));
          }
        } catch {
          // gone, or not ours: keep what the events said
        }
      }),
    );
    if (nodes.size) this.emit({ nodes });
  }

  /** Jobs whose state a refetch should confirm: `starting` becomes `running` without an event. */
  starting() {
    return [...this.jobs.values()].filter((j) => j.state === "starting").map((j) => j.id);
  }
}

function slim(j) {
  return {
    id: j.id,
    name: j.name,
    queue: j.queue,
    user: j.user,
    state: j.state,
    attempt: j.attempt,
    placement: j.placement,
    gpus: j.gpus,
  };
}

/** Group node names by topology: [{key, label, children|nodes}] nested by `levels`. */
export function groupNodes(nodes, levels) {
  const build = (list, depth) => {
    if (depth >= levels.length) return { nodes: list.map((n) => n.name) };
    const level = levels[depth];
    const groups = new Map();
    for (const n of list) {
      const value = (n.labels && n.labels[level]) || "";
      if (!groups.has(value)) groups.set(value, []);
      groups.get(value).push(n);
    }
    const keys = [...groups.keys()].sort(naturalCompare);
    return {
      children: keys.map((k) => ({ level, value: k, ...build(groups.get(k), depth + 1) })),
    };
  };
  return build([...nodes].sort((a, b) => naturalCompare(a.name, b.name)), 0);
}

const collator = new Intl.Collator(undefined, { numeric: true });
export function naturalCompare(a, b) {
  return collator.compare(a, b);
}

/** The GPU indices of a node by NVLink domain ([] from the API means one domain of every GPU). */
export function nvlinkGroups(node) {
  const groups = Array.isArray(node.nvlink) && node.nvlink.length ? node.nvlink : [range(node.gpus)];
  const seen = new Set(groups.flat());
  const rest = range(node.gpus).filter((g) => !seen.has(g));
  return rest.length ? [...groups, ...rest.map((g) => [g])] : groups;
}

function range(n) {
  return Array.from({ length: n }, (_, i) => i);
}
