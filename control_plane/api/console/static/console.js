// The console's only script (the CSP allows no inline code): confirmation of destructive
// forms, and the live view of an activation on a model's page through server-sent events.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  const live = document.getElementById("live");
  if (live) follow(live, Number(live.dataset.wait || "0"));
});

const RETRY_MS = 5000;

function follow(panel, waitS) {
  const summary = document.getElementById("live-summary");
  const list = document.getElementById("live-phases");
  const source = new EventSource(`${panel.dataset.follow}?wait_s=${waitS}`);
  let seen = false;
  let latest = null;
  // The time since queued ticks between events (on this browser's clock against the
  // server's queued_at: hosts are assumed to keep time).
  const ticker = window.setInterval(() => {
    if (latest && latest.outcome === "running") show(latest, summary, list);
  }, 1000);
  source.addEventListener("activation", (event) => {
    latest = JSON.parse(event.data);
    seen = true;
    panel.hidden = false;
    show(latest, summary, list);
  });
  source.addEventListener("end", () => {
    window.clearInterval(ticker);
    source.close();
    // A finished activation is drawn by the server: the page shows it on reload. Otherwise
    // keep listening, so a cold start that a request sets off appears as it runs.
    if (seen) window.location.replace(window.location.pathname);
    else window.setTimeout(() => follow(panel, 25), RETRY_MS);
  });
  source.onerror = () => {
    window.clearInterval(ticker);
    source.close();
    window.setTimeout(() => follow(panel, 25), RETRY_MS);
  };
}

function show(timeline, summary, list) {
  const phases = timeline.phases || [];
  const last = phases.length ? phases[phases.length - 1] : { phase: "queued", at_s: 0 };
  const worker = timeline.worker && timeline.worker.id ? ` on ${timeline.worker.id}` : "";
  let text;
  if (timeline.outcome === "running") {
    const running = Math.max(Date.now() / 1000 - timeline.queued_at, last.at_s);
    text = `${timeline.current || last.phase}${worker}, ${running.toFixed(0)} s since queued`;
    if (timeline.bytes_total) {
      const percent = Math.floor((100 * timeline.bytes_fetched) / timeline.bytes_total);
      text += `, ${size(timeline.bytes_fetched)} of ${size(timeline.bytes_total)} fetched (${percent}%)`;
    }
  } else {
    const total = timeline.durations_s && timeline.durations_s.total;
    text = `${timeline.outcome}${worker}` + (total !== undefined ? ` in ${total.toFixed(2)} s` : "");
    if (timeline.bytes_fetched) text += `, ${size(timeline.bytes_fetched)} fetched`;
    if (timeline.error) text += `: ${timeline.error}`;
  }
  summary.textContent = `${timeline.id} (${timeline.trigger}): ${text}`;
  summary.dataset.outcome = timeline.outcome;
  summary.dataset.current = timeline.current || "";
  list.replaceChildren(
    ...phases.map((p) => {
      const item = document.createElement("li");
      item.textContent = `${p.phase} at ${p.at_s.toFixed(2)} s`;
      return item;
    }),
  );
}

function size(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}
