// localchat web UI behaviour: markdown rendering (marked -> DOMPurify -> highlight.js), the composer,
// the live answer, copy buttons, theme and sidebar. No inline script anywhere: the page's CSP forbids it.
(function () {
  "use strict";

  const $ = (selector, root = document) => root.querySelector(selector);
  const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));
  const NARROW = window.matchMedia("(max-width: 800px)");
  const DARK = window.matchMedia("(prefers-color-scheme: dark)");

  // ---- markdown ---------------------------------------------------------------------------------

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // Raw HTML in a model's markdown is shown as text (as chat apps do), not interpreted;
  // DOMPurify still cleans whatever marked produces (e.g. javascript: links).
  marked.use({ gfm: true, breaks: false, renderer: { html: (token) => escapeHtml(token.text || token.raw || "") } });
  const PURIFY = { USE_PROFILES: { html: true }, FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"], FORBID_ATTR: ["style"] };
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A" && node.getAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });
  hljs.configure({ ignoreUnescapedHTML: true });

  function renderMarkdown(el, text) {
    el.innerHTML = DOMPurify.sanitize(marked.parse(text, { async: false }), PURIFY);
    for (const code of $$("pre > code", el)) {
      const lang = (code.className.match(/language-([\w+#-]+)/) || [])[1];
      if (!lang || hljs.getLanguage(lang)) hljs.highlightElement(code);
      const pre = code.parentElement;
      const bar = document.createElement("div");
      bar.className = "code-bar";
      const label = document.createElement("span");
      label.textContent = lang || "code";
      const copy = document.createElement("button");
      copy.type = "button";
      copy.className = "act code-copy";
      copy.dataset.action = "copy-code";
      copy.textContent = "Copy";
      copy.setAttribute("aria-label", "Copy code");
      bar.append(label, copy);
      pre.before(bar);
    }
  }

  // A reply may open with <think>…</think> (reasoning models); that part goes in the "Thinking" block.
  function splitThinking(text) {
    const open = text.match(/^\s*<think>/);
    if (!open) return { think: null, answer: text, thinking: false };
    const rest = text.slice(open[0].length);
    const close = rest.indexOf("</think>");
    if (close < 0) return { think: rest, answer: "", thinking: true };
    return { think: rest.slice(0, close), answer: rest.slice(close + "</think>".length), thinking: false };
  }

  // Tool calls and their results (the server's MCP runs, or a model's own <tool_call> markup) are
  // collapsed blocks between the answer's markdown; their text goes in as textContent, never as HTML.
  const TOOL_BLOCK = /<tool_call>\s*([\s\S]*?)\s*(?:<\/tool_call>|$)|<tool_response name="([^"]*)"( error="true")?( denied="true")?>\n?([\s\S]*?)\n?(?:<\/tool_response>|$)/g;
  function toolBlock(kind, title, body) {
    const details = document.createElement("details");
    details.className = "tool-block " + kind;
    const summary = document.createElement("summary");
    summary.textContent = title;
    const pre = document.createElement("pre");
    pre.textContent = body;
    details.append(summary, pre);
    return details;
  }
  function callBlock(json) {
    try {
      const call = JSON.parse(json);
      const args = call.arguments ?? call.parameters ?? {};
      return toolBlock("tool-call", "Tool call: " + call.name, JSON.stringify(args, null, 2));
    } catch (e) {
      return toolBlock("tool-call", "Tool call", json);
    }
  }
  function renderAnswer(el, text) {
    const blocks = Array.from(text.matchAll(TOOL_BLOCK));
    if (!blocks.length) return renderMarkdown(el, text);
    el.replaceChildren();
    const markdown = (part) => {
      if (!part.trim()) return;
      const div = document.createElement("div");
      renderMarkdown(div, part);
      el.append(div);
    };
    let at = 0;
    for (const m of blocks) {
      markdown(text.slice(at, m.index));
      if (m[0].startsWith("<tool_call>")) el.append(callBlock(m[1]));
      else if (m[4]) el.append(toolBlock("tool-result failed denied", "Denied: " + m[2], m[5]));
      else el.append(toolBlock(m[3] ? "tool-result failed" : "tool-result", (m[3] ? "Tool error: " : "Tool result: ") + m[2], m[5]));
      at = m.index + m[0].length;
    }
    markdown(text.slice(at));
  }

  const rendered = new WeakMap();
  function renderMessage(msg) {
    const raw = $(":scope > .raw", msg);
    if (!raw || !msg.classList.contains("assistant")) return;
    const text = raw.textContent;
    if (rendered.get(msg) === text) return;
    rendered.set(msg, text);
    const parts = splitThinking(text);
    const details = $(".thinking", msg);
    if (details && parts.think !== null) {
      details.hidden = false;
      $("summary", details).textContent = parts.thinking ? "Thinking…" : "Thinking";
      if (!details.dataset.userToggled) details.open = parts.thinking;
      renderMarkdown($(".think-body", details), parts.think.trim());
    }
    renderAnswer($(".answer", msg), parts.answer);
    msg.dataset.rendered = "";  // lets tests (and styles) tell a rendered answer from raw markup
  }

  // Deltas arrive faster than frames: render each message at most once per frame.
  const pending = new Set();
  let frame = 0;
  function scheduleRender(msg) {
    if (!msg) return;
    pending.add(msg);
    if (!frame) frame = requestAnimationFrame(flushRender);
  }
  function flushRender() {
    frame = 0;
    const stick = nearBottom();
    for (const msg of pending) renderMessage(msg);
    pending.clear();
    syncState();
    if (stick) scrollToBottom();
  }

  // ---- scrolling and state ----------------------------------------------------------------------

  function scroller() { return $("#messages"); }
  function nearBottom() {
    const el = scroller();
    return !el || el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  }
  function scrollToBottom() {
    const el = scroller();
    if (el) el.scrollTop = el.scrollHeight;
  }

  function syncState() {
    const busy = !!$('#messages .msg[data-status="streaming"]');
    document.body.classList.toggle("busy", busy);
    const empty = $("#empty-state");
    if (empty) empty.hidden = !!$("#messages .msg");
  }

  // ---- copy -------------------------------------------------------------------------------------

  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) {
      const area = document.createElement("textarea");
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    const old = button.textContent;
    button.textContent = "Copied";
    button.classList.add("done");
    setTimeout(() => { button.textContent = old; button.classList.remove("done"); }, 1500);
  }

  // ---- theme and sidebar ------------------------------------------------------------------------

  function effectiveTheme() {
    return document.documentElement.dataset.theme || (DARK.matches ? "dark" : "light");
  }
  function labelThemeButton() {
    const button = $("#theme-toggle");
    if (!button) return;
    const next = effectiveTheme() === "dark" ? "light" : "dark";
    button.setAttribute("aria-label", "Switch to the " + next + " theme");
    button.title = "Switch to the " + next + " theme";
  }
  function toggleTheme() {
    const next = effectiveTheme() === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    try { localStorage.setItem("localchat-theme", next); } catch (e) { /* not kept: fine */ }
    labelThemeButton();
  }

  function sidebarOpen() {
    return NARROW.matches ? document.body.classList.contains("sidebar-open") : !document.body.classList.contains("sidebar-collapsed");
  }
  function toggleSidebar(force) {
    const open = force === undefined ? !sidebarOpen() : force;
    if (NARROW.matches) document.body.classList.toggle("sidebar-open", open);
    else document.body.classList.toggle("sidebar-collapsed", !open);
    syncSidebar();
    if (open && NARROW.matches) $("#new-chat")?.focus();
  }
  function syncSidebar() {
    const open = sidebarOpen();
    $("#sidebar-toggle")?.setAttribute("aria-expanded", String(open));
    const sidebar = $("#sidebar");
    if (sidebar) sidebar.inert = !open;
  }

  // ---- events -----------------------------------------------------------------------------------

  const actions = {
    "toggle-theme": toggleTheme,
    "toggle-sidebar": () => toggleSidebar(),
    "open-settings": () => { $("#settings")?.showModal(); },
    "close-settings": () => { $("#settings")?.close(); },
    "dismiss-notice": () => { $("#notice").replaceChildren(); },
    "copy-message": (button) => {
      const msg = button.closest(".msg");
      copyText($(".raw", msg).textContent.trim(), button);
    },
    "copy-code": (button) => copyText(button.closest(".code-bar").nextElementSibling.textContent, button),
  };

  document.addEventListener("click", (event) => {
    const target = event.target.closest("[data-action]");
    if (target && actions[target.dataset.action]) {
      event.preventDefault();
      actions[target.dataset.action](target);
    }
    const summary = event.target.closest(".thinking > summary");
    if (summary) summary.parentElement.dataset.userToggled = "1";
    // A menu closes once used, or on a click anywhere else.
    for (const menu of $$("details.menu[open]")) {
      if (!menu.contains(event.target) || event.target.closest(".menu-items a")) menu.open = false;
    }
  });

  document.addEventListener("keydown", (event) => {
    const el = event.target;
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && el.matches?.("textarea[data-enter-submit]")) {
      event.preventDefault();
      const form = el.form;
      const busy = document.body.classList.contains("busy");
      const attached = form.id === "composer" && $("#attach-input")?.files.length;
      if ((!el.value.trim() && !attached) || (busy && form.id === "composer")) return;
      form.requestSubmit();
      return;
    }
    if (event.key === "Escape") {
      if (el.matches?.("[data-escape-cancel]")) {
        event.preventDefault();
        $("[data-cancel]", el.closest("form"))?.click();
      } else if (document.body.classList.contains("busy") && el.id === "composer-input") {
        $("#stop-btn")?.click();
      } else if (NARROW.matches && document.body.classList.contains("sidebar-open")) {
        toggleSidebar(false);
        $("#sidebar-toggle")?.focus();
      }
      return;
    }
    if (event.key.toLowerCase() === "o" && event.shiftKey && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      window.location.href = "/";
    }
  });

  document.addEventListener("input", (event) => {
    if (event.target.id === "composer-input") autosize(event.target);
  });
  function autosize(area) {
    area.style.height = "auto";
    area.style.height = Math.min(area.scrollHeight, 240) + "px";
  }

  document.body.addEventListener("htmx:sseMessage", (event) => scheduleRender(event.target.closest(".msg")));
  document.body.addEventListener("htmx:afterRequest", (event) => {
    const elt = event.detail.elt;
    if (elt.id === "composer" && event.detail.successful) {
      const input = $("#composer-input");
      input.value = "";
      autosize(input);
      $("#notice").replaceChildren();
      scrollToBottom();
    }
  });
  document.body.addEventListener("htmx:afterSettle", syncState);
  document.body.addEventListener("htmx:sendError", () => {
    $("#notice").textContent = "The server cannot be reached. Is localchat still running?";
  });

  // The answer's stream broke while the answer was still being written: the server died (or the
  // network went away). Say so, and offer Retry: it reloads the chat once the server answers again.
  function showStreamLost(text) {
    const notice = $("#notice");
    const body = document.createElement("div");
    body.className = "notice-body stream-lost";
    const span = document.createElement("span");
    span.textContent = text;
    const retry = document.createElement("button");
    retry.type = "button";
    retry.className = "btn";
    retry.dataset.action = "retry-stream";
    retry.textContent = "Retry";
    body.append(span, retry);
    notice.replaceChildren(body);
  }
  document.body.addEventListener("htmx:sseError", (event) => {
    const msg = event.target.closest?.('.msg[data-status="streaming"]');
    if (msg && document.body.contains(msg) && !$("#notice .stream-lost")) {
      showStreamLost("The connection to localchat broke in the middle of this answer: the server may have stopped.");
    }
  });
  document.body.addEventListener("htmx:sseOpen", () => $("#notice .stream-lost")?.remove());
  actions["retry-stream"] = async (button) => {
    button.disabled = true;
    try {
      const response = await fetch(window.location.pathname, { cache: "no-store", credentials: "same-origin" });
      if (response.ok) { window.location.reload(); return; }
    } catch (e) { /* still down */ }
    showStreamLost("localchat still cannot be reached. Start it again, then press Retry.");
  };
  DARK.addEventListener("change", labelThemeButton);
  NARROW.addEventListener("change", syncSidebar);

  // Until htmx has bound the page's hx-post forms (on DOMContentLoaded, after every deferred script), a
  // Send would be a plain GET of "/?content=..." that loses the message: hold submits until then.
  document.addEventListener("submit", (event) => {
    if (!document.documentElement.dataset.ready) event.preventDefault();
  }, true);

  htmx.onLoad((root) => {
    if (root.nodeType !== Node.ELEMENT_NODE) return;
    if (root === document.body) document.documentElement.dataset.ready = "1";
    const messages = root.matches(".msg.assistant") ? [root] : $$(".msg.assistant", root);
    messages.forEach(scheduleRender);
    const edit = root.matches("textarea[data-enter-submit]") ? root : $("textarea[data-escape-cancel]", root);
    if (edit) edit.setSelectionRange(edit.value.length, edit.value.length);
    syncState();
  });

  labelThemeButton();
  syncSidebar();
  syncState();
  scrollToBottom();
})();
