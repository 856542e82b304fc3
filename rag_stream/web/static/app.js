// The chat page: wires the controls to the API (api.js), the stream follower (stream.js) and
// the answer views (render.js). One answer streams at a time.

import { ApiError, apiKey, request, setApiKey, upload } from "./api.js";
import { Turn } from "./render.js";
import { clearLive, loadLive, saveLive } from "./session.js";
import { StreamFollower } from "./stream.js";

const $ = (id) => document.getElementById(id);
const ui = {
  key: $("api-key"),
  keyForm: $("key-form"),
  alert: $("alert"),
  kb: $("kb"),
  docs: $("docs"),
  docCount: $("doc-count"),
  uploadForm: $("upload-form"),
  file: $("file"),
  progress: $("upload-progress"),
  uploadStatus: $("upload-status"),
  convs: $("conversations"),
  moreConvs: $("more-conversations"),
  newConv: $("new-conversation"),
  thread: $("thread"),
  askForm: $("ask-form"),
  question: $("question"),
  ask: $("ask"),
  stop: $("stop"),
  status: $("status"),
  maxTokens: $("max-tokens"),
  topK: $("top-k"),
  announcer: $("announcer"),
  resumeBanner: $("resume-banner"),
  resumeText: $("resume-text"),
  resume: $("resume"),
  discard: $("discard"),
  passage: $("passage"),
  passageTitle: $("passage-title"),
  passageMeta: $("passage-meta"),
  passageText: $("passage-text"),
  passageClose: $("passage-close"),
};

const state = {
  kbs: [],
  kb: null, // name
  conversationId: null,
  live: null, // {follower, turn, kb}
  conversationsBefore: null,
};

// --- messages ---------------------------------------------------------------------------------

function announce(text) {
  // polite, and only on changes of state: never once per token
  ui.announcer.textContent = text;
}

function setStatus(text) {
  ui.status.textContent = text;
}

function showAlert(text) {
  ui.alert.textContent = text;
  ui.alert.hidden = !text;
}

function explain(err) {
  if (err instanceof ApiError && (err.status === 401 || err.code === "invalid_api_key")) {
    ui.key.focus();
    return "This server needs an API key: enter yours in the “API key” field and save it.";
  }
  return err instanceof ApiError ? err.message : String(err.message || err);
}

function report(err) {
  if (err && err.name === "AbortError") return;
  showAlert(explain(err));
}

// --- API key ----------------------------------------------------------------------------------

ui.key.value = apiKey();
ui.keyForm.addEventListener("submit", (e) => {
  e.preventDefault();
  setApiKey(ui.key.value.trim());
  showAlert("");
  announce(ui.key.value.trim() ? "API key saved." : "API key removed.");
  loadKbs();
  loadConversations();
});

// --- knowledge bases and documents ------------------------------------------------------------

async function loadKbs() {
  try {
    const { data } = await request("/v1/kbs");
    state.kbs = data;
    const wanted = state.kb || localStorage.getItem("rag-stream.kb");
    ui.kb.replaceChildren(
      ...data.map((kb) => {
        const option = document.createElement("option");
        option.value = kb.name;
        option.textContent = `${kb.name} (${kb.document_count})`;
        return option;
      }),
    );
    if (data.length === 0) {
      state.kb = null;
      ui.docs.replaceChildren();
      ui.docCount.textContent = "No knowledge base yet: create one with the API.";
      return;
    }
    state.kb = data.some((kb) => kb.name === wanted) ? wanted : data[0].name;
    ui.kb.value = state.kb;
    await loadDocs();
  } catch (err) {
    report(err);
  }
}

async function loadDocs() {
  if (!state.kb) return;
  try {
    const page = await request(`/v1/kbs/${encodeURIComponent(state.kb)}/documents?limit=200`);
    ui.docCount.textContent = `${page.total} document${page.total === 1 ? "" : "s"}`;
    ui.docs.replaceChildren(
      ...page.data.map((doc) => {
        const li = document.createElement("li");
        li.textContent = doc.title;
        li.title = `${doc.source || doc.title} · ${doc.chunk_count} chunks`;
        return li;
      }),
    );
  } catch (err) {
    report(err);
  }
}

ui.kb.addEventListener("change", () => {
  state.kb = ui.kb.value;
  localStorage.setItem("rag-stream.kb", state.kb);
  newConversation();
  loadDocs();
});

ui.uploadForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  const file = ui.file.files[0];
  if (!file || !state.kb) {
    ui.uploadStatus.textContent = "Choose a file first.";
    return;
  }
  ui.uploadStatus.className = "";
  ui.uploadStatus.textContent = `Uploading ${file.name}…`;
  ui.progress.hidden = false;
  ui.progress.value = 0;
  try {
    const doc = await upload(state.kb, file, (fraction) => {
      ui.progress.value = Math.round(fraction * 100);
      if (fraction >= 1) ui.uploadStatus.textContent = `Reading ${file.name}…`;
    });
    ui.uploadStatus.textContent = doc.created
      ? `Added “${doc.title}” (${doc.chunk_count} chunks).`
      : `“${doc.title}” was already there.`;
    ui.file.value = "";
    await loadKbs(); // its document count, and the documents
  } catch (err) {
    ui.uploadStatus.className = "error";
    ui.uploadStatus.textContent = `Upload failed: ${explain(err)}`;
  } finally {
    ui.progress.hidden = true;
  }
});

// --- conversations ----------------------------------------------------------------------------

async function loadConversations(more = false) {
  try {
    const before = more && state.conversationsBefore;
    const query = `limit=20${before ? `&before=${encodeURIComponent(before)}` : ""}`;
    const page = await request(`/v1/conversations?${query}`);
    const items = page.data.map((conv) => {
      const li = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "conversation";
      const title = document.createElement("span");
      title.className = "title";
      title.textContent = conv.title || "(no question)";
      const meta = document.createElement("span");
      meta.className = "meta";
      const when = new Date(conv.updated_at).toLocaleString();
      meta.textContent = `${conv.kb || "deleted KB"} · ${conv.turns} question${conv.turns === 1 ? "" : "s"} · ${when}`;
      button.append(title, meta);
      button.addEventListener("click", () => openConversation(conv.id));
      li.append(button);
      return li;
    });
    if (more) ui.convs.append(...items);
    else ui.convs.replaceChildren(...items);
    state.conversationsBefore = page.next_before;
    ui.moreConvs.hidden = !page.next_before;
  } catch (err) {
    report(err);
  }
}

ui.moreConvs.addEventListener("click", () => loadConversations(true));

function newConversation() {
  if (state.live) return;
  state.conversationId = null;
  ui.thread.replaceChildren();
  ui.question.focus();
}

ui.newConv.addEventListener("click", newConversation);

async function openConversation(id) {
  if (state.live) return;
  try {
    const conv = await request(`/v1/conversations/${encodeURIComponent(id)}`);
    const kb = state.kbs.find((k) => k.id === conv.kb_id);
    if (kb && kb.name !== state.kb) {
      state.kb = kb.name;
      ui.kb.value = kb.name;
      loadDocs();
    }
    ui.thread.replaceChildren();
    state.conversationId = conv.id;
    let question = "";
    for (const message of conv.messages) {
      if (message.role === "user") {
        question = message.content;
        continue;
      }
      const turn = newTurn(question, kb ? kb.name : state.kb);
      turn.restore({
        citations: (message.citations.sources || []).map((c) => ({ ...c, type: "citation" })),
        text: message.content,
        lastId: -1,
      });
      turn.finish = { finish_reason: message.finish_reason, usage: message.usage };
      turn.flush(); // saved answers keep usage, not timings: the stats line shows less
    }
    announce(`Opened the conversation “${conv.messages[0]?.content ?? ""}”.`);
    ui.question.focus();
  } catch (err) {
    report(err);
  }
}

// --- sources ----------------------------------------------------------------------------------

async function showPassage(kb, citation) {
  ui.passageTitle.textContent = `[${citation.n}] ${citation.title}`;
  ui.passageMeta.textContent = citation.heading || "";
  ui.passageText.textContent = "Loading…";
  ui.passage.showModal();
  try {
    const chunk = await request(
      `/v1/kbs/${encodeURIComponent(kb)}/chunks/${encodeURIComponent(citation.chunk_id)}`,
    );
    const where = [chunk.document.source, chunk.heading].filter(Boolean).join(" · ");
    ui.passageMeta.textContent = `${where} (characters ${chunk.start}–${chunk.end})`;
    ui.passageText.textContent = chunk.text;
  } catch (err) {
    ui.passageText.textContent =
      err instanceof ApiError && err.status === 404
        ? "This passage is no longer in the knowledge base (its document was replaced or deleted)."
        : explain(err);
  }
}

ui.passageClose.addEventListener("click", () => ui.passage.close());

// --- asking -----------------------------------------------------------------------------------

function newTurn(question, kb) {
  return new Turn(ui.thread, question, {
    onSource: (citation) => showPassage(kb, citation),
    onFlush: (turn) => remember(turn),
  });
}

function remember(turn) {
  const live = state.live;
  if (!live || live.turn !== turn || !live.follower.streamId) return;
  if (turn.finish) {
    clearLive();
    return;
  }
  saveLive({
    streamId: live.follower.streamId,
    lastId: turn.lastId,
    kb: live.kb,
    conversationId: state.conversationId,
    question: turn.question,
    citations: turn.citations,
    text: turn.text,
  });
}

function setBusy(busy) {
  ui.ask.disabled = busy;
  ui.stop.disabled = !busy;
  ui.newConv.disabled = busy;
}

async function run(turn, kb, start) {
  let sources = 0;
  let writing = false;
  const follower = new StreamFollower({
    onStreamId: (id) => {
      turn.root.dataset.streamId = id;
    },
    onEvent: (event) => {
      turn.apply(event);
      if (event.type === "stream" && event.conversation_id) {
        state.conversationId = event.conversation_id;
      } else if (event.type === "citation") {
        sources++;
      } else if (event.type === "token" && !writing) {
        writing = true;
        setStatus("writing…");
        announce(`${sources} source${sources === 1 ? "" : "s"} found. Writing the answer…`);
      }
    },
    onState: (s) => {
      turn.setReconnects(follower.reconnects);
      if (s === "reconnecting") {
        setStatus("reconnecting…");
        announce("Connection lost, reconnecting…");
      } else if (s === "streaming") {
        setStatus(writing ? "writing…" : "waiting for sources…");
        if (follower.reconnects > 0) announce("Reconnected.");
      }
    },
  });
  state.live = { follower, turn, kb };
  setBusy(true);
  setStatus("waiting for sources…");
  try {
    await start(follower);
    const f = turn.finish;
    if (f && f.finish_reason === "cancelled") announce("Stopped.");
    else if (f && f.error) announce(`The answer failed: ${f.error.message}`);
    else if (f) announce("Answer complete.");
  } catch (err) {
    turn.fail(explain(err));
    report(err);
    announce("The answer failed.");
  } finally {
    turn.setReconnects(follower.reconnects);
    turn.flush();
    if (turn.finish) clearLive(); // else the page is going away: a reload may resume it
    state.live = null;
    setBusy(false);
    setStatus("");
    loadConversations();
  }
}

function optionalInt(input) {
  const value = input.value.trim();
  return value === "" ? undefined : Number(value);
}

ui.askForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const question = ui.question.value.trim();
  if (!question || state.live) return;
  if (!state.kb) {
    showAlert("Choose a knowledge base first.");
    return;
  }
  showAlert("");
  ui.question.value = "";
  const body = { kb: state.kb, question, max_tokens: optionalInt(ui.maxTokens) };
  const topK = optionalInt(ui.topK);
  if (topK !== undefined) body.top_k = topK;
  if (state.conversationId) body.conversation_id = state.conversationId;
  const turn = newTurn(question, state.kb);
  turn.root.scrollIntoView({ block: "nearest" });
  run(turn, state.kb, (follower) => follower.answer(body));
});

ui.question.addEventListener("keydown", (e) => {
  // Enter asks, Shift+Enter is a new line; not while an input method is composing (Chinese)
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    ui.askForm.requestSubmit();
  }
});

ui.stop.addEventListener("click", async () => {
  const live = state.live;
  if (!live || !live.follower.streamId) return;
  ui.stop.disabled = true;
  setStatus("stopping…");
  try {
    await request(`/v1/streams/${encodeURIComponent(live.follower.streamId)}/cancel`, {
      method: "POST",
    });
  } catch (err) {
    report(err);
    ui.stop.disabled = false;
  }
});

// --- resuming after a reload ------------------------------------------------------------------

async function offerResume() {
  const saved = loadLive();
  if (!saved) return;
  let status;
  try {
    status = await request(`/v1/streams/${encodeURIComponent(saved.streamId)}`);
  } catch {
    clearLive(); // expired, or not this key's: nothing to resume
    return;
  }
  ui.resumeText.textContent =
    status.status === "running"
      ? `An answer to “${saved.question}” was still being written when the page was left.`
      : `An answer to “${saved.question}” ended while the page was away.`;
  ui.resume.textContent = status.status === "running" ? "Resume it" : "Show the rest";
  ui.resumeBanner.hidden = false;
  ui.resume.focus();
  ui.resume.onclick = () => {
    ui.resumeBanner.hidden = true;
    if (saved.kb && state.kbs.some((k) => k.name === saved.kb)) {
      state.kb = saved.kb;
      ui.kb.value = saved.kb;
    }
    state.conversationId = saved.conversationId || null;
    const turn = newTurn(saved.question, saved.kb);
    turn.restore(saved);
    run(turn, saved.kb, (follower) => follower.follow(saved.streamId, saved.lastId));
  };
  ui.discard.onclick = () => {
    ui.resumeBanner.hidden = true;
    clearLive();
  };
}

window.addEventListener("pagehide", () => {
  if (state.live) state.live.follower.close(); // the stream goes on; a reload may resume it
});

await loadKbs();
loadConversations();
offerResume();
