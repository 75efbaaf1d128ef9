// Runs before the page paints: apply the theme the user picked (else the OS's, through CSS).
(function () {
  "use strict";
  try {
    var theme = localStorage.getItem("localchat-theme");
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  } catch (e) { /* storage disabled: follow the OS */ }
})();
