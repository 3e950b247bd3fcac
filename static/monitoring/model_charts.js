// Draws the model page's throughput and latency charts from the series API.
// The container's data-series-url points at /api/v1/models/<name>/metrics/series/.
(function () {
  "use strict";
  var COLOURS = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0550ae", "#6e7781"];

  function timeLabel(seconds) {
    var d = new Date(seconds * 1000);
    return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  function datasets(rows) {
    return rows.map(function (row, i) {
      return {
        label: "v" + row.version,
        data: row.points.map(function (p) { return { x: p[0], y: p[1] }; }),
        borderColor: COLOURS[i % COLOURS.length],
        backgroundColor: COLOURS[i % COLOURS.length],
        pointRadius: 0,
        borderWidth: 2,
        tension: 0.2,
      };
    });
  }

  function draw(canvasId, rows, unit) {
    var canvas = document.getElementById(canvasId);
    if (!canvas) { return null; }
    return new window.Chart(canvas, {
      type: "line",
      data: { datasets: datasets(rows) },
      options: {
        animation: false,
        parsing: false,
        maintainAspectRatio: false,
        scales: {
          x: { type: "linear", title: { display: true, text: "time (UTC, local display)" },
               ticks: { callback: function (v) { return timeLabel(v); }, maxTicksLimit: 8 } },
          y: { beginAtZero: true, title: { display: true, text: unit } },
        },
        plugins: { legend: { position: "bottom" } },
      },
    });
  }

  function notice(text) {
    var el = document.getElementById("chart-notice");
    if (el) { el.textContent = text; el.hidden = false; }
  }

  function load() {
    var box = document.getElementById("model-charts");
    if (!box || !window.Chart) { return; }
    fetch(box.dataset.seriesUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        return r.json().then(function (body) { return { ok: r.ok, body: body }; });
      })
      .then(function (res) {
        if (!res.ok) { notice("Charts unavailable: " + (res.body.detail || "error")); return; }
        var s = res.body.series;
        if (!s.throughput.length && !s.latency_p95_ms.length) { notice("No traffic recorded in this range."); }
        draw("chart-throughput", s.throughput, "inferences/s");
        draw("chart-latency", s.latency_p95_ms, "ms");
        box.dataset.drawn = String(s.throughput.length);
      })
      .catch(function () { notice("Charts unavailable: the metrics API did not answer."); });
  }

  document.addEventListener("DOMContentLoaded", load);
})();
