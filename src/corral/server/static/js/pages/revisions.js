// Configuration revisions (`corral queues history`): who changed what and why, and the evidence
// each change was decided on: the what-if's fidelity and summary with a link to its report, or
// the reason it was forced without one (docs/whatif.md).

import { api } from "../api.js";
import { clock, errorBox, esc } from "../format.js";

export function mount(el, app, where) {
  if (where.rest.length) show(el, where.rest[0]);
  else list(el);
  return { unmount() {} };
}

function evidenceText(ev) {
  if (!ev) return "";
  const parts = [];
  if (ev.what_if) parts.push(`what-if over ${Number(ev.what_if.window_days).toPrecision(3)} days, ${ev.what_if.jobs} jobs`);
  if (ev.forced) parts.push(`forced: ${ev.forced.reason}`);
  return parts.join("; ");
}

async function list(el) {
  el.innerHTML = `<div class="page-head"><h1>Configuration revisions</h1></div><div id="revisions"><p class="muted">Loading…</p></div>`;
  const box = el.querySelector("#revisions");
  try {
    const { active, revisions } = await api("/v1/config/revisions");
    const rows = revisions
      .slice()
      .reverse()
      .map(
        (r) =>
          `<tr data-revision="${r.revision}"><td><a href="#/revisions/${r.revision}">${r.revision}</a>${r.revision === active ? " (active)" : ""}</td>` +
          `<td>${clock(r.created_at)}</td><td>${esc(r.author || "")}</td><td>${esc(r.comment || "")}</td>` +
          `<td class="evidence">${esc(evidenceText(r.evidence)) || '<span class="muted">none</span>'}</td></tr>`,
      )
      .join("");
    box.innerHTML =
      `<table class="grid"><thead><tr><th>Revision</th><th>Created</th><th>Author</th><th>Comment</th><th>Evidence</th></tr></thead><tbody>${rows}</tbody></table>` +
      `<p class="note muted">A change made with <code>--what-if</code> keeps the what-if's summary; one forced without it keeps the reason.</p>`;
  } catch (err) {
    box.innerHTML = errorBox(err, "cannot list revisions");
  }
}

async function show(el, number) {
  el.innerHTML = `<div class="page-head"><h1><a href="#/revisions" class="crumb">Revisions</a> › ${esc(number)}</h1></div><div id="revision"><p class="muted">Loading…</p></div>`;
  const box = el.querySelector("#revision");
  try {
    const r = await api(`/v1/config/revisions/${encodeURIComponent(number)}`);
    const ev = r.evidence || {};
    let evidence = `<p class="empty">No evidence: changed without a what-if.</p>`;
    if (ev.what_if || ev.forced) {
      const w = ev.what_if;
      evidence = "<dl class=\"fields\">";
      if (w) {
        evidence += `<dt>What-if</dt><dd>over ${Number(w.window_days).toPrecision(3)} days, ${w.jobs} jobs</dd>`;
        evidence += `<dt>Summary</dt><dd class="summary">${esc(w.summary)}</dd>`;
        if (w.report) evidence += `<dt>Report</dt><dd><a class="report-link" href="#/reports/${encodeURIComponent(w.report)}">${esc(w.report)}</a></dd>`;
      }
      if (ev.forced) evidence += `<dt>Forced</dt><dd class="forced">${esc(ev.forced.reason)}</dd>`;
      evidence += "</dl>";
    }
    box.innerHTML =
      `<p>${clock(r.created_at)} by ${esc(r.author)}: ${esc(r.comment)}</p>` +
      `<h2>Evidence</h2><div id="evidence">${evidence}</div>` +
      `<h2>Configuration</h2><pre>${esc(JSON.stringify(r.config, null, 2))}</pre>`;
  } catch (err) {
    box.innerHTML = errorBox(err, `revision ${number}`);
  }
}
