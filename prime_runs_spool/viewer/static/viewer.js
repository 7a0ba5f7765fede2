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

  var PALETTE = ["#2f5fb3", "#c0504d", "#3a9a55", "#9a6400", "#6f4fa8", "#1a8a8a", "#b35a8c", "#66707c"];

  function drawAcross(canvas) {
    var d = JSON.parse(canvas.getAttribute("data-across"));
    var color = function (i) { return PALETTE[d.group_of[i] % PALETTE.length]; };
    var chart = new window.Chart(canvas, {
      data: {
        labels: d.labels,
        datasets: [
          { type: "bar", label: "95% interval", data: d.lows.map(function (low, i) { return [low, d.highs[i]]; }),
            backgroundColor: d.labels.map(function (_, i) { return color(i) + "55"; }), barPercentage: 0.35 },
          { type: "line", label: "mean " + d.value, data: d.means, showLine: false, pointRadius: 5,
            pointBackgroundColor: d.labels.map(function (_, i) { return color(i); }), borderColor: "transparent" }
        ]
      },
      options: {
        animation: false, maintainAspectRatio: false,
        plugins: { legend: { display: false },
                   tooltip: { callbacks: { afterLabel: function (item) { return d.by + ": " + d.groups[d.group_of[item.dataIndex]]; } } } },
        scales: { x: { title: { display: true, text: "run (grouped by " + d.by + ")" } },
                  y: { title: { display: true, text: "mean " + d.value } } },
        onClick: function (event, elements) {
          var link = elements.length ? d.links[elements[0].index] : null;
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
    var across = document.querySelectorAll("canvas[data-across]");
    for (var k = 0; k < across.length && window.Chart; k++) { drawAcross(across[k]); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
