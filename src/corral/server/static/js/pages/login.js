// Sign in with a token (kept in this tab's sessionStorage only).

import { errorBox } from "../format.js";

export function mount(el, problem, submit) {
  el.innerHTML = `
    <div class="login">
      <h1><img src="/ui/favicon.svg" alt="">Corral</h1>
      <p class="muted">GPU cluster scheduler: the cluster, its queues and jobs, live.</p>
      ${problem ? errorBox(problem) : ""}
      <form id="login-form" autocomplete="off">
        <label for="token">Token</label>
        <input id="token" name="token" type="password" placeholder="crl_…" required autofocus>
        <button type="submit">Sign in</button>
      </form>
      <div class="hint">
        <p><code>corral up</code> prints a one-time login link; <code>corral dashboard</code> prints a
        fresh one. Or paste a token: yours is in <code>~/.config/corral/config.json</code>, and an
        admin makes one with <code>corral token create NAME --role member --team TEAM</code>.</p>
        <p>The token stays in this browser tab only (sessionStorage).</p>
      </div>
    </div>`;
  const form = el.querySelector("#login-form");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const value = form.token.value.trim();
    if (value) await submit(value);
  });
}
