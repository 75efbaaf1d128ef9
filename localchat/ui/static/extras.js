// The chat page's extras (kept apart from app.js): example prompts on an empty chat, keyboard shortcuts
// and their "?" dialog, and a banner when the server has stopped. No inline script: the CSP forbids it.
(function () {
  "use strict";

  const $ = (selector, root = document) => root.querySelector(selector);

  function sendPrompt(text) {
    const input = $("#composer-input");
    if (!input) return;
    input.value = text;
    input.dispatchEvent(new Event("input", { bubbles: true }));  // app.js resizes the box
    input.focus();
    if (document.documentElement.dataset.ready) input.form.requestSubmit();
  }

  document.addEventListener("click", (event) => {
    const example = event.target.closest("[data-action=example-prompt]");
    if (example) sendPrompt(example.dataset.prompt);
  });

  // A preset fills the settings dialog's fields (Save, or the first message of a new chat, keeps them).
  function applyPreset(option) {
    if (!option || !option.value) return;
    const fields = { "#set-system": "systemPrompt", "#set-temperature": "temperature", "#set-top-p": "topP", "#set-max-tokens": "maxTokens" };
    for (const [selector, key] of Object.entries(fields)) {
      const field = $(selector);
      if (field) field.value = option.dataset[key] || "";
    }
  }
  document.addEventListener("change", (event) => {
    if (event.target.id === "preset-select") applyPreset(event.target.selectedOptions[0]);
  });

  // The Compare dialog's versions arrive as text; they are rendered like answers (marked, whose raw-HTML
  // escaping app.js set up, then DOMPurify).
  const PURIFY = { USE_PROFILES: { html: true }, FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"], FORBID_ATTR: ["style"] };
  document.body.addEventListener("htmx:afterSwap", (event) => {
    if (event.detail.target?.id !== "compare-body") return;
    for (const el of event.detail.target.querySelectorAll(".compare-text")) {
      el.innerHTML = DOMPurify.sanitize(marked.parse(el.textContent, { async: false }), PURIFY);
      el.classList.add("md");
    }
  });

  // ---- keyboard shortcuts (listed in the "?" dialog) ---------------------------------------------

  function typing(el) {
    return !!el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }
  function openShortcuts() {
    const dialog = $("#shortcuts");
    if (dialog && !dialog.open) dialog.showModal();
  }
  document.addEventListener("click", (event) => {
    if (event.target.closest("#shortcuts-open")) openShortcuts();
    if (event.target.closest("[data-close-dialog]")) event.target.closest("dialog")?.close();
    if (event.target.closest("[data-open-compare]")) $("#compare")?.showModal();  // htmx fills it
  });
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.isComposing || $("dialog[open]")) return;
    const el = event.target;
    if (event.key === "?" && !typing(el)) {
      event.preventDefault();
      openShortcuts();
    } else if (event.key === "/" && !typing(el)) {
      event.preventDefault();
      $("#composer-input")?.focus();
    } else if (event.key === "Escape" && document.body.classList.contains("busy") && el.id !== "composer-input" && !typing(el)) {
      $("#stop-btn")?.click();  // in the message box, app.js already stops on Esc
    }
  });

  // ---- a stopped server: a banner, until it answers again -----------------------------------------

  const PING_MS = 3000;
  let down = false;
  function showDown(text) {
    let banner = $("#server-banner");
    if (!banner) {
      banner = document.createElement("div");
      banner.id = "server-banner";
      banner.className = "server-banner";
      banner.setAttribute("role", "alert");
      const span = document.createElement("span");
      const reload = document.createElement("button");
      reload.type = "button";
      reload.className = "btn";
      reload.textContent = "Reload";
      reload.addEventListener("click", () => window.location.reload());
      banner.append(span, reload);
      document.body.prepend(banner);
    }
    banner.firstChild.textContent = text;
    banner.dataset.state = down ? "down" : "back";
  }
  async function ping() {
    let state = null;
    try {
      const response = await fetch("/ui/ping", { cache: "no-store", credentials: "same-origin" });
      state = response.ok ? await response.text() : null;
    } catch (e) {
      state = null;  // connection refused: the server is gone
    }
    if (state === null || state === "shutting_down") {
      down = true;
      showDown(state === "shutting_down" ? "localchat is shutting down." : "localchat has stopped: nothing you send will reach it. Start it again, then reload this page.");
    } else if (down) {
      down = false;
      showDown("localchat is running again.");
    }
    setTimeout(ping, PING_MS);
  }
  if ($("#composer")) setTimeout(ping, PING_MS);
})();
