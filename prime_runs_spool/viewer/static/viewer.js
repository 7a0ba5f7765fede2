// prime-runs view: the one script. Pages are rendered by the server; this keeps the parts
// marked data-refresh current, by fetching their fragment again every second and swapping
// it in (a fragment that comes back without data-refresh, the run sealed or the index caught
// up, stops the polling), and draws each canvas[data-plot] with Chart.js (vendored in
// static/, loaded by the plots page only) from the data the server put in the attribute.
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

  function draw(canvas) {
    var plot = JSON.parse(canvas.getAttribute("data-plot"));
    var chart = new window.Chart(canvas, {
      type: "bar",
      data: { labels: plot.labels, datasets: [{ label: plot.title, data: plot.counts, backgroundColor: "#8eacdc",
                                                hoverBackgroundColor: "#2f5fb3" }] },
      options: {
        animation: false, maintainAspectRatio: false,
        plugins: { legend: { display: false } },
        scales: { x: { title: { display: true, text: plot.x } },
                  y: { beginAtZero: true, title: { display: true, text: plot.y }, ticks: { precision: 0 } } },
        onClick: function (event, elements) {
          var link = elements.length ? plot.links[elements[0].index] : null;
          if (link) { window.location.href = link; }
        }
      }
    });
    canvas.setAttribute("data-drawn", String(chart.data.labels.length));
  }

  function start() {
    var parts = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < parts.length; i++) { poll(parts[i]); }
    var plots = document.querySelectorAll("canvas[data-plot]");
    for (var j = 0; j < plots.length && window.Chart; j++) { draw(plots[j]); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
