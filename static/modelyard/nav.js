// The navigation folds into a menu on narrow screens: the <details> around it is open in the page
// (so without scripts every link shows), closed here while the screen is narrow, and open again
// when it widens (its summary is hidden there by site.css).
(function () {
  "use strict";
  var menu = document.getElementById("nav-menu");
  if (!menu || !window.matchMedia) { return; }
  var narrow = window.matchMedia("(max-width: 760px)");
  function fit() { menu.open = !narrow.matches; }
  fit();
  if (narrow.addEventListener) { narrow.addEventListener("change", fit); }
})();
