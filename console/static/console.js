// The topic page's charts: each [data-series-url] element polls the console's JSON
// series (sampled server-side while the page is open) and redraws with Plotly.
// Loaded with `defer` from this origin only (the console's Content-Security-Policy).
"use strict";

(function () {
  const LAYOUT = {
    margin: { l: 56, r: 16, t: 36, b: 40 },
    xaxis: { type: "date", title: { text: "time" } },
    legend: { orientation: "h", y: -0.2 },
  };
  // The mode bar on hover only: drawn always, it covers the chart's title.
  const CONFIG = { displaylogo: false, responsive: true, displayModeBar: "hover" };

  function traces(kind, series) {
    const x = series.time_ms.map((ms) => new Date(ms));
    if (kind === "backlog") {
      return [
        { x, y: series.backlog_messages, name: "backlog (messages)", mode: "lines+markers", line: { color: "#2456c9" } },
        { x, y: series.unacked_messages, name: "unacked", mode: "lines+markers", line: { color: "#d97706" } },
      ];
    }
    return [
      { x, y: series.in_rate, name: "in (msg/s)", mode: "lines+markers", line: { color: "#1c7c3c" } },
      { x, y: series.out_rate, name: "out (msg/s)", mode: "lines+markers", line: { color: "#b3261e" } },
    ];
  }

  function title(kind) {
    return kind === "backlog" ? "Backlog and unacked messages" : "Publish and dispatch rates";
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
    const layout = Object.assign({}, LAYOUT, { title: { text: title(kind), font: { size: 14 }, x: 0.02, xanchor: "left" } });
    await Plotly.react(element, traces(kind, series), layout, CONFIG);
    element.dataset.points = String(series.time_ms.length);
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
