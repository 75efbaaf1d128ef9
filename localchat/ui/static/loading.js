// The desktop window's loading page: polls /health (see the README's contract) until the chat UI is
// ready, showing what the server reports (download bytes, speed, ETA, load phase), then signs in.
(function () {
  "use strict";
  // The window opens this page with a one-time sign-in token in the fragment (never sent to a server);
  // drop it from the address at once.
  const token = location.hash.slice(1);
  if (token) history.replaceState(null, "", location.pathname);

  const message = document.getElementById("loading-message");
  const bar = document.getElementById("loading-bar");
  const detail = document.getElementById("loading-detail");
  const error = document.getElementById("loading-error");

  function bytes(n) {
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  function duration(s) {
    if (s < 60) return `${Math.ceil(s)} s`;
    return `${Math.floor(s / 60)} min ${Math.ceil(s % 60)} s`;
  }

  function show(health) {
    if (health.status === "error") {
      message.textContent = "localchat could not start.";
      error.textContent = `${health.detail || "Unknown error"}\n\nThe log file (see the README) has the details.`;
      error.hidden = false;
      bar.hidden = true;
      document.getElementById("loading").setAttribute("aria-busy", "false");
      return false;
    }
    const p = health.progress || {};
    const what = health.status === "downloading" ? "Downloading" : "Loading";
    message.textContent = p.message || `${what} ${health.model || "the model"}…`;
    if (p.total_bytes) {
      bar.value = Math.min(1, (p.done_bytes || 0) / p.total_bytes);
      const parts = [`${bytes(p.done_bytes || 0)} of ${bytes(p.total_bytes)}`];
      if (p.speed_bps) parts.push(`${bytes(p.speed_bps)}/s`);
      if (p.eta_s != null) parts.push(`about ${duration(p.eta_s)} left`);
      detail.textContent = parts.join(" · ");
    } else {
      bar.removeAttribute("value"); // indeterminate: no byte counts for this phase
      detail.textContent = p.phase ? `Phase: ${p.phase}` : "";
    }
    return true;
  }

  function enter() {
    location.replace(token ? `/desktop/signin?token=${encodeURIComponent(token)}` : "/");
  }

  function poll() {
    fetch("/health", { cache: "no-store" })
      .then((response) => response.json().then((health) => {
        // no_model: the server is up without a model; the chat UI lets the user pick one.
        if (health.status === "ok" || health.status === "no_model") return enter();
        if (show(health)) setTimeout(poll, 300);
      }))
      .catch(() => setTimeout(poll, 500)); // the server is not answering yet
  }

  poll();
})();
