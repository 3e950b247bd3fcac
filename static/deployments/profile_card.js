// Draws a version's performance card (the version page's profile panel, loaded and refreshed by
// htmx): throughput against client p99 per config, one colour per config and one point per
// concurrency level, the Pareto front as a dashed line and the p99 target as a vertical line (left off,
// and said so in the caption, when it lies far beyond every point, so the axis follows the data).
// The data comes from the panel's JSON element (Django's json_script) named by the canvas's
// data-chart-id; a canvas is drawn once, so each htmx refresh draws only what it brought.
(function () {
  "use strict";
  var COLOURS = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0550ae", "#6e7781", "#953800"];

  function draw(canvas) {
    var source = document.getElementById(canvas.dataset.chartId);
    if (!source || canvas.dataset.drawn || !window.Chart) { return; }
    var card = JSON.parse(source.textContent);
    var datasets = card.configs.map(function (config, i) {
      return {
        label: config.label, data: config.points, showLine: false, pointRadius: 5,
        backgroundColor: COLOURS[i % COLOURS.length], borderColor: COLOURS[i % COLOURS.length],
      };
    });
    datasets.push({ label: "Pareto front", data: card.front, showLine: true, fill: false, pointRadius: 0,
                    borderColor: "#24292f", borderDash: [6, 4], borderWidth: 1.5 });
    var top = 0;
    card.configs.forEach(function (c) { c.points.forEach(function (p) { top = Math.max(top, p.y); }); });
    // The target is left off when it lies far beyond every point (card.target_drawn): the axis fits the data.
    if (card.slo_p99_ms && card.target_drawn) {
      datasets.push({ label: "p99 target", data: [{ x: card.slo_p99_ms, y: 0 }, { x: card.slo_p99_ms, y: top * 1.1 }],
                      showLine: true, pointRadius: 0, borderColor: "#d1242f", borderWidth: 1.5 });
    }
    new window.Chart(canvas, {
      type: "scatter",
      data: { datasets: datasets },
      options: {
        animation: false, maintainAspectRatio: false,
        scales: {
          x: { type: "linear", beginAtZero: true, title: { display: true, text: "client p99 latency (ms)" } },
          y: { beginAtZero: true, grace: "10%", title: { display: true, text: "throughput (inferences/s)" } },
        },
        plugins: {
          legend: { position: "bottom" },
          tooltip: { callbacks: { label: function (item) {
            var p = item.raw;
            var at = p.concurrency ? " at concurrency " + p.concurrency : "";
            return item.dataset.label + at + ": " + Math.round(p.y) + " inferences/s, p99 " + p.x.toFixed(2) + " ms";
          } } },
        },
      },
    });
    canvas.dataset.target = card.slo_p99_ms ? (card.target_drawn ? "drawn" : "beyond the axis") : "none";
    canvas.dataset.drawn = "true";
  }

  function drawAll() {
    document.querySelectorAll("canvas.profile-chart").forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", drawAll);
  document.addEventListener("htmx:afterSettle", drawAll);
})();
