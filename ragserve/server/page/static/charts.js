// Where the time went: one request's stages as bars on its own time axis (from the call's
// arrival), and the last requests' first-token times as a small bar plot. Plain DOM and SVG.

const SVG = "http://www.w3.org/2000/svg";

// The stages in the order they run; retrieval's own stages laid end to end from the start.
function stages(t) {
  const rows = [];
  let at = 0;
  for (const [name, key] of [["cache", "cache_ms"], ["embed", "embed_ms"], ["search", "search_ms"],
    ["rerank", "rerank_ms"], ["evidence", "evidence_ms"]]) {
    if (t[key]) {
      rows.push({ name, start: at, ms: t[key] });
      at += t[key];
    }
  }
  const retrieved = t.retrieval_total_ms ?? at;
  if (t.retrieval_total_ms) rows.push({ name: "retrieval", start: 0, ms: retrieved, kind: "total" });
  if (t.reader_ms) rows.push({ name: "reader", start: retrieved, ms: t.reader_ms });
  let next = retrieved;
  for (const [name, key] of [["context", "context_ms"], ["prompt", "prompt_ms"], ["engine wait", "engine_wait_ms"]]) {
    if (t[key]) {
      rows.push({ name, start: next, ms: t[key] });
      next += t[key];
    }
  }
  if (t.ttft_ms) rows.push({ name: "first token", start: 0, ms: t.ttft_ms, kind: "total" });
  if (t.generation_ms) rows.push({ name: "generation", start: t.ttft_ms ?? next, ms: t.generation_ms });
  return rows;
}

export function drawTimeline(box, timings) {
  const rows = stages(timings || {});
  const span = Math.max(timings?.total_ms ?? 0, ...rows.map((r) => r.start + r.ms), 1);
  box.replaceChildren();
  for (const row of rows) {
    const line = document.createElement("div");
    line.className = `stage ${row.kind ?? ""}`;
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = row.name;
    const track = document.createElement("span");
    track.className = "track";
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.left = `${(100 * row.start) / span}%`;
    bar.style.width = `${Math.max(0.5, (100 * row.ms) / span)}%`;
    track.append(bar);
    const value = document.createElement("span");
    value.className = "ms";
    value.textContent = `${row.ms.toFixed(1)} ms`;
    line.append(label, track, value);
    box.append(line);
  }
  if (timings?.total_ms) {
    const total = document.createElement("p");
    total.className = "total";
    total.textContent = `total ${timings.total_ms.toFixed(1)} ms`;
    box.append(total);
  }
}

export function drawFirstTokens(box, values, slots) {
  const width = 260, height = 80, gap = 2;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height + 14}`);
  svg.setAttribute("role", "img");
  const top = Math.max(...values, 1);
  const step = width / Math.max(values.length, slots);
  values.forEach((ms, i) => {
    const bar = document.createElementNS(SVG, "rect");
    const h = Math.max(1, (height * ms) / top);
    bar.setAttribute("x", String(i * step + gap / 2));
    bar.setAttribute("y", String(height - h));
    bar.setAttribute("width", String(Math.max(1, step - gap)));
    bar.setAttribute("height", String(h));
    const tip = document.createElementNS(SVG, "title");
    tip.textContent = `${ms.toFixed(1)} ms`;
    bar.append(tip);
    svg.append(bar);
  });
  const label = document.createElementNS(SVG, "text");
  label.setAttribute("x", "0");
  label.setAttribute("y", String(height + 12));
  const last = values.length ? values[values.length - 1].toFixed(1) : "-";
  label.textContent = `last ${last} ms · most ${top.toFixed(1)} ms · ${values.length} requests`;
  svg.append(label);
  box.replaceChildren(svg);
}
