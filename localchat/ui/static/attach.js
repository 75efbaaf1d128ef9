// The composer's attachments: the paperclip button, files dropped on the chat, pictures pasted from the
// clipboard. Files wait in the composer (thumbnails, removable) and go with the next message; what the
// server would refuse (SVG, too large, too many, a picture for a model that does not see images) is
// said at once in the notice bar. The server checks everything again.
(function () {
  "use strict";
  const form = document.getElementById("composer");
  const input = document.getElementById("attach-input");
  const list = document.getElementById("attach-list");
  if (!form || !input || !list) return;
  const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
  const MAX_FILES = 8;
  const maxBody = Number(form.dataset.maxBody) || 4 * 2 ** 20;
  const maxImages = Number(form.dataset.maxImages) || 8;
  const maxImageBytes = Number(form.dataset.maxImageBytes) || 20 * 2 ** 20;
  let files = [];

  const mib = (n) => (n / 2 ** 20).toFixed(1) + " MiB";
  const isImage = (file) => IMAGE_TYPES.includes(file.type);
  function say(text) {
    const notice = document.getElementById("notice");
    if (notice) notice.textContent = text;
  }
  function model() {
    const option = document.getElementById("model-select")?.selectedOptions[0];
    return { name: option?.value || "The model", vision: Boolean(option?.dataset.vision) };
  }

  function render() {
    list.replaceChildren();
    list.hidden = files.length === 0;
    files.forEach((file, i) => {
      const li = document.createElement("li");
      li.className = "attach-item" + (isImage(file) ? " image" : " document");
      if (isImage(file)) {
        const img = document.createElement("img");
        // A data: URL, which the page's CSP allows for pictures (blob: URLs it does not).
        const reader = new FileReader();
        reader.onload = () => { img.src = reader.result; };
        reader.readAsDataURL(file);
        img.alt = file.name;
        img.className = "thumb";
        li.append(img);
      } else {
        const name = document.createElement("span");
        name.className = "name";
        name.textContent = file.name;
        li.append(name);
      }
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "attach-remove";
      remove.textContent = "×";
      remove.setAttribute("aria-label", "Remove " + file.name);
      remove.addEventListener("click", () => { files.splice(i, 1); sync(); });
      li.append(remove);
      list.append(li);
    });
  }
  function sync() {
    const transfer = new DataTransfer();
    files.forEach((file) => transfer.items.add(file));
    input.files = transfer.files;
    render();
  }

  function refusal(file) {
    if (file.type === "image/svg+xml" || /\.svg$/i.test(file.name)) return file.name + ": SVG files are not accepted.";
    if (file.type.startsWith("image/") && !isImage(file)) return file.name + ": only PNG, JPEG, GIF and WebP pictures can be attached.";
    if (files.length >= MAX_FILES) return "A message may carry up to " + MAX_FILES + " files.";
    if (isImage(file)) {
      const { name, vision } = model();
      if (!vision) return name + " does not see images, so " + file.name + " cannot be sent to it. Pick a model marked \u201csees images\u201d in the model picker.";
      if (files.filter(isImage).length >= maxImages) return "A message may carry up to " + maxImages + " pictures.";
      if (file.size > maxImageBytes) return file.name + " is " + mib(file.size) + "; pictures may be up to " + mib(maxImageBytes) + ".";
    }
    const total = files.reduce((sum, f) => sum + f.size, 0) + file.size;
    if (total > maxBody * 0.95) return "Attachments may total up to " + mib(maxBody) + " per message (the server's --max-body-mib); " + file.name + " does not fit.";
    return null;
  }
  function add(chosen) {
    const errors = [];
    for (const file of chosen) {
      const why = refusal(file);
      if (why) errors.push(why);
      else files.push(file);
    }
    sync();
    if (errors.length) say(errors.join(" "));
  }

  document.getElementById("attach-btn")?.addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    const chosen = Array.from(input.files).filter((f) => !files.includes(f));
    add(chosen);
  });

  const main = document.getElementById("main") || document.body;
  const hasFiles = (event) => Array.from(event.dataTransfer?.types || []).includes("Files");
  main.addEventListener("dragover", (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    main.classList.add("dropping");
  });
  main.addEventListener("dragleave", (event) => {
    if (event.target === main || !main.contains(event.relatedTarget)) main.classList.remove("dropping");
  });
  main.addEventListener("drop", (event) => {
    main.classList.remove("dropping");
    if (!hasFiles(event)) return;
    event.preventDefault();
    add(Array.from(event.dataTransfer.files));
  });
  document.addEventListener("paste", (event) => {
    const pasted = Array.from(event.clipboardData?.files || []);
    if (!pasted.length || !event.target.closest?.("#composer")) return;
    event.preventDefault();  // a picture, not its file name as text
    add(pasted);
  });

  document.body.addEventListener("htmx:afterRequest", (event) => {
    if (event.detail.elt === form && event.detail.successful) {
      files = [];
      sync();
    }
  });
})();
