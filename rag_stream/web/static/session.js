// The answer being streamed, kept in sessionStorage as the page shows it (its stream id, the
// last event id rendered and what was rendered), so that a reload can offer to carry on from
// exactly there. Cleared once the answer has ended.

const ITEM = "rag-stream.live";

export function saveLive(state) {
  try {
    sessionStorage.setItem(ITEM, JSON.stringify(state));
  } catch {
    // storage full or disabled: a reload just cannot resume
  }
}

export function loadLive() {
  try {
    const state = JSON.parse(sessionStorage.getItem(ITEM) || "null");
    if (state && typeof state.streamId === "string" && Number.isInteger(state.lastId)) {
      return state;
    }
  } catch {
    // unreadable: forget it
  }
  clearLive();
  return null;
}

export function clearLive() {
  sessionStorage.removeItem(ITEM);
}
