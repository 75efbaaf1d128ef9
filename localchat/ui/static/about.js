// The About dialog: opened by the About (info) button (htmx fills it from /ui/about), closed by its button or Esc.
(function () {
  "use strict";
  document.addEventListener("click", (event) => {
    if (event.target.closest("#about-open")) document.getElementById("about")?.showModal();
    if (event.target.closest("#about-close")) document.getElementById("about")?.close();
  });
})();
