// Time-series charts as hand-written SVG: stacked areas or lines over equal buckets, with
// reference lines (quota, capacity), a legend and a hover read-out.

import { esc, num, swatch } from "./format.js";

const M = { left: 46, right: 12, top: 10, bottom: 24 };

/** A round top for the axis and its tick step: at most 5 steps of 1, 2, 2.5 or 5 times a power of ten. */
function niceScale(x) {
  if (!(x > 0)) return { top: 1, step: 0.25 };
  const p = 10 ** Math.floor(Math.log10(x / 5));
  for (const m of [1, 2, 2.5, 5, 10, 20]) {
    const step = m * p;
    if (Math.ceil(x / step - 1e-9) <= 5) return { top: step * Math.ceil(x / step - 1e-9), step };
  }
  return { top: x, step: x / 5 };
}

function timeLabel(t, span) {
  const d = new Date(t * 1000);
  const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  return span > 86400 * 1.5 ? `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${hm}` : hm;
}

/**
 * Draw into `el`. spec: {t: [bucket starts], step, series: [{name, colour, values}], stacked,
 * lines: [{name, colour, value, dash}], unit, percent, height, empty}
 */
export function chart(el, spec) {
  const t = spec.t || [];
  const series = spec.series || [];
  const lines = spec.lines || [];
  const width = Math.max(320, Math.round(el.clientWidth || 900));
  const height = spec.height || 220;
  const w = width - M.left - M.right;
  const h = height - M.top - M.bottom;
  const n = t.length;
  const tops = new Array(n).fill(0);
  const stacks = series.map((s) => {
    const base = tops.slice();
    s.values.forEach((v, i) => (tops[i] = (spec.stacked ? tops[i] : 0) + v));
    return { ...s, base: spec.stacked ? base : new Array(n).fill(0), top: spec.stacked ? tops.slice() : s.values };
  });
  const highest = Math.max(
    ...(spec.stacked ? tops : series.flatMap((s) => s.values)),
    ...lines.map((l) => l.value || 0),
    spec.percent ? 0.01 : 1,
  );
  const scale = niceScale(highest);
  const ymax = spec.percent ? Math.min(1, scale.top) : scale.top;
  const x = (i) => M.left + (n <= 1 ? 0 : (i / (n - 1)) * w);
  const y = (v) => M.top + h - (v / ymax) * h;
  const parts = [];
  for (let v = 0; v <= ymax + 1e-9; v += scale.step) {
    const fraction = (x) => (Math.abs(x - Math.round(x)) > 1e-6 ? 1 : 0);
    const label = spec.percent ? `${num(v * 100, fraction(v * 100))}%` : num(v, fraction(v));
    parts.push(
      `<line class="grid" x1="${M.left}" x2="${M.left + w}" y1="${y(v)}" y2="${y(v)}"/>` +
        `<text class="ax" x="${M.left - 6}" y="${y(v) + 4}" text-anchor="end">${label}</text>`,
    );
  }
  const span = n > 1 ? t[n - 1] - t[0] : 0;
  const ticks = Math.min(6, Math.max(1, n - 1));
  for (let k = 0; k <= ticks && n > 1; k++) {
    const i = Math.round((k / ticks) * (n - 1));
    const anchor = k === 0 ? "start" : k === ticks ? "end" : "middle";
    parts.push(`<text class="ax" x="${x(i)}" y="${height - 6}" text-anchor="${anchor}">${timeLabel(t[i], span)}</text>`);
  }
  for (const s of stacks) {
    if (!s.values.some((v) => v > 0)) continue;
    const upper = s.top.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`);
    if (spec.stacked) {
      const lower = s.base.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).reverse();
      parts.push(`<polygon points="${upper.join(" ")} ${lower.join(" ")}" fill="${s.colour}" fill-opacity=".75"/>`);
    } else {
      parts.push(`<polyline points="${upper.join(" ")}" fill="none" stroke="${s.colour}" stroke-width="2"/>`);
    }
  }
  for (const l of lines) {
    if (l.value == null || l.value > ymax) continue;
    parts.push(
      `<line x1="${M.left}" x2="${M.left + w}" y1="${y(l.value)}" y2="${y(l.value)}" stroke="${l.colour}"` +
        ` stroke-width="1.5" stroke-dasharray="${l.dash || "5 4"}"/>`,
    );
  }
  parts.push(`<line class="cursor" x1="0" x2="0" y1="${M.top}" y2="${M.top + h}" visibility="hidden"/>`);
  parts.push(`<rect class="hit" x="${M.left}" y="${M.top}" width="${w}" height="${h}" fill="transparent"/>`);
  const legend = [
    ...series.map((s) => `<span>${swatch(s.colour)}${esc(s.name)}</span>`),
    ...lines.map((l) => `<span><span class="dash" style="border-color:${l.colour}"></span>${esc(l.name)}</span>`),
  ].join("");
  const empty = !series.some((s) => s.values.some((v) => v > 0));
  el.innerHTML =
    `<svg class="chart" viewBox="0 0 ${width} ${height}" width="100%" height="${height}" role="img">` +
    `${parts.join("")}</svg><div class="legend">${legend}</div>` +
    (empty && spec.empty ? `<div class="chart-empty muted">${esc(spec.empty)}</div>` : "");
  const svg = el.querySelector("svg");
  const cursor = svg.querySelector(".cursor");
  const tip = document.getElementById("tip");
  svg.addEventListener("mousemove", (ev) => {
    if (n < 1) return;
    const box = svg.getBoundingClientRect();
    const px = ((ev.clientX - box.left) / box.width) * width;
    const i = Math.max(0, Math.min(n - 1, Math.round(((px - M.left) / w) * (n - 1))));
    cursor.setAttribute("x1", x(i));
    cursor.setAttribute("x2", x(i));
    cursor.setAttribute("visibility", "visible");
    const fmt = (v) => (spec.percent ? `${num(v * 100, 1)}%` : `${num(v, 1)} ${esc(spec.unit || "")}`);
    const rows = series
      .filter((s) => s.values.some((v) => v > 0))
      .map((s) => `<div>${swatch(s.colour)}${esc(s.name)}: ${fmt(s.values[i])}</div>`)
      .join("");
    tip.innerHTML = `<b>${timeLabel(t[i], span)}</b>${rows || "<div>nothing</div>"}`;
    tip.hidden = false;
    tip.style.left = `${Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 6)}px`;
    tip.style.top = `${ev.clientY + 14}px`;
  });
  svg.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    tip.hidden = true;
  });
}

/** The series of `GET /v1/usage/series` for a window of `seconds`. */
export function seriesUrl(seconds, points = 120) {
  return `/v1/usage/series?span=${seconds}&points=${points}`;
}

export const WINDOWS = [
  ["15m", 900],
  ["1h", 3600],
  ["6h", 21600],
  ["24h", 86400],
  ["7d", 604800],
];

export function windowPicker(current) {
  return (
    `<span class="seg" role="group" aria-label="time window">` +
    WINDOWS.map(([label]) => `<button type="button" data-win="${label}"${label === current ? ' class="on"' : ""}>${label}</button>`).join("") +
    `</span>`
  );
}

export function windowSeconds(label) {
  const found = WINDOWS.find(([l]) => l === label);
  return found ? found[1] : 3600;
}
