// The runtime thread: the embedded adapters of one process, each answering the messages of its
// LlamaThreadAdapter (runtime-thread.ts). Here node-llama-cpp's token loop has a thread to itself:
// nothing the node does between two tokens (relaying, verifying tickets, signing receipts) delays
// the next decode. A generation's chunks go back as they come: the first at once (the time to the
// first token), the others gathered at most CHUNK_POST_MS, a message per token cost the loop its
// own time (waking the node's thread). A generation runs at most CHUNK_WINDOW chunks ahead of what
// the node's thread has taken, as its read-ahead on that thread does: a buyer who stops reading
// stops the runtime, and an abort then ends the run within a token, not after a backlog.
import { parentPort } from 'node:worker_threads';
import { LlamaEmbeddedAdapter } from './llama-embedded.ts';
import { sendLlamaLines } from './llama-load-errors.ts';
import type { GeneratedChunk } from './runtime-adapter.ts';
import { encodeError, type FromThread, type Started, type ToThread } from './runtime-thread-messages.ts';

/** How long a chunk may wait for others to go back with it. */
export const CHUNK_POST_MS = 5;
/** How many chunks a generation may have produced beyond those the node's thread has taken. */
export const CHUNK_WINDOW = 32;

const port = parentPort!;
const adapters = new Map<number, LlamaEmbeddedAdapter>();
/** A running generation or embedding: its signal, and for a generation the chunks the node has taken and the wait for more. */
type Run = { abort: AbortController; taken: number; wake?: () => void };
/** Running generations and embeddings by message id. */
const running = new Map<number, Run>();
/** The memo's answers awaited, by question id. */
const memoAnswers = new Map<number, (known: boolean) => void>();
let nextQuestion = 1;

const send = (m: FromThread) => port.postMessage(m);
// llama.cpp's lines go to the node's thread, which logs them (they are kept here too, for load errors).
sendLlamaLines((line) => send({ op: 'llama-line', line }));

function adapter(handle: number): LlamaEmbeddedAdapter {
  const a = adapters.get(handle);
  if (!a) throw new Error('the embedded runtime is not started');
  return a;
}

async function answer(id: number, work: () => Promise<unknown>): Promise<void> {
  try {
    send({ op: 'result', id, value: await work() });
  } catch (e) {
    send({ op: 'error', id, error: encodeError(e) });
  }
}

function track(id: number, aborted: boolean): Run {
  const r: Run = { abort: new AbortController(), taken: 0 };
  if (aborted) r.abort.abort();
  running.set(id, r);
  return r;
}

async function start(m: Extract<ToThread, { op: 'start' }>): Promise<Started> {
  const memo = m.memo
    ? {
        known: (key: string) =>
          new Promise<boolean>((resolve) => {
            const id = nextQuestion++;
            memoAnswers.set(id, resolve);
            send({ op: 'memo-known', id, handle: m.handle, key });
          }),
        remember: (key: string) => send({ op: 'memo-remember', handle: m.handle, key }),
      }
    : undefined;
  const a = new LlamaEmbeddedAdapter({ ...m.opts, ...(m.opts.probe ? { probe: { ...m.opts.probe, ...(memo ? { memo } : {}) } } : {}) });
  await a.start();
  adapters.set(m.handle, a);
  const file = a.loadedFile;
  return { info: a.info, probed: a.probed, file: file ? { identity: file.identity, mapped: file.mapped } : undefined };
}

async function generate(m: Extract<ToThread, { op: 'generate' }>): Promise<void> {
  const state = track(m.id, m.aborted);
  const signal = state.abort.signal;
  let produced = 0;
  let pending: GeneratedChunk[] = [];
  let last = Number.NEGATIVE_INFINITY;
  let timer: NodeJS.Timeout | undefined;
  const post = () => {
    clearTimeout(timer);
    timer = undefined;
    if (pending.length === 0) return;
    send({ op: 'chunks', id: m.id, chunks: pending });
    pending = [];
    last = performance.now();
  };
  try {
    const run = adapter(m.handle).generate({ ...m.req, signal });
    for (;;) {
      while (produced - state.taken >= CHUNK_WINDOW && !signal.aborted) {
        post();
        await new Promise<void>((resolve) => (state.wake = resolve));
      }
      const r = await run.next();
      if (r.done) {
        clearTimeout(timer);
        send({ op: 'chunks', id: m.id, chunks: pending, done: r.value });
        return;
      }
      pending.push(r.value);
      produced++;
      const since = performance.now() - last;
      if (since >= CHUNK_POST_MS) post();
      else timer ??= setTimeout(post, CHUNK_POST_MS - since);
    }
  } catch (e) {
    clearTimeout(timer);
    send({ op: 'error', id: m.id, error: encodeError(e), chunks: pending });
  } finally {
    running.delete(m.id);
  }
}

port.on('message', (m: ToThread) => {
  try {
    received(m);
  } catch {
    // (a message this thread cannot read: nothing to answer it with)
  }
});

function received(m: ToThread): void {
  switch (m.op) {
    case 'start':
      void answer(m.id, () => start(m));
      break;
    case 'call':
      void answer(m.id, async () => {
        const a = adapter(m.handle);
        if (m.method !== 'stop') return await (a[m.method] as (...args: unknown[]) => Promise<unknown>).apply(a, m.args);
        adapters.delete(m.handle);
        await a.stop();
        return undefined;
      });
      break;
    case 'generate':
      void generate(m);
      break;
    case 'embed': {
      const signal = track(m.id, m.aborted).abort.signal;
      void answer(m.id, () => adapter(m.handle).embed(m.inputs, m.inputTokens, signal)).finally(() => running.delete(m.id));
      break;
    }
    case 'abort': {
      const r = running.get(m.id);
      r?.abort.abort();
      r?.wake?.();
      break;
    }
    case 'credit': {
      const r = running.get(m.id);
      if (!r) break;
      r.taken += m.n;
      r.wake?.();
      r.wake = undefined;
      break;
    }
    case 'close':
      // (the thread ends once nothing is under way: no message keeps it any more)
      port.close();
      break;
    case 'memo-answer':
      memoAnswers.get(m.id)?.(m.known);
      memoAnswers.delete(m.id);
      break;
  }
}
