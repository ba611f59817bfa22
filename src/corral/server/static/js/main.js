// The dashboard's shell: sign-in (a token, or a one-time login link), the router over
// `#/page/...`, live updates shared by every page, and sign-out.

import { api, onUnauthorised, redeem, token } from "./api.js";
import { esc, parseHash } from "./format.js";
import { Batch, debounce, Live } from "./live.js";
import { ClusterStore } from "./store.js";
import * as login from "./pages/login.js";
import * as clusterPage from "./pages/cluster.js";
import * as queuesPage from "./pages/queues.js";
import * as jobsPage from "./pages/jobs.js";
import * as jobPage from "./pages/job.js";
import * as utilisationPage from "./pages/utilisation.js";
import * as reportsPage from "./pages/reports.js";
import * as revisionsPage from "./pages/revisions.js";

const PAGES = {
  cluster: clusterPage,
  queues: queuesPage,
  jobs: jobsPage,
  utilisation: utilisationPage,
  reports: reportsPage,
  revisions: revisionsPage,
};
const main = document.getElementById("main");
const app = { who: null, live: null, store: null, current: null };
window.__corral = window.__corral || {};

function showLogin(problem) {
  document.getElementById("top").hidden = true;
  if (app.current) app.current.unmount();
  app.current = null;
  if (app.live) app.live.stop();
  login.mount(main, problem, async (value) => {
    token.set(value);
    return signIn();
  });
}

async function signIn() {
  let who;
  try {
    who = await api("/v1/whoami");
  } catch (err) {
    token.clear();
    showLogin(err);
    return false;
  }
  if (who.role === "agent") {
    token.clear();
    showLogin(new Error("an agent token cannot sign in to the dashboard: use a member or admin token"));
    return false;
  }
  start(who);
  return true;
}

function start(who) {
  app.who = who;
  app.store = new ClusterStore(who);
  document.getElementById("top").hidden = false;
  const role = who.role === "member" ? `member of team ${who.team}` : who.role;
  document.getElementById("who").innerHTML =
    who.name === who.role ? `<b>${esc(who.name)}</b>` : `<b>${esc(who.name)}</b> <span class="muted">${esc(role)}</span>`;
  const dot = document.getElementById("live");
  app.live = new Live((ok) => {
    dot.className = ok ? "live on" : "live off";
    dot.title = ok ? "live updates: connected" : "live updates: reconnecting";
  });
  const fetchJobs = new Batch((ids) => app.store.fetchJobs(ids), 300);
  const reload = debounce(() => app.store.reload().catch(() => {}), 500);
  app.live.on((events) => {
    const { unknown, cluster } = app.store.apply(events);
    unknown.forEach((id) => fetchJobs.add(id));
    if (cluster) reload();
  });
  app.live.start().catch(() => document.getElementById("live").classList.add("off"));
  if (!app.routing) window.addEventListener("hashchange", route);
  app.routing = true;
  route();
}

function route() {
  const where = parseHash(location.hash);
  const page = where.page === "jobs" && where.rest.length ? jobPage : PAGES[where.page];
  if (app.current) app.current.unmount();
  document.getElementById("tip").hidden = true;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("on", a.dataset.page === where.page);
  if (!page) {
    main.innerHTML = `<h1>Not found</h1><p>No page <code>${esc(where.page)}</code>. <a href="#/cluster">Cluster</a></p>`;
    app.current = null;
    return;
  }
  main.innerHTML = "";
  app.current = page.mount(main, app, where);
}

async function boot() {
  onUnauthorised(() => {
    token.clear();
    showLogin(new Error("the server no longer accepts this token (revoked or unknown): sign in again"));
  });
  document.getElementById("signout").addEventListener("click", () => {
    token.clear();
    location.replace("/");
  });
  if (location.pathname === "/login") {
    const code = new URLSearchParams(location.hash.slice(1)).get("code");
    history.replaceState(null, "", "/#/cluster"); // the code leaves the address bar and the history
    if (code) {
      try {
        token.set(await redeem(code));
      } catch (err) {
        showLogin(err);
        return;
      }
    }
  }
  if (!token.get()) {
    showLogin(null);
    return;
  }
  await signIn();
}

boot();
