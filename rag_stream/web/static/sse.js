// Server-Sent Events from raw body bytes (the WHATWG event-stream rules): one decoder per
// response. Bytes go through a TextDecoder in stream mode, so a character split between two
// chunks waits for its second half instead of turning into U+FFFD; lines end in LF, CRLF or CR
// (a CR at the end of a chunk waits: the LF of a CRLF may come next); several data: lines join
// with "\n"; comment lines (": keep-alive") are skipped.

export class SseDecoder {
  constructor() {
    this.text = new TextDecoder("utf-8");
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.data = [];
    this.event = "";
    this.id = null;
  }

  /** Feed a chunk of bytes; returns the events it completed: {id, event, data}. */
  push(bytes) {
    return this.pushText(this.text.decode(bytes, { stream: true }));
  }

  /** The body ended: flush what the TextDecoder held (a cut character becomes U+FFFD here). */
  end() {
    return this.pushText(this.text.decode(), true);
  }

  pushText(chunk, final = false) {
    this.buffer += chunk;
    const events = [];
    let start = 0;
    for (;;) {
      const cr = this.buffer.indexOf("\r", start);
      const lf = this.buffer.indexOf("\n", start);
      let end = -1;
      let next = -1;
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        if (cr === this.buffer.length - 1 && !final) break; // maybe the CR of a CRLF
        end = cr;
        next = this.buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
      } else if (lf >= 0) {
        end = lf;
        next = lf + 1;
      } else {
        break;
      }
      const event = this.line(this.buffer.slice(start, end));
      if (event) events.push(event);
      start = next;
    }
    this.buffer = this.buffer.slice(start);
    return events;
  }

  line(line) {
    if (line === "") {
      if (this.data.length === 0) {
        this.reset();
        return null;
      }
      const event = { id: this.id, event: this.event || "message", data: this.data.join("\n") };
      this.reset();
      return event;
    }
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    return null;
  }
}
