// The topic page's charts: each [data-series-url] element polls the console's JSON
// series (sampled server-side while the page is open) and redraws with Plotly.
// Loaded with `defer` from this origin only (the console's Content-Security-Policy).
"use strict";

(function () {
  const LAYOUT = {
    margin: { l: 56, r: 16, t: 36, b: 40 },
    // Epoch ms on a date axis read as UTC, as every other time the console shows (a JS
    // Date would be drawn in the browser's zone).
    xaxis: { type: "date", title: { text: "time (UTC)" } },
    // Counts, rates and latencies are never negative: an all-zero series is drawn at the
    // bottom of the chart, not in the middle of a -1..1 axis.
    yaxis: { rangemode: "nonnegative" },
    legend: { orientation: "h", y: -0.2 },
  };
  // The mode bar on hover only: drawn always, it covers the chart's title.
  const CONFIG = { displaylogo: false, responsive: true, displayModeBar: "hover" };

  const TITLES = {
    backlog: "Backlog and unacked messages",
    rates: "Publish and dispatch rates (msg/s)",
    latency: "p99 latency (s)",
  };

  function traces(lines) {
    return lines.map((line) => ({
      x: line.time_ms,
      y: line.values,
      name: line.name,
      mode: "lines+markers",
      marker: { size: 4 },
    }));
  }

  async function refresh(element) {
    let series;
    try {
      const response = await fetch(element.dataset.seriesUrl, { credentials: "same-origin", cache: "no-store" });
      series = await response.json();
      if (!response.ok) {
        element.dataset.error = series.error || String(response.status);
        element.textContent = series.error || `HTTP ${response.status}`;
        return;
      }
    } catch (err) {
      // The console went away or the network dropped: try again at the next tick.
      element.dataset.error = String(err);
      return;
    }
    delete element.dataset.error;
    const kind = element.dataset.kind;
    const lines = series.charts[kind] || [];
    const layout = Object.assign({}, LAYOUT, {
      title: { text: TITLES[kind] || kind, font: { size: 14 }, x: 0.02, xanchor: "left" },
    });
    await Plotly.react(element, traces(lines), layout, CONFIG);
    element.dataset.points = String(Math.max(0, ...lines.map((line) => line.time_ms.length)));
    element.dataset.source = series.source;
  }

  function start() {
    for (const element of document.querySelectorAll("[data-series-url]")) {
      const every = Math.max(250, Number(element.dataset.refreshMs) || 5000);
      refresh(element);
      setInterval(() => refresh(element), every);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
