// One stream, followed to its terminal event whatever the network does. The first response
// (POST /v1/answers) is only one reader of the server's event log: when it breaks (an error, or
// the body ending before `done`/`error`), the follower waits, says "reconnecting", and reads
// GET /v1/streams/{id}/events with Last-Event-ID = the last event it handed on, so the caller
// sees every event once, in order. Events with an id at or below that are skipped.

import { ApiError, authHeaders, errorFrom } from "./api.js";
import { SseDecoder } from "./sse.js";

const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];
const MAX_ATTEMPTS = 15; // about a minute and a half of trying

class Dropped extends Error {}

export class StreamFollower {
  /**
   * onEvent(data): each event's JSON body (with its id and type), once, in order.
   * onState(state): "streaming" | "reconnecting" (with the attempt number) | "ended".
   */
  constructor({ onEvent, onState = () => {}, onStreamId = () => {} }) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.onStreamId = onStreamId;
    this.streamId = null;
    this.lastId = -1;
    this.ended = false;
    this.reconnects = 0;
    this.controller = new AbortController();
  }

  /** Start an answer; resolves when the stream has ended (throws ApiError if refused). */
  async answer(body) {
    let response;
    try {
      response = await fetch("/v1/answers", {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify(body),
        signal: this.controller.signal,
      });
    } catch (err) {
      if (err.name === "AbortError") return;
      throw new ApiError(0, "network_error", "the server cannot be reached");
    }
    if (!response.ok) throw errorFrom(response.status, await response.text());
    this.setStreamId(response.headers.get("X-Stream-Id"));
    this.onState("streaming");
    try {
      await this.read(response);
    } catch (err) {
      if (!(err instanceof Dropped) || this.streamId === null) throw err;
    }
    if (!this.ended) await this.resume();
  }

  /** Follow a stream already started (after a reload), from the event after lastId. */
  async follow(streamId, lastId) {
    this.setStreamId(streamId);
    this.lastId = lastId;
    await this.resume(true);
  }

  /** Stop reading (the page is leaving, or the view is cleared); the stream goes on. */
  close() {
    this.controller.abort();
  }

  setStreamId(id) {
    if (id && id !== this.streamId) {
      this.streamId = id;
      this.onStreamId(id);
    }
  }

  async resume(first = false) {
    for (let attempt = 1; !this.ended; attempt++) {
      if (this.controller.signal.aborted) return;
      if (attempt > MAX_ATTEMPTS) {
        throw new ApiError(0, "network_error", "the connection could not be restored");
      }
      if (!first || attempt > 1) {
        this.onState("reconnecting", attempt);
        await sleep(BACKOFF_MS[Math.min(attempt - 1, BACKOFF_MS.length - 1)]);
        if (this.controller.signal.aborted) return;
      }
      const headers = authHeaders({ Accept: "text/event-stream" });
      if (this.lastId >= 0) headers["Last-Event-ID"] = String(this.lastId);
      let response;
      try {
        response = await fetch(`/v1/streams/${encodeURIComponent(this.streamId)}/events`, {
          headers,
          cache: "no-store",
          signal: this.controller.signal,
        });
      } catch (err) {
        if (err.name === "AbortError") return;
        continue; // network: try again
      }
      if (!response.ok) {
        const error = errorFrom(response.status, await response.text());
        if (response.status >= 500 || response.status === 429) continue;
        throw error; // 404 (expired or unknown), 401, 422: retrying will not help
      }
      if (!first || attempt > 1) this.reconnects++;
      this.onState("streaming");
      try {
        await this.read(response);
      } catch (err) {
        if (!(err instanceof Dropped)) throw err;
      }
    }
  }

  async read(response) {
    const reader = response.body.getReader();
    const decoder = new SseDecoder();
    try {
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (err) {
          if (err.name === "AbortError" || this.controller.signal.aborted) return;
          throw new Dropped("connection lost");
        }
        const events = chunk.done ? decoder.end() : decoder.push(chunk.value);
        for (const event of events) {
          this.handle(event);
          if (this.ended) return;
        }
        if (chunk.done) throw new Dropped("the stream ended early");
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  handle(event) {
    let data;
    try {
      data = JSON.parse(event.data);
    } catch {
      return; // not one of ours
    }
    if (event.id === null || event.id === "") {
      // a reader's own error (Redis lost), sent without an id: the log is intact, so read on
      if (event.event === "error") throw new Dropped(data.message || "reader error");
      return;
    }
    const id = Number(event.id);
    if (!Number.isInteger(id) || id <= this.lastId) return; // seen already
    this.lastId = id;
    if (event.event === "stream") this.setStreamId(data.stream_id);
    if (event.event === "done" || event.event === "error") this.ended = true;
    this.onEvent({ ...data, id, type: event.event });
    if (this.ended) this.onState("ended");
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms * (0.8 + Math.random() * 0.4)));
}
