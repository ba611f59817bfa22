// Simulation reports (`corral simulate --report DIR/NAME` into the server's reports folder),
// listed, and each shown inside the dashboard in its style: the report's HTML is parsed and only
// an allowlist of elements and attributes is kept (no scripts, no styles, images only as data:).

import { api } from "../api.js";
import { clock, errorBox, esc } from "../format.js";

export function mount(el, app, where) {
  if (where.rest.length) show(el, where.rest[0]);
  else list(el, app);
  return { unmount() {} };
}

async function list(el, app) {
  el.innerHTML = `<div class="page-head"><h1>Simulation reports</h1></div><div id="reports"><p class="muted">Loading…</p></div>`;
  const box = el.querySelector("#reports"); // kept: the page may change while we wait
  try {
    const { reports, folder } = await api("/v1/reports");
    const where = folder ? ` in <code>${esc(folder)}</code>` : "";
    const how =
      `<p class="note muted">Reports are the HTML that <code>corral simulate … --report FOLDER/NAME</code> and ` +
      `<code>corral whatif … --report NAME</code> write, ` +
      `read from the server's reports folder${where} (<code>corral server --reports-dir</code>).</p>`;
    if (!reports.length) {
      box.innerHTML = `<p class="empty">No reports yet.</p>${how}`;
      return;
    }
    const rows = reports
      .map(
        (r) =>
          `<tr><td><a href="#/reports/${encodeURIComponent(r.name)}">${esc(r.name)}</a></td>` +
          `<td>${esc(r.kind || "simulation")}</td><td>${esc(r.title)}</td><td>${clock(r.modified)}</td></tr>`,
      )
      .join("");
    box.innerHTML =
      `<table class="grid"><thead><tr><th>Report</th><th>Kind</th><th>Title</th><th>Written</th></tr></thead><tbody>${rows}</tbody></table>${how}`;
  } catch (err) {
    box.innerHTML = errorBox(err, "cannot list reports");
  }
}

async function show(el, name) {
  el.innerHTML = `<div class="page-head"><h1><a href="#/reports" class="crumb">Reports</a> › ${esc(name)}</h1></div>
    <article id="report" class="report"><p class="muted">Loading the report…</p></article>`;
  const out = el.querySelector("#report");
  try {
    const res = await api(`/v1/reports/${encodeURIComponent(name)}`, { raw: true });
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    out.replaceChildren(...[...doc.body.childNodes].map(clean).filter(Boolean));
  } catch (err) {
    out.innerHTML = errorBox(err, `report ${name}`);
  }
}

const ELEMENTS = new Set([
  "h1", "h2", "h3", "h4", "p", "section", "div", "span", "b", "strong", "i", "em", "code", "pre", "br", "hr",
  "table", "thead", "tbody", "tr", "th", "td", "details", "summary", "img", "ul", "ol", "li", "small", "sup", "sub",
]);
const ATTRIBUTES = new Set(["class", "colspan", "rowspan", "alt", "title", "open"]); // no ids: they are the page's
const COLOUR = /^color:\s*(#[0-9a-fA-F]{3,8}|[a-z]+|rgb\([\d\s,.%]+\))\s*;?$/;

/** A copy of `node` with only allowed elements and attributes (text is kept, the rest dropped). */
function clean(node) {
  if (node.nodeType === Node.TEXT_NODE) return document.createTextNode(node.textContent);
  if (node.nodeType !== Node.ELEMENT_NODE) return null;
  const tag = node.tagName.toLowerCase();
  if (!ELEMENTS.has(tag)) return null;
  const out = document.createElement(tag);
  for (const attr of node.attributes) {
    const name = attr.name.toLowerCase();
    if (ATTRIBUTES.has(name)) out.setAttribute(name, attr.value);
    else if (name === "src" && tag === "img" && /^data:image\/(png|jpeg|gif|webp);base64,/i.test(attr.value)) {
      out.setAttribute("src", attr.value);
    } else if (name === "style" && COLOUR.test(attr.value.trim())) out.setAttribute("style", attr.value);
  }
  for (const child of node.childNodes) {
    const copy = clean(child);
    if (copy) out.appendChild(copy);
  }
  return out;
}
