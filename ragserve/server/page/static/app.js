// The page: ask, watch the answer arrive on the OpenAI door's stream, open a citation in its
// source, see where the time went. The key lives in this page's memory only (never stored).
// window.ragservePage keeps what the page measured of itself, per answer (docs/page.md).

import { AnswerView, showSource } from "./answer.js";
import { drawFirstTokens, drawTimeline } from "./charts.js";
import { PageError, chunks, getJson, headers, refusal } from "./stream.js";

const $ = (id) => document.getElementById(id);
const KEPT = 20; // first-token times plotted
const state = { turns: [], firstTokens: [], fields: {}, running: null };
const measured = { answers: [] };
window.ragservePage = measured;

const key = () => $("key").value.trim();
const view = new AnswerView($("answer"), $("passages"), $("verdict"), openSource);

function say(text) {
  $("message").textContent = text;
  $("message").hidden = !text;
}

async function openSource(chunkId, start, end) {
  const query = new URLSearchParams({ chunk_id: chunkId });
  if (start !== undefined) query.set("start", String(start));
  if (end !== undefined) query.set("end", String(end));
  try {
    const found = await getJson(`api/source?${query}`, key());
    showSource({ title: $("source-title"), whereLine: $("source-where"), text: $("source-text"), box: $("source") }, found);
  } catch (error) {
    say(error.message);
  }
}

function filterOf() {
  const field = $("filter-field").value;
  const raw = $("filter-value").value.trim();
  if (!field || !raw) return undefined;
  const type = state.fields[field];
  let condition = { key: field, match: { value: raw } };
  if (type === "integer") condition = { key: field, match: { value: Number(raw) } };
  if (type === "bool") condition = { key: field, match: { value: raw === "true" } };
  if (type === "float" || type === "datetime") condition = { key: field, range: { gte: type === "float" ? Number(raw) : raw } };
  return { must: [condition] };
}

function showTurns() {
  $("turns").replaceChildren(
    ...state.turns.map((turn) => {
      const line = document.createElement("p");
      line.className = `turn ${turn.role}`;
      line.textContent = turn.content;
      return line;
    }),
  );
}

// One streamed answer: each chunk handled as it comes; the time the page spends on it is measured.
async function ask(question) {
  const body = { model: "ragserve", stream: true, messages: [...state.turns, { role: "user", content: question }] };
  const filter = filterOf();
  if (filter) body.filter = filter;
  const aborter = new AbortController();
  state.running = aborter;
  const record = { chunks: 0, handleMs: 0, settleMs: 0, events: [] };
  const started = performance.now();
  view.reset();
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(key(), true), body: JSON.stringify(body), signal: aborter.signal,
  });
  if (!response.ok) throw await refusal(response);
  let final = null, lastChunkAt = 0;
  for await (const chunk of chunks(response)) {
    lastChunkAt = performance.now();
    handle(chunk, record, lastChunkAt - started);
    if (chunk.ragserve?.final) final = chunk.ragserve.final;
    record.chunks += 1;
    record.handleMs += performance.now() - lastChunkAt;
  }
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  record.settleMs = performance.now() - lastChunkAt; // last chunk -> its rendering painted
  measured.answers.push(record);
  if (final && !final.declined) {
    state.turns.push({ role: "user", content: question }, { role: "assistant", content: view.text });
    showTurns();
  }
}

function handle(chunk, record, at) {
  const extra = chunk.ragserve ?? {};
  const delta = chunk.choices?.[0]?.delta ?? {};
  if (extra.retrieval) {
    record.events.push(["retrieval", at]);
    view.passages(extra.retrieval);
    drawTimeline($("timeline"), extra.retrieval.timings);
  }
  if (delta.content) view.token(delta.content);
  if (extra.citation) {
    record.events.push(["citation", at]);
    view.citation(extra.citation);
  }
  if (extra.final) {
    record.events.push(["final", at]);
    view.final(extra.final);
    drawTimeline($("timeline"), extra.final.timings);
    if (extra.final.timings?.ttft_ms) {
      state.firstTokens = [...state.firstTokens, extra.final.timings.ttft_ms].slice(-KEPT);
      drawFirstTokens($("ttft"), state.firstTokens, KEPT);
    }
  }
}

async function loadSide() {
  try {
    const [info, fields] = await Promise.all([getJson("api/info", key()), getJson("api/fields", key())]);
    state.fields = fields.fields ?? {};
    const select = $("filter-field");
    select.replaceChildren(new Option("no filter", ""), ...Object.keys(state.fields).sort().map((f) => new Option(`${f} (${state.fields[f]})`, f)));
    showInfo(info);
  } catch (error) {
    say(error.message);
  }
}

function warmingOf(warming) {
  if (warming.done) return `done: ${warming.passages ?? 0} passages`;
  if (warming.planned) return `${warming.passages ?? 0} of ${warming.planned} passages`;
  return "not started";
}

function showInfo(info) {
  const rows = [
    ["index version", info.index_version],
    ["chunks", info.index_chunks],
    ["embedder", info.embedder_model],
    ["generator", info.generator_model],
    ["warming", warmingOf(info.warming ?? {})],
    ["in flight", info.requests_in_flight ?? 0],
    ...(info.generator_settings ?? []).map((s) => [s.name, s.value]),
  ];
  $("info").replaceChildren(...rows.flatMap(([name, value]) => {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value === undefined || value === "" ? "-" : String(value);
    return [dt, dd];
  }));
}

$("ask").addEventListener("submit", async (event) => {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question || state.running) return;
  say("");
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    await ask(question);
    $("question").value = "";
  } catch (error) {
    view.box.dataset.state = "failed";
    if (error.name !== "AbortError") say(error instanceof PageError ? error.message : `The answer stopped: ${error.message}`);
  } finally {
    state.running = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
});
$("stop").addEventListener("click", () => state.running?.abort());
$("forget").addEventListener("click", () => {
  state.turns = [];
  showTurns();
  view.reset();
});
$("source-close").addEventListener("click", () => { $("source").hidden = true; });
$("refresh").addEventListener("click", loadSide);
$("key").addEventListener("change", loadSide);
loadSide();
