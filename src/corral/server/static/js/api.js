// The /v1 API with the bearer token the tab keeps in sessionStorage.

const KEY = "corral.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || (body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.fix = (body && body.fix) || "";
    this.code = (body && body.code) || "";
  }
}

let unauthorised = () => {};

/** Called once when the server answers 401 (the token was revoked): the app signs out. */
export function onUnauthorised(fn) {
  unauthorised = fn;
}

async function failure(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  return new ApiError(res.status, body);
}

/** One call; the decoded JSON (or the Response with `raw`). Throws ApiError on an HTTP error. */
export async function api(path, { method = "GET", body, signal, raw = false } = {}) {
  const headers = { Authorization: `Bearer ${token.get() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  if (!res.ok) {
    const err = await failure(res);
    if (res.status === 401) unauthorised(err);
    throw err;
  }
  return raw ? res : res.json();
}

/** Every page of a `/v1/jobs` query (ascending `after` paging). */
export async function allJobs(params, pageSize = 5000) {
  const out = [];
  let after = 0;
  for (;;) {
    const q = new URLSearchParams(params);
    q.set("limit", String(pageSize));
    q.set("after", String(after));
    const { jobs } = await api(`/v1/jobs?${q}`);
    out.push(...jobs);
    if (jobs.length < pageSize) return out;
    after = jobs[jobs.length - 1].seq;
  }
}

/** Trade a one-time login code for the token that made it (public route). */
export async function redeem(code) {
  const res = await fetch("/login", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
  });
  if (!res.ok) throw await failure(res);
  return (await res.json()).token;
}
