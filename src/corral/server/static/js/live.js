// Live updates: follow the event log by long poll (GET /v1/events?after=SEQ&wait=25) from the
// newest event at sign-in, hand each batch to the listeners; they refetch only what changed.

import { api } from "./api.js";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Live {
  constructor(onStatus) {
    this.after = 0;
    this.listeners = new Set();
    this.stopped = false;
    this.onStatus = onStatus;
    this.controller = null;
  }

  /** Register `fn(events)`; returns the function that unregisters it. */
  on(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  async start() {
    const { seq } = await api("/v1/events/latest");
    this.after = seq;
    this.onStatus(true);
    this.loop();
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
  }

  async loop() {
    let delay = 500;
    while (!this.stopped) {
      this.controller = new AbortController();
      try {
        const events = await api(`/v1/events?after=${this.after}&wait=25&limit=1000`, {
          signal: this.controller.signal,
        });
        this.onStatus(true);
        delay = 500;
        if (events.length) {
          this.after = events[events.length - 1].seq;
          for (const fn of [...this.listeners]) {
            try {
              fn(events);
            } catch (err) {
              console.error("live update failed", err);
            }
          }
        }
      } catch (err) {
        if (this.stopped || err.status === 401) return;
        this.onStatus(false);
        await sleep(delay);
        delay = Math.min(delay * 2, 10000);
      }
    }
  }
}

/** `fn` runs once, `ms` after the last call (a burst of events costs one refetch). */
export function debounce(fn, ms) {
  let timer = null;
  const wrapped = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      timer = null;
      fn(...args);
    }, ms);
  };
  wrapped.cancel = () => clearTimeout(timer);
  return wrapped;
}

/** Collects keys and calls `fn(keys)` at most every `ms` (a burst of events is one batch). */
export class Batch {
  constructor(fn, ms) {
    this.fn = fn;
    this.ms = ms;
    this.keys = new Set();
    this.timer = null;
  }

  add(key) {
    this.keys.add(key);
    if (!this.timer) {
      this.timer = setTimeout(() => {
        const keys = this.keys;
        this.keys = new Set();
        this.timer = null;
        this.fn(keys);
      }, this.ms);
    }
  }

  cancel() {
    clearTimeout(this.timer);
    this.timer = null;
  }
}

/** Calls `fn` again after 0.5 s, 1 s, 2 s, ... (at most every 5 s) while `check(true)` is said. */
export class FollowUp {
  constructor(fn, first = 500, most = 5000) {
    this.fn = fn;
    this.first = first;
    this.most = most;
    this.delay = first;
    this.timer = null;
  }

  check(again) {
    clearTimeout(this.timer);
    if (!again) {
      this.delay = this.first;
      return;
    }
    this.timer = setTimeout(() => this.fn(), this.delay);
    this.delay = Math.min(this.delay * 2, this.most);
  }

  reset() {
    this.delay = this.first;
  }

  cancel() {
    clearTimeout(this.timer);
  }
}

/** A repeating timer that only runs while the tab is visible. */
export function every(ms, fn) {
  const id = setInterval(() => {
    if (document.visibilityState === "visible") fn();
  }, ms);
  return () => clearInterval(id);
}

/** Event kinds that end an attempt (DESIGN.md 4.6). */
export const ENDINGS = new Set(["preempt", "lost", "restart", "finish", "fail", "cancel"]);
