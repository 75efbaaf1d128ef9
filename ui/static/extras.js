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
})();
