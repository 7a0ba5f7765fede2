// prime-runs view: the one script. Pages are rendered by the server; this only keeps the
// parts marked data-refresh current, by fetching their fragment again every second and
// swapping it in. A fragment that comes back without data-refresh (the run sealed, the
// index caught up) stops the polling. No other behaviour lives here.
(function () {
  "use strict";
  var INTERVAL_MS = 1000;

  function poll(el) {
    var url = el.getAttribute("data-refresh");
    if (!url) { return; }
    window.setTimeout(function () {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          var holder = document.createElement("div");
          holder.innerHTML = html;  // the server's own, escaped, markup
          var fresh = holder.firstElementChild;
          if (!fresh || fresh.id !== el.id) { poll(el); return; }
          el.replaceWith(fresh);
          poll(fresh);
        })
        .catch(function () { poll(el); });
    }, INTERVAL_MS);
  }

  function start() {
    var parts = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < parts.length; i++) { poll(parts[i]); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
