// Draws the model page's charts from /api/v1/models/<name>/metrics/series/?range=...
// (the container's data-series-url): throughput, latency quantiles, error rate, queue vs
// compute time, one line per version, with vertical lines at deployment start (solid) and
// end (dashed).
(function () {
  "use strict";
  var COLOURS = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0550ae", "#6e7781"];
  var QUANTILES = [["latency_p50_ms", "p50", [2, 3]], ["latency_p95_ms", "p95", []], ["latency_p99_ms", "p99", [8, 4]]];

  function timeLabel(seconds, spanSeconds) {
    var d = new Date(seconds * 1000);
    if (spanSeconds > 86400) {
      return d.toLocaleDateString([], { month: "short", day: "numeric" }) + " " +
        d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
    }
    return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  }

  function colourOf(versions, version) {
    var i = versions.indexOf(version);
    return COLOURS[(i < 0 ? 0 : i) % COLOURS.length];
  }

  function line(label, rows, colour, dash, scale) {
    return {
      label: label,
      data: rows.points.map(function (p) { return { x: p[0], y: p[1] * (scale || 1) }; }),
      borderColor: colour, backgroundColor: colour, borderDash: dash || [],
      pointRadius: 0, borderWidth: 2, tension: 0,
    };
  }

  // Chart.js plugin: vertical lines for deployments.
  var markerPlugin = {
    id: "deploymentMarkers",
    afterDatasetsDraw: function (chart, args, options) {
      var markers = options.markers || [];
      var x = chart.scales.x, area = chart.chartArea, ctx = chart.ctx;
      ctx.save();
      ctx.font = "11px system-ui, sans-serif";
      markers.forEach(function (m, i) {
        [[m.start, [], "v" + m.version], [m.end, [5, 4], ""]].forEach(function (edge) {
          if (edge[0] === null || edge[0] < x.min || edge[0] > x.max) { return; }
          var px = x.getPixelForValue(edge[0]);
          ctx.strokeStyle = m.status === "failed" ? "#cf222e" : "#57606a";
          ctx.setLineDash(edge[1]);
          ctx.lineWidth = 1;
          ctx.beginPath(); ctx.moveTo(px, area.top); ctx.lineTo(px, area.bottom); ctx.stroke();
          if (edge[2]) {
            // Labels of nearby deployments are staggered; near the right edge they go left of the line.
            var width = ctx.measureText(edge[2]).width;
            var lx = px + 3 + width > area.right ? px - 3 - width : px + 3;
            ctx.fillStyle = ctx.strokeStyle;
            ctx.fillText(edge[2], lx, area.top + 11 + (i % 3) * 12);
          }
        });
      });
      ctx.restore();
    },
  };

  // Tick spacing that lands on round clock times for each page range.
  function tickStep(span) {
    var steps = [60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400];
    for (var i = 0; i < steps.length; i++) { if (span / steps[i] <= 8) { return steps[i]; } }
    return 86400;
  }

  function draw(canvasId, datasets, unit, body) {
    var canvas = document.getElementById(canvasId);
    if (!canvas) { return; }
    var now = Date.now() / 1000;
    var span = body.range_seconds;
    new window.Chart(canvas, {
      type: "line",
      data: { datasets: datasets },
      plugins: [markerPlugin],
      options: {
        animation: false, parsing: false, maintainAspectRatio: false,
        scales: {
          x: { type: "linear", min: now - span, max: now, title: { display: true, text: "time (your local clock)" },
               afterBuildTicks: function (axis) {
                 var step = tickStep(span), ticks = [];
                 for (var t = Math.ceil(axis.min / step) * step; t <= axis.max; t += step) { ticks.push({ value: t }); }
                 axis.ticks = ticks;
               },
               ticks: { callback: function (v) { return timeLabel(v, span); } } },
          y: { beginAtZero: true, grace: "10%", title: { display: true, text: unit } },
        },
        plugins: {
          legend: { position: "bottom", labels: { usePointStyle: true, pointStyle: "line", boxWidth: 24 } },
          deploymentMarkers: { markers: body.markers },
        },
      },
    });
    canvas.dataset.points = String(datasets.reduce(function (n, d) { return n + d.data.length; }, 0));
  }

  function notice(text) {
    var el = document.getElementById("chart-notice");
    if (el) { el.textContent = text; el.hidden = false; }
  }

  function render(body) {
    var s = body.series;
    var versions = [];
    Object.keys(s).forEach(function (key) {
      s[key].forEach(function (row) { if (versions.indexOf(row.version) < 0) { versions.push(row.version); } });
    });
    versions.sort(function (a, b) { return Number(a) - Number(b); });
    draw("chart-throughput", s.throughput.map(function (r) {
      return line("v" + r.version, r, colourOf(versions, r.version));
    }), "inferences/s", body);
    var latency = [];
    QUANTILES.forEach(function (q) {
      (s[q[0]] || []).forEach(function (r) {
        latency.push(line("v" + r.version + " " + q[1], r, colourOf(versions, r.version), q[2]));
      });
    });
    draw("chart-latency", latency, "ms", body);
    draw("chart-errors", s.error_rate.map(function (r) {
      return line("v" + r.version, r, colourOf(versions, r.version), [], 100);
    }), "% of requests", body);
    var queue = [];
    s.queue_ms.forEach(function (r) { queue.push(line("v" + r.version + " queue", r, colourOf(versions, r.version), [4, 3])); });
    s.compute_ms.forEach(function (r) { queue.push(line("v" + r.version + " compute", r, colourOf(versions, r.version))); });
    draw("chart-queue", queue, "ms per request", body);
    document.getElementById("model-charts").dataset.drawn = "true";
  }

  function load() {
    var box = document.getElementById("model-charts");
    if (!box || !window.Chart) { return; }
    fetch(box.dataset.seriesUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (!res.ok) { notice("Charts unavailable: " + (res.body.detail || "error")); return; }
        render(res.body);
      })
      .catch(function () { notice("Charts unavailable: the metrics API did not answer."); });
  }

  document.addEventListener("DOMContentLoaded", load);
})();
