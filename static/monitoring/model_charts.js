// Draws the model page's charts from /api/v1/models/<name>/metrics/series/?range=...
// (the container's data-series-url): throughput, latency (mean and quantiles), error rate, queue
// vs compute time, one colour per version and one dash style per measure. Each chart gets a legend
// whose swatches draw the lines' own dash styles (its buttons hide and show a line), a text
// alternative (the canvas's description: each line's latest, lowest and highest value and the
// deployments), and a log-scale toggle, switched on by itself when one spike would flatten the other
// lines. A chart without a single point says why under it (the series API's "empty"). Vertical lines mark deployments that reached a host: solid at the start, labelled with
// what the rollout did, dashed at its end; a rollout cancelled before any host gets no line. Labels
// that would overlap collapse into a tab on their line and show while the pointer is over it.
(function () {
  "use strict";
  var COLOURS = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0550ae", "#6e7781"];
  var LATENCY = [["latency_mean_ms", "mean", []], ["latency_p50_ms", "p50", [2, 3]],
                 ["latency_p95_ms", "p95", [6, 3]], ["latency_p99_ms", "p99", [12, 3, 2, 3]]];
  var QUEUE_DASH = [4, 3];
  // A chart starts on a log scale when its highest value is this many times its median one.
  var SPIKE_RATIO = 20;
  var SVG = "http://www.w3.org/2000/svg";

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

  function drawnMarkers(markers) {
    return (markers || []).filter(function (m) { return m.touched; });
  }

  // Where the labels of deployment markers go: each on the first of LABEL_ROWS rows where it overlaps no
  // label already placed (left of its line near the right edge). A label that fits on no row is collapsed:
  // its line gets a small tab at the top instead, and the label shows while the pointer is over the line.
  var LABEL_ROWS = 3, LABEL_GAP = 6, HOVER_PX = 5;

  function placeLabels(ctx, edges, area) {
    var rows = [];
    for (var r = 0; r < LABEL_ROWS; r++) { rows.push([]); }
    return edges.map(function (edge) {
      var width = ctx.measureText(edge.label).width;
      var left = edge.px + 3 + width > area.right ? edge.px - 3 - width : edge.px + 3;
      for (var row = 0; row < LABEL_ROWS; row++) {
        var free = rows[row].every(function (box) {
          return left + width + LABEL_GAP <= box[0] || left >= box[1] + LABEL_GAP;
        });
        if (free) {
          rows[row].push([left, left + width]);
          return { edge: edge, x: left, row: row };
        }
      }
      return { edge: edge, x: null, row: null };
    });
  }

  function drawLabel(ctx, text, x, y, colour, boxed) {
    if (boxed) {
      var width = ctx.measureText(text).width;
      ctx.fillStyle = "rgba(255, 255, 255, 0.92)";
      ctx.fillRect(x - 2, y - 10, width + 4, 13);
    }
    ctx.fillStyle = colour;
    ctx.fillText(text, x, y);
  }

  // Chart.js plugin: vertical lines for the deployments that reached a host.
  var markerPlugin = {
    id: "deploymentMarkers",
    afterDatasetsDraw: function (chart, args, options) {
      var x = chart.scales.x, area = chart.chartArea, ctx = chart.ctx;
      var starts = [];
      ctx.save();
      ctx.font = "11px system-ui, sans-serif";
      drawnMarkers(options.markers).forEach(function (m) {
        var colour = m.status === "failed" ? "#cf222e" : "#57606a";
        [[m.start, []], [m.end, [5, 4]]].forEach(function (edge, isEnd) {
          if (edge[0] === null || edge[0] < x.min || edge[0] > x.max) { return; }
          var px = x.getPixelForValue(edge[0]);
          ctx.strokeStyle = colour;
          ctx.setLineDash(edge[1]);
          ctx.lineWidth = 1;
          ctx.beginPath(); ctx.moveTo(px, area.top); ctx.lineTo(px, area.bottom); ctx.stroke();
          if (!isEnd) { starts.push({ px: px, label: m.label, colour: colour }); }
        });
      });
      starts.sort(function (a, b) { return a.px - b.px; });
      var placed = placeLabels(ctx, starts, area), collapsed = 0;
      ctx.setLineDash([]);
      placed.forEach(function (p) {
        if (p.x !== null) {
          drawLabel(ctx, p.edge.label, p.x, area.top + 11 + p.row * 12, p.edge.colour, false);
        } else {
          collapsed += 1;
          ctx.fillStyle = p.edge.colour;
          ctx.fillRect(p.edge.px - 3, area.top, 6, 6);
        }
      });
      var hovered = chart.$hoveredMarker;
      if (hovered) {
        var width = ctx.measureText(hovered.label).width;
        var hx = hovered.px + 6 + width > area.right ? hovered.px - 6 - width : hovered.px + 6;
        drawLabel(ctx, hovered.label, hx, area.top + 11 + LABEL_ROWS * 12, hovered.colour, true);
      }
      chart.$markerStarts = starts;
      chart.canvas.dataset.markerLabelsCollapsed = String(collapsed);
      ctx.restore();
    },
    afterEvent: function (chart, args) {
      var event = args.event;
      if (event.type !== "mousemove" && event.type !== "mouseout") { return; }
      var near = null;
      if (event.type === "mousemove") {
        (chart.$markerStarts || []).forEach(function (s) {
          if (Math.abs(s.px - event.x) <= HOVER_PX && (!near || Math.abs(s.px - event.x) < Math.abs(near.px - event.x))) {
            near = s;
          }
        });
      }
      if (near !== chart.$hoveredMarker) {
        chart.$hoveredMarker = near;
        chart.canvas.dataset.hoveredMarker = near ? near.label : "";
        args.changed = true;
      }
    },
  };

  // Tick spacing that lands on round clock times for each page range.
  function tickStep(span) {
    var steps = [60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400];
    for (var i = 0; i < steps.length; i++) { if (span / steps[i] <= 8) { return steps[i]; } }
    return 86400;
  }

  function spiky(datasets) {
    var values = [];
    datasets.forEach(function (d) { d.data.forEach(function (p) { if (p.y > 0) { values.push(p.y); } }); });
    if (values.length < 2) { return false; }
    values.sort(function (a, b) { return a - b; });
    return values[values.length - 1] > SPIKE_RATIO * values[Math.floor(values.length / 2)];
  }

  function yScale(log, unit) {
    var title = { display: true, text: unit };
    return log ? { type: "logarithmic", title: title } : { type: "linear", beginAtZero: true, grace: "10%", title: title };
  }

  function number(value) {
    var size = Math.abs(value);
    return size !== 0 && size < 0.01 ? value.toPrecision(2) : value.toFixed(2);
  }

  // The text alternative: what each line did and which deployments the chart marks.
  function describe(datasets, unit, body, why) {
    var parts = datasets.map(function (d) {
      if (!d.data.length) { return d.label + ": no data."; }
      var ys = d.data.map(function (p) { return p.y; });
      return d.label + ": latest " + number(ys[ys.length - 1]) + ", lowest " + number(Math.min.apply(null, ys)) +
        ", highest " + number(Math.max.apply(null, ys)) + " " + unit + ".";
    });
    if (why) {
      parts.unshift(why.charAt(0).toUpperCase() + why.slice(1));
    } else if (!datasets.length) {
      parts.push("No data in the last " + body.range + ".");
    }
    (body.markers || []).forEach(function (m) {
      parts.push("Deployment at " + timeLabel(m.start, body.range_seconds) + ": " + m.label +
        (m.touched ? "." : " (no line drawn: it reached no host)."));
    });
    return parts.join(" ");
  }

  function swatch(dataset) {
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "swatch");
    svg.setAttribute("width", "28");
    svg.setAttribute("height", "10");
    svg.setAttribute("aria-hidden", "true");
    var stroke = document.createElementNS(SVG, "line");
    [["x1", "1"], ["y1", "5"], ["x2", "27"], ["y2", "5"], ["stroke", dataset.borderColor],
     ["stroke-width", String(dataset.borderWidth)]].forEach(function (a) { stroke.setAttribute(a[0], a[1]); });
    if (dataset.borderDash.length) { stroke.setAttribute("stroke-dasharray", dataset.borderDash.join(" ")); }
    svg.appendChild(stroke);
    return svg;
  }

  function legend(chart, list) {
    list.textContent = "";
    chart.data.datasets.forEach(function (dataset, i) {
      var item = document.createElement("li");
      var button = document.createElement("button");
      button.type = "button";
      button.dataset.index = String(i);
      button.setAttribute("aria-pressed", "true");
      button.title = "show or hide this line";
      button.appendChild(swatch(dataset));
      button.appendChild(document.createTextNode(dataset.label));
      button.addEventListener("click", function () {
        var visible = !chart.isDatasetVisible(i);
        chart.setDatasetVisibility(i, visible);
        button.setAttribute("aria-pressed", String(visible));
        chart.update();
      });
      item.appendChild(button);
      list.appendChild(item);
    });
  }

  function scaleToggle(chart, button, unit) {
    function show(log) {
      chart.options.scales.y = yScale(log, unit);
      button.setAttribute("aria-pressed", String(log));
      chart.canvas.dataset.scale = log ? "logarithmic" : "linear";
    }
    show(chart.options.scales.y.type === "logarithmic");
    button.hidden = false;
    button.addEventListener("click", function () {
      show(button.getAttribute("aria-pressed") !== "true");
      chart.update();
    });
  }

  // Under a chart without a single point: why (the series API's "empty" reason of its metric).
  function emptyReason(canvas, datasets, reason) {
    var points = datasets.reduce(function (n, d) { return n + d.data.length; }, 0);
    var box = canvas.closest("figure").querySelector(".chart-empty");
    box.textContent = points ? "" : (reason || "no data in the range") + ".";
    box.hidden = Boolean(points);
    return points ? "" : box.textContent;
  }

  function draw(canvasId, datasets, unit, body, metric) {
    var canvas = document.getElementById(canvasId);
    if (!canvas) { return; }
    var why = emptyReason(canvas, datasets, (body.empty || {})[metric]);
    var now = Date.now() / 1000;
    var span = body.range_seconds;
    var chart = new window.Chart(canvas, {
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
          y: yScale(spiky(datasets), unit),
        },
        plugins: {
          legend: { display: false },
          deploymentMarkers: { markers: body.markers },
        },
      },
    });
    canvas.dataset.points = String(datasets.reduce(function (n, d) { return n + d.data.length; }, 0));
    var list = document.getElementById(canvasId + "-legend");
    if (list) { legend(chart, list); }
    var text = document.getElementById(canvasId + "-text");
    if (text) { text.textContent = describe(datasets, unit, body, why); }
    var toggle = document.querySelector('.scale-toggle[data-chart="' + canvasId + '"]');
    if (toggle) { scaleToggle(chart, toggle, unit); }
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
    }), "inferences/s", body, "throughput");
    var latency = [];
    LATENCY.forEach(function (q) {
      (s[q[0]] || []).forEach(function (r) {
        latency.push(line("v" + r.version + " " + q[1], r, colourOf(versions, r.version), q[2]));
      });
    });
    draw("chart-latency", latency, "ms", body, "latency_mean_ms");
    draw("chart-errors", s.error_rate.map(function (r) {
      return line("v" + r.version, r, colourOf(versions, r.version), [], 100);
    }), "% of requests", body, "error_rate");
    var queue = [];
    s.queue_ms.forEach(function (r) { queue.push(line("v" + r.version + " queue", r, colourOf(versions, r.version), QUEUE_DASH)); });
    s.compute_ms.forEach(function (r) { queue.push(line("v" + r.version + " compute", r, colourOf(versions, r.version))); });
    draw("chart-queue", queue, "ms per request", body, "queue_ms");
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
