// Formatting shared by every page: escaping, times, durations, colours, state badges.

const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** Escape text for HTML (every value from the API goes through here or textContent). */
export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ENTITIES[c]);
}

/** The job states of DESIGN.md 4.7, in their order. */
export const JOB_STATES = ["pending", "starting", "running", "stopping", "finished", "failed", "cancelled", "rejected"];
export const LIVE_STATES = ["starting", "running", "stopping"];

export function badge(state, extra = "") {
  return `<span class="badge s-${esc(state)}${extra ? " " + extra : ""}">${esc(state)}</span>`;
}

export function clock(t) {
  if (t == null) return "–";
  const d = new Date(t * 1000);
  const today = new Date();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  if (d.toDateString() === today.toDateString()) return time;
  return `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${time}`;
}

/** How far a time is from now: "in 3m", "12s ago" (as the CLI says it, corral.core.reasons.relative). */
export function relative(at, now = Date.now() / 1000) {
  const d = at - now;
  const s = Math.round(Math.abs(d));
  if (s < 1) return "now";
  let text;
  if (s < 60) text = `${s}s`;
  else if (s < 3600) text = `${Math.floor(s / 60)}m`;
  else if (s < 86400) text = `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  else text = `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
  return d > 0 ? `in ${text}` : `${text} ago`;
}

/** A reason's sentence with how far the time it names is, after that time: "at 10:45:00 UTC (in 3m)".
 *  The stored sentence names the absolute time (UTC), and `at` is that time. */
export function reasonText(message, at, now = Date.now() / 1000) {
  if (!message || at == null || at < 1e9) return message || "";
  const iso = new Date(at * 1000).toISOString();
  const rel = ` (${relative(at, now)})`;
  for (const text of [`${iso.slice(11, 19)} UTC`, `${iso.slice(0, 10)} ${iso.slice(11, 19)} UTC`]) {
    const i = message.indexOf(text);
    if (i >= 0) return message.slice(0, i + text.length) + rel + message.slice(i + text.length);
  }
  return message + rel;
}

export function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function ago(t, now = Date.now() / 1000) {
  if (t == null) return "–";
  const d = now - t;
  return d < 5 ? "just now" : `${duration(d)} ago`;
}

export function num(x, digits = 0) {
  return Number(x ?? 0).toLocaleString([], { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

export function pct(x, digits = 0) {
  return `${num((x ?? 0) * 100, digits)}%`;
}

// Queue colours: a fixed qualitative palette, by the queue's place in the configuration.
const PALETTE = [
  "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759", "#76b7b2",
  "#edc948", "#9c755f", "#ff9da7", "#86bcb6", "#8cd17d", "#d37295",
];
const queueIndex = new Map();

export function setQueueOrder(names) {
  queueIndex.clear();
  names.forEach((n, i) => queueIndex.set(n, i));
}

export function queueColour(name) {
  if (name == null) return "#9aa5b1";
  if (!queueIndex.has(name)) queueIndex.set(name, queueIndex.size);
  return PALETTE[queueIndex.get(name) % PALETTE.length];
}

/** The class that paints a GPU cell in its queue's colour (`.qc0` ...; `.qcx` when unknown). */
export function queueClass(name) {
  if (name == null) return "qcx";
  queueColour(name);
  return `qc${queueIndex.get(name) % PALETTE.length}`;
}

// the classes, once: 8,000 cells with a class are cheaper to parse than with a style attribute
const sheet = document.createElement("style");
sheet.textContent = PALETTE.map((c, i) => `.node i.qc${i}{background:${c}}`).join("") + ".node i.qcx{background:#9aa5b1}";
document.head.appendChild(sheet);

/** A stable colour per job id (colour-by-job mode). */
export function jobColour(id) {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619);
  const hue = (h >>> 0) % 360;
  return `hsl(${hue} 62% 52%)`;
}

export function swatch(colour) {
  return `<span class="sw" style="background:${colour}"></span>`;
}

export function errorBox(err, what = "") {
  const fix = err && err.fix ? `<div class="fix">${esc(err.fix)}</div>` : "";
  const title = what ? `${esc(what)}: ` : "";
  return `<div class="error">${title}${esc(err && err.message ? err.message : err)}${fix}</div>`;
}

/** Parse `#/page/rest?k=v` into {page, rest, query}. */
export function parseHash(hash) {
  const raw = (hash || "").replace(/^#\/?/, "");
  const [path, search = ""] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "cluster", rest: parts.slice(1), query: new URLSearchParams(search) };
}
