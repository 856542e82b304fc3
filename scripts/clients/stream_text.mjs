#!/usr/bin/env node
// AI SDK Core's streamText against rag-stream's chat completions, as a server route of an app
// would call it; run by scripts/check_clients.py, which reads what it prints.
//
//   node stream_text.mjs SCENARIO --url URL --model MODEL --question TEXT
//        [--provider openai|perplexity] [--max-tokens N] [--stop-after N] [--linger S]
//        [--key KEY]
//
// SCENARIO: answer (read to the end), stop (abort through abortSignal after --stop-after text
// deltas, read what is left, then stay alive --linger seconds so that a connection the SDK
// left open would stay open while the checker watches the server), drop (read to the end; the
// checker cuts the connection).
// --provider: openai (createOpenAI(...).chat(model), the usual way) or perplexity
// (createPerplexity, whose provider turns a first chunk's `citations` into sources).
//
// Prints one JSON object a line, each {t: epoch seconds, what, ...}: sent, stream_id, sources
// (a `source` part), raw_sources (a raw chunk carrying search_results, seen only with
// includeRawChunks), linked, text, stopping, error, end, exiting. Exit status 0 whatever the
// client did (the notes say it); 2 for bad arguments.

import { parseArgs } from 'node:util';

import { createOpenAI } from '@ai-sdk/openai';
import { createPerplexity } from '@ai-sdk/perplexity';
import { streamText } from 'ai';

function note(what, fields = {}) {
  process.stdout.write(`${JSON.stringify({ t: Date.now() / 1000, what, ...fields })}\n`);
}

function options() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      url: { type: 'string' },
      key: { type: 'string', default: 'none' },
      model: { type: 'string' },
      question: { type: 'string' },
      provider: { type: 'string', default: 'openai' },
      'max-tokens': { type: 'string', default: '120' },
      'stop-after': { type: 'string', default: '5' },
      linger: { type: 'string', default: '0' },
    },
  });
  const scenario = positionals[0];
  const fail = (message) => {
    process.stderr.write(`${message}\n`);
    process.exit(2);
  };
  if (!['answer', 'stop', 'drop'].includes(scenario)) fail(`unknown scenario ${scenario}`);
  if (!['openai', 'perplexity'].includes(values.provider)) fail(`unknown provider`);
  for (const name of ['url', 'model', 'question']) {
    if (!values[name]) fail(`--${name} is required`);
  }
  return {
    scenario,
    base: values.url.replace(/\/+$/, ''),
    key: values.key,
    model: values.model,
    question: values.question,
    provider: values.provider,
    maxTokens: Number(values['max-tokens']),
    stopAfter: Number(values['stop-after']),
    lingerMs: Number(values.linger) * 1000,
  };
}

// The SDK keeps the response headers to itself until the step ends; an app that wants the
// stream id while the answer streams passes its own fetch, as this one does.
async function fetchNotingStreamId(url, init) {
  const response = await fetch(url, init);
  const id = response.headers.get('x-stream-id');
  if (id) note('stream_id', { id, via: 'X-Stream-Id, read by a fetch passed to the provider' });
  return response;
}

function languageModel(opts) {
  const settings = { baseURL: `${opts.base}/v1`, apiKey: opts.key, fetch: fetchNotingStreamId };
  if (opts.provider === 'perplexity') return createPerplexity(settings)(opts.model);
  return createOpenAI(settings).chat(opts.model);
}

async function main() {
  const opts = options();
  const abort = new AbortController();
  let text = '';
  let deltas = 0;
  let finish = null;
  let rawSourcesSeen = false;
  const sources = [];
  note('sent');
  try {
    const result = streamText({
      model: languageModel(opts),
      prompt: opts.question,
      maxOutputTokens: opts.maxTokens,
      temperature: 0,
      maxRetries: 0,
      includeRawChunks: true,
      abortSignal: abort.signal,
    });
    for await (const part of result.fullStream) {
      if (part.type === 'raw') {
        const chunk = part.rawValue;
        if (!rawSourcesSeen && Array.isArray(chunk?.search_results)) {
          rawSourcesSeen = true;
          note('raw_sources', {
            count: chunk.search_results.length,
            via: 'a `raw` part (includeRawChunks: true): chunk.search_results',
          });
        }
      } else if (part.type === 'source') {
        sources.push({ url: part.url, title: part.title ?? null });
        note('sources', {
          count: 1,
          via: '`source` part (sourceType url)',
          url: part.url,
          title: part.title ?? null,
          fields: Object.keys(part),
        });
      } else if (part.type === 'text-delta') {
        text += part.text;
        deltas += 1;
        note('text', { chars: part.text.length });
        if (opts.scenario === 'stop' && deltas === opts.stopAfter) {
          note('stopping', { how: 'AbortController.abort() on streamText({abortSignal})' });
          abort.abort();
        }
      } else if (part.type === 'error') {
        const error = part.error;
        note('error', {
          type: error?.name ?? typeof error,
          message: String(error?.message ?? error).slice(0, 300),
          text,
        });
      } else if (part.type === 'abort') {
        note('aborted');
      } else if (part.type === 'finish') {
        finish = part.finishReason;
      }
    }
  } catch (error) {
    note('error', {
      type: error?.name ?? typeof error,
      message: String(error?.message ?? error).slice(0, 300),
      text,
      thrown: true,
    });
  }
  // Sources from annotations come after the text: the provider keeps url and title only.
  if (sources.length) {
    note('linked', { count: sources.length, via: '`source` parts', items: sources });
  }
  note('end', { text, finish, sources: sources.length });
  if (abort.signal.aborted) {
    await new Promise((resolve) => setTimeout(resolve, opts.lingerMs));
    note('exiting');
  }
}

await main();
