// One answer as it arrives: its passages when retrieval ends, its text token by token, each
// citation marker [n] a link from the moment its citation event arrives, and the final verdict
// (declined, unsupported). Text is only ever set as text: nothing from the server becomes markup.

const MARKER = /\[(\d+)\]/g;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// `text` with [start, end) wrapped in <mark>.
export function marked(text, start, end) {
  const box = document.createDocumentFragment();
  const a = Math.max(0, Math.min(start, text.length));
  const b = Math.max(a, Math.min(end, text.length));
  box.append(text.slice(0, a), el("mark", "", text.slice(a, b)), text.slice(b));
  return box;
}

export function where(location) {
  if (!location) return "";
  const parts = [location.locator];
  if (location.page) parts.push(`page ${location.page}`);
  if (location.section?.length) parts.push(location.section.join(" › "));
  return parts.filter(Boolean).join(" · ");
}

export class AnswerView {
  constructor(box, passages, verdict, open) {
    this.box = box;
    this.passagesBox = passages;
    this.verdict = verdict;
    this.open = open; // (chunk_id, start, end) => shows the source
    this.reset();
  }

  reset() {
    this.text = "";
    this.citations = new Map();
    this.box.replaceChildren();
    this.box.className = "answer";
    this.box.dataset.state = "waiting";
    this.passagesBox.replaceChildren();
    this.verdict.replaceChildren();
    this.verdict.hidden = true;
  }

  passages(retrieval) {
    for (const p of retrieval.passages ?? []) {
      const item = el("li", "passage");
      const head = el("div", "passage-head");
      const title = el("a", "passage-title", p.title || p.doc_id);
      title.href = "#";
      title.addEventListener("click", (event) => {
        event.preventDefault();
        this.open(p.chunk_id);
      });
      head.append(title, el("span", "score", (p.score ?? 0).toFixed(3)), el("span", "where", where(p.location)));
      const body = el("p", "passage-text");
      const h = p.highlight;
      body.append(h ? marked(p.text, h.start ?? 0, h.end ?? 0) : p.text);
      item.append(head, body);
      this.passagesBox.append(item);
    }
  }

  token(content) {
    this.box.dataset.state = "streaming";
    this.text += content;
    const tail = this.box.lastChild;
    if (tail && tail.nodeType === Node.TEXT_NODE) tail.appendData(content);
    else this.box.append(content);
  }

  citation(citation) {
    this.citations.set(citation.marker, citation);
    this.render();
  }

  // The whole text again, each marker with a citation a link (a citation arrives once its marker is out).
  render() {
    const parts = [];
    let at = 0;
    for (const match of this.text.matchAll(MARKER)) {
      const citation = this.citations.get(Number(match[1]));
      if (!citation) continue;
      parts.push(this.text.slice(at, match.index), this.link(match[0], citation));
      at = match.index + match[0].length;
    }
    parts.push(this.text.slice(at));
    this.box.replaceChildren(...parts.filter((part) => part !== ""));
  }

  link(label, citation) {
    const link = el("a", citation.supported ? "cite" : "cite unsupported", label);
    link.href = "#";
    link.dataset.marker = String(citation.marker);
    link.title = `${citation.location?.locator ?? citation.doc_id}: ${citation.quote ?? ""}`;
    link.addEventListener("click", (event) => {
      event.preventDefault();
      this.open(citation.chunk_id, citation.quote_start ?? 0, citation.quote_end ?? 0);
    });
    return link;
  }

  final(summary) {
    for (const citation of summary.citations ?? []) this.citations.set(citation.marker, citation);
    this.render();
    this.box.dataset.state = "done";
    if (summary.declined) {
      this.box.classList.add("declined");
      this.show("declined", "Declined: the documents do not hold the answer.", declineLines(summary.decline_evidence));
    } else if (summary.unsupported) {
      this.box.classList.add("unsupported");
      this.show("unsupported", "Unsupported: some of this answer is not in the passages it cites.", []);
    }
  }

  show(kind, headline, lines) {
    this.verdict.className = `verdict ${kind}`;
    this.verdict.dataset.kind = kind;
    this.verdict.replaceChildren(el("strong", "", headline), ...lines.map((line) => el("p", "evidence", line)));
    this.verdict.hidden = false;
  }
}

function declineLines(evidence) {
  if (!evidence) return [];
  const lines = [`score ${(evidence.score ?? 0).toFixed(3)} over the threshold ${(evidence.threshold ?? 0).toFixed(3)}`];
  const signals = Object.entries(evidence.signals ?? {}).map(([name, value]) => `${name} ${value.toFixed(3)}`);
  if (signals.length) lines.push(signals.join(" · "));
  return lines;
}

export function showSource(parts, found) {
  const { title, whereLine, text, box } = parts;
  box.hidden = false;
  if (!found.found) {
    title.textContent = "Not found";
    whereLine.textContent = "This passage is not in the serving index, or this key may not read it.";
    text.replaceChildren();
    box.dataset.state = "missing";
    return;
  }
  title.textContent = found.title || found.doc_id;
  whereLine.textContent = `${where(found.location)} · index version ${found.index_version}`;
  const offset = found.text_start ?? 0;
  text.replaceChildren(marked(found.text, (found.quote_start ?? 0) - offset, (found.quote_end ?? 0) - offset));
  box.dataset.state = "shown";
  text.querySelector("mark")?.scrollIntoView({ block: "center" });
}
