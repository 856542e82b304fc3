// One question and its answer on the page. Events update the model at once; the DOM catches up
// once per animation frame (a fast stream costs one layout a frame, not one per token), adding
// only the text that arrived since. A trailing "[" or "[12" waits for the next frame: it may be
// the start of a citation marker, which becomes a link to its source card.

const MARKER = /\[(\d{1,3})\]/g;
const PARTIAL_MARKER = /\[\d{0,3}$/;

let turns = 0;

export class Turn {
  /**
   * container: where the turn goes; onSource(citation): a source card was opened;
   * onFlush(turn): the DOM now shows everything up to turn.lastId (save it, say).
   */
  constructor(container, question, { onSource = () => {}, onFlush = () => {} } = {}) {
    this.key = `t${++turns}`;
    this.onSource = onSource;
    this.onFlush = onFlush;
    this.question = question;
    this.citations = [];
    this.text = "";
    this.lastId = -1;
    this.finish = null; // the done event, or {error}
    this.shownText = 0; // characters of this.text in the DOM
    this.shownCitations = 0;
    this.scheduled = false;
    this.build(container);
  }

  build(container) {
    const el = (tag, cls, text) => {
      const node = document.createElement(tag);
      if (cls) node.className = cls;
      if (text !== undefined) node.textContent = text;
      return node;
    };
    this.root = el("article", "turn");
    this.root.setAttribute("aria-label", "Question and answer");
    this.root.append(el("p", "question", this.question));
    this.sources = el("ol", "sources");
    this.sources.setAttribute("aria-label", "Sources");
    this.answer = el("div", "answer");
    this.answer.setAttribute("aria-busy", "true");
    this.answer.dataset.reconnects = "0";
    this.textNode = el("span", "pending");
    this.answer.append(this.textNode);
    this.finishLine = el("p", "finish");
    this.stats = el("p", "stats");
    this.root.append(this.sources, this.answer, this.finishLine, this.stats);
    container.append(this.root);
  }

  /** Apply one stream event (its JSON body, with `id` and `type`). */
  apply(event) {
    if (event.type === "citation") this.citations.push(event);
    else if (event.type === "token") this.text += event.text;
    else if (event.type === "done") this.finish = event;
    else if (event.type === "error") this.finish = { error: event };
    if (typeof event.id === "number") this.lastId = event.id;
    this.schedule();
  }

  /** Restore what an earlier page showed (from sessionStorage), then go on from lastId. */
  restore({ citations, text, lastId }) {
    this.citations = citations;
    this.text = text;
    this.lastId = lastId;
    this.schedule();
  }

  setReconnects(n) {
    this.answer.dataset.reconnects = String(n);
  }

  /** A finish that did not come from the stream (a refused request, a lost stream). */
  fail(message) {
    this.finish = { error: { code: "client", message } };
    this.schedule();
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    // a hidden tab gets no animation frames: the timer keeps its state current meanwhile
    const timer = setTimeout(() => this.flush(), 250);
    requestAnimationFrame(() => {
      clearTimeout(timer);
      this.flush();
    });
  }

  flush() {
    if (!this.scheduled) return;
    this.scheduled = false;
    // follow the answer as it grows, unless the reader scrolled up to read something else
    const box = this.root.parentElement;
    const follow = box && box.scrollHeight - box.scrollTop - box.clientHeight < 48;
    for (; this.shownCitations < this.citations.length; this.shownCitations++) {
      this.sources.append(this.card(this.citations[this.shownCitations]));
    }
    let end = this.text.length;
    if (!this.finish) {
      const partial = PARTIAL_MARKER.exec(this.text);
      if (partial) end = partial.index;
    }
    if (end > this.shownText) {
      this.answer.insertBefore(this.fragment(this.text.slice(this.shownText, end)), this.textNode);
      this.shownText = end;
    }
    this.textNode.textContent = this.text.slice(this.shownText);
    if (this.finish) this.finished();
    if (follow) box.scrollTop = box.scrollHeight;
    this.onFlush(this);
  }

  fragment(text) {
    const frag = document.createDocumentFragment();
    let at = 0;
    for (const match of text.matchAll(MARKER)) {
      const n = Number(match[1]);
      if (!this.citations.some((c) => c.n === n)) continue;
      frag.append(text.slice(at, match.index));
      const link = document.createElement("a");
      link.className = "marker";
      link.href = `#${this.key}-src-${n}`;
      link.textContent = match[0];
      link.setAttribute("aria-label", `source ${n}`);
      link.addEventListener("click", (e) => {
        e.preventDefault();
        const card = document.getElementById(`${this.key}-src-${n}`);
        card.scrollIntoView({ block: "nearest" });
        card.querySelector("button").focus();
        card.classList.add("flash");
        setTimeout(() => card.classList.remove("flash"), 1200);
      });
      frag.append(link);
      at = match.index + match[0].length;
    }
    frag.append(text.slice(at));
    return frag;
  }

  card(citation) {
    const li = document.createElement("li");
    li.id = `${this.key}-src-${citation.n}`;
    li.className = "card";
    const button = document.createElement("button");
    button.type = "button";
    const n = document.createElement("span");
    n.className = "n";
    n.textContent = `[${citation.n}]`;
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = citation.title;
    button.append(n, title);
    if (citation.heading) {
      const heading = document.createElement("span");
      heading.className = "heading";
      heading.textContent = citation.heading;
      button.append(heading);
    }
    const snippet = document.createElement("span");
    snippet.className = "snippet";
    snippet.textContent = citation.snippet;
    button.append(snippet);
    button.setAttribute("aria-label", `Source ${citation.n}: ${citation.title}. Show the passage`);
    button.addEventListener("click", () => this.onSource(citation));
    li.append(button);
    return li;
  }

  finished() {
    this.answer.setAttribute("aria-busy", "false");
    this.root.classList.add("ended");
    const f = this.finish;
    if (f.error) {
      this.finishLine.textContent = `Error: ${f.error.message}`;
      this.finishLine.className = "finish error";
      return;
    }
    const reasons = {
      cancelled: "Stopped (cancelled).",
      length: "Cut at the token limit.",
      error: "The answer failed.",
    };
    this.finishLine.textContent = reasons[f.finish_reason] || "";
    this.finishLine.dataset.reason = f.finish_reason;
    this.finishLine.className = "finish " + f.finish_reason;
    this.stats.textContent = statsLine(f);
  }
}

/** "TTFT 412 ms · 28.3 tokens/s · 128 cached tokens" from a done event (or a saved answer). */
function statsLine(done) {
  const parts = [];
  const t = done.timings || {};
  const u = done.usage || {};
  if (typeof t.ttft_ms === "number") parts.push(`TTFT ${Math.round(t.ttft_ms)} ms`);
  if (u.completion_tokens > 1 && t.decode_ms > 0) {
    parts.push(`${((u.completion_tokens - 1) / (t.decode_ms / 1000)).toFixed(1)} tokens/s`);
  }
  if (typeof u.cached_tokens === "number") parts.push(`${u.cached_tokens} cached tokens`);
  return parts.join(" · ");
}
