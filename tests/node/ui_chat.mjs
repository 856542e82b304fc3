#!/usr/bin/env node
// Drives rag-stream's AI SDK endpoint (POST /v1/ui/chat, GET /v1/ui/chat/{chatId}/stream) with
// the real `ai` package: its DefaultChatTransport makes the requests and parses the UI message
// stream, readUIMessageStream builds the UIMessage an app would show. Each run prints one JSON
// line for tests/e2e/test_ai_sdk.py to assert on.
//
//   node tests/node/ui_chat.mjs SCENARIO --base URL --model MODEL --question TEXT
//        [--max-tokens N] [--cut-after N] [--key KEY]
//
// Scenarios:
//   sources-first  ask once and read to the end: every chunk in order, the final message.
//   resume         ask, read --cut-after text deltas, abort the request (the stream must still
//                  be running), then reconnect twice at once: reconnectToStream({chatId}) read
//                  with readUIMessageStream, and a Chat made afresh with the user's message
//                  calling resumeStream() (what useChat({resume: true}) does after a reload);
//                  both read to the end. Then reconnect once more (nothing running: null).
//   stop           ask, read --cut-after text deltas, POST /v1/streams/{id}/cancel with the
//                  stream id from the start chunk's metadata, read to the end.
//
// --base and --key default to $RAG_STREAM_URL and $RAG_STREAM_KEY. Exit status 0 with the
// result line; 2 for bad arguments; 1 with {"scenario", "failure"} when the run itself failed.

import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

import { AbstractChat, DefaultChatTransport, readUIMessageStream } from 'ai';

const SCENARIOS = { 'sources-first': sourcesFirst, resume, stop };

function usage(message) {
  process.stderr.write(`${message}\nscenarios: ${Object.keys(SCENARIOS).join(', ')}\n`);
  process.exit(2);
}

function options() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      base: { type: 'string', default: process.env.RAG_STREAM_URL },
      key: { type: 'string', default: process.env.RAG_STREAM_KEY },
      model: { type: 'string' },
      question: { type: 'string' },
      'max-tokens': { type: 'string', default: '60' },
      'cut-after': { type: 'string', default: '3' },
    },
  });
  const scenario = positionals[0];
  if (!(scenario in SCENARIOS)) usage(`unknown scenario ${JSON.stringify(scenario)}`);
  for (const name of ['base', 'model', 'question']) {
    if (!values[name]) usage(`--${name} is required`);
  }
  return {
    scenario,
    base: values.base.replace(/\/+$/, ''),
    key: values.key,
    model: values.model,
    question: values.question,
    maxTokens: Number(values['max-tokens']),
    cutAfter: Number(values['cut-after']),
  };
}

/** A client of one server: the transport an app would build, and the raw calls it needs. */
class Client {
  constructor(opts) {
    this.opts = opts;
    this.headers = opts.key ? { Authorization: `Bearer ${opts.key}` } : {};
    this.responses = []; // what each transport request answered: status and the headers we check
    this.transport = new DefaultChatTransport({
      api: `${opts.base}/v1/ui/chat`,
      headers: this.headers,
      // extras beside DefaultChatTransport's own id, messages, trigger and messageId
      body: { model: opts.model, max_tokens: opts.maxTokens, temperature: 0 },
      // only to see what went over the wire; the transport does everything else itself
      fetch: (url, init) => this.observed(url, init),
    });
    this.bodies = []; // the copies of the bodies being read (see ``observed``)
  }

  /** fetch, noting each response's status and headers, and the last ``data:`` line of its
   * body (read from a copy: the transport reads the body as usual). */
  async observed(url, init) {
    const response = await fetch(url, init);
    const seen = {
      method: init?.method ?? 'GET',
      url: String(url),
      status: response.status,
      contentType: response.headers.get('content-type'),
      uiMessageStream: response.headers.get('x-vercel-ai-ui-message-stream'),
      streamId: response.headers.get('x-stream-id'),
      lastData: null,
    };
    this.responses.push(seen);
    if (response.body === null) return response;
    const [forTransport, copy] = response.body.tee();
    this.bodies.push(lastDataLine(copy).then((line) => (seen.lastData = line)));
    const { status, statusText, headers } = response;
    return new Response(forTransport, { status, statusText, headers });
  }

  /** Waits for the copies of the bodies to end (or fail, as an aborted one does). */
  async settled() {
    await Promise.allSettled(this.bodies);
  }

  question() {
    return { id: randomUUID(), role: 'user', parts: [{ type: 'text', text: this.opts.question }] };
  }

  send(chatId, abortSignal, message = this.question()) {
    return this.transport.sendMessages({
      chatId,
      messages: [message],
      trigger: 'submit-message',
      messageId: undefined,
      abortSignal,
    });
  }

  async json(method, path) {
    const response = await fetch(`${this.opts.base}${path}`, { method, headers: this.headers });
    return { status: response.status, body: await response.json().catch(() => null) };
  }
}

/** The state a framework binding keeps for a Chat (@ai-sdk/react's, without React). */
class PlainChatState {
  constructor(messages) {
    this.status = 'ready';
    this.error = undefined;
    this.messages = messages;
  }

  pushMessage(message) {
    this.messages = [...this.messages, message];
  }

  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }

  replaceMessage(index, message) {
    this.messages = this.messages.with(index, this.snapshot(message));
  }

  snapshot(thing) {
    return structuredClone(thing);
  }
}

class PlainChat extends AbstractChat {
  constructor({ messages = [], ...init }) {
    super({ ...init, state: new PlainChatState(messages) });
  }
}

/** The payload of a body's last ``data:`` line (``[DONE]`` at the end of a whole stream). */
async function lastDataLine(body) {
  let last = null;
  let pending = '';
  try {
    for await (const text of body.pipeThrough(new TextDecoderStream())) {
      const lines = (pending + text).split('\n');
      pending = lines.pop();
      for (const line of lines) if (line.startsWith('data:')) last = line.slice(5).trim();
    }
  } catch {
    // an aborted request: what arrived before counts
  }
  return last;
}

/**
 * Reads a UI message chunk stream to its end as an app does (readUIMessageStream), keeping
 * every chunk in order. ``onChunk(chunk, chunks)`` runs as each chunk arrives, before the next
 * is read. A stream that fails (an abort, a chunk the package refuses) ends the read; its
 * error is in ``errors``, as are the ``error`` chunks the package reported.
 */
async function read(stream, onChunk = async () => {}) {
  const chunks = [];
  const errors = [];
  const recorded = stream.pipeThrough(
    new TransformStream({
      async transform(chunk, controller) {
        chunks.push(chunk);
        await onChunk(chunk, chunks);
        controller.enqueue(chunk);
      },
    }),
  );
  let message = null;
  const onError = (error) => errors.push(String(error?.message ?? error).slice(0, 2000));
  for await (const snapshot of readUIMessageStream({ stream: recorded, onError })) {
    message = snapshot;
  }
  return { chunks, errors, message };
}

const textOf = (message) =>
  (message?.parts ?? [])
    .filter((part) => part.type === 'text')
    .map((part) => part.text)
    .join('');

const deltas = (chunks) => chunks.filter((chunk) => chunk.type === 'text-delta').length;

function summary({ chunks, errors, message }) {
  const types = chunks.map((chunk) => chunk.type);
  const start = chunks.find((chunk) => chunk.type === 'start');
  const finish = chunks.find((chunk) => chunk.type === 'finish');
  const firstSource = types.findIndex((type) => type.startsWith('source-'));
  const lastSource = types.findLastIndex((type) => type.startsWith('source-'));
  return {
    types,
    chunks,
    errors,
    message,
    text: textOf(message),
    streamId: start?.messageMetadata?.streamId ?? null,
    firstSourceIndex: firstSource,
    lastSourceIndex: lastSource,
    firstTextDeltaIndex: types.indexOf('text-delta'),
    finishReason: finish?.finishReason ?? null,
    finishMetadata: finish?.messageMetadata ?? null,
  };
}

async function sourcesFirst(client) {
  const chatId = randomUUID();
  const result = summary(await read(await client.send(chatId)));
  return { chatId, ...result };
}

async function resume(client) {
  const chatId = randomUUID();
  const question = client.question();
  const abort = new AbortController();
  let cut = null;
  const stream = await client.send(chatId, abort.signal, question);
  const first = await read(stream, async (chunk, chunks) => {
    if (cut !== null || chunk.type !== 'text-delta' || deltas(chunks) < client.opts.cutAfter) {
      return;
    }
    const streamId = chunks.find((c) => c.type === 'start')?.messageMetadata?.streamId;
    // the proof that the cut falls mid-answer: the server still generating, no finish seen
    const status = streamId ? await client.json('GET', `/v1/streams/${streamId}`) : null;
    cut = {
      deltas: deltas(chunks),
      text: chunks
        .filter((c) => c.type === 'text-delta')
        .map((c) => c.delta)
        .join(''),
      sawFinish: chunks.some((c) => c.type === 'finish'),
      streamStatus: status?.body?.status ?? null,
    };
    abort.abort();
  });

  // a page loaded afresh: the chat's saved messages (the question), then resumeStream()
  let finished = null;
  const chat = new PlainChat({
    id: chatId,
    transport: client.transport,
    messages: [question],
    onFinish: ({ isAbort, isDisconnect, isError, finishReason }) => {
      finished = { isAbort, isDisconnect, isError, finishReason };
    },
  });
  const replayed = async () => {
    const replay = await client.transport.reconnectToStream({ chatId });
    return replay === null ? null : summary(await read(replay));
  };
  const [resumed] = await Promise.all([replayed(), chat.resumeStream()]);

  // the answer has ended: nothing to reconnect to now (the server answers 204)
  const afterEnd = await client.transport.reconnectToStream({ chatId });
  if (afterEnd !== null) await afterEnd.cancel();
  return {
    chatId,
    cut,
    first: summary(first),
    resumed,
    chat: {
      status: chat.status,
      error: chat.error === undefined ? null : String(chat.error),
      finished,
      messages: chat.messages,
      text: textOf(chat.messages.at(-1)),
    },
    reconnectAfterEnd: afterEnd === null ? 'null' : 'stream',
  };
}

async function stop(client) {
  const chatId = randomUUID();
  let cancel = null;
  const run = await read(await client.send(chatId), async (chunk, chunks) => {
    if (cancel !== null || chunk.type !== 'text-delta' || deltas(chunks) < client.opts.cutAfter) {
      return;
    }
    const streamId = chunks.find((c) => c.type === 'start')?.messageMetadata?.streamId;
    // not awaited: the cancel route answers once the stream has ended, and reading goes on
    cancel = {
      atChunk: chunks.length,
      deltas: deltas(chunks),
      response: client.json('POST', `/v1/streams/${streamId}/cancel`),
    };
  });
  const result = summary(run);
  if (cancel !== null) cancel.response = await cancel.response;
  return {
    chatId,
    cancel,
    deltasAfterCancel: cancel === null ? null : deltas(run.chunks.slice(cancel.atChunk)),
    ...result,
  };
}

async function main() {
  const opts = options();
  const client = new Client(opts);
  try {
    const result = await SCENARIOS[opts.scenario](client);
    await client.settled();
    process.stdout.write(
      `${JSON.stringify({ scenario: opts.scenario, responses: client.responses, ...result })}\n`,
    );
  } catch (error) {
    const cause = error?.cause ? `\ncaused by: ${error.cause?.stack ?? error.cause}` : '';
    const failure = `${error?.stack ?? error}${cause}`;
    process.stdout.write(
      `${JSON.stringify({ scenario: opts.scenario, responses: client.responses, failure })}\n`,
    );
    process.exitCode = 1;
  }
}

await main();
