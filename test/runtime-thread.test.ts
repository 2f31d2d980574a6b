// The embedded runtime on its own thread (adapters/runtime-thread.ts): what a serving node uses. It
// must answer exactly as the embedded adapter on this thread does, carry its errors with their class,
// stop a run on its signal, give a slot back before an early close resolves, and end its thread with
// its last adapter.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { ModelProbeError, withProbeTimeoutHint } from '../adapters/model-probe.ts';
import { RuntimeBusyError, UnsupportedInputError, type GeneratedChunk, type GenerateRequest, type GenerationResult, type RuntimeAdapter } from '../adapters/runtime-adapter.ts';
import { decodeError, encodeError } from '../adapters/runtime-thread-messages.ts';
import { LlamaThreadAdapter } from '../adapters/runtime-thread.ts';
import { drain } from './helpers/generation.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'runtime-thread-'));
const modelPath = path.join(dir, 'tiny.gguf');
const baseModel = path.join(dir, 'base.gguf');
let here: LlamaEmbeddedAdapter;
let there: LlamaThreadAdapter;

beforeAll(async () => {
  writeTinyLlama(modelPath);
  writeTinyLlama(baseModel, { chatTemplate: null });
  here = new LlamaEmbeddedAdapter({ modelPath, slots: 1, contextLength: 512 });
  there = new LlamaThreadAdapter({ modelPath, slots: 1, contextLength: 512 });
  await Promise.all([here.start(), there.start()]);
});
afterAll(async () => {
  await here?.stop();
  await there?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

function run(rt: RuntimeAdapter, req: GenerateRequest): Promise<{ chunks: GeneratedChunk[]; result: GenerationResult }> {
  return drain(rt.generate(req));
}

const chat = { kind: 'chat' as const, messages: [{ role: 'user' as const, content: 'hello world' }] };

describe('LlamaThreadAdapter', () => {
  test('reports what the embedded adapter reports', () => {
    expect(there.info).toEqual(here.info);
    expect(there.info.modelSha256).toMatch(/^[0-9a-f]{64}$/);
    expect(there.modelFileState()).toBe('unchanged');
  });

  test('tokenizes, renders and counts as the embedded adapter does', async () => {
    const text = 'hello world <|im_start|>';
    expect(await there.tokenize(text)).toEqual(await here.tokenize(text));
    expect(await there.tokenize(text, { special: true })).toEqual(await here.tokenize(text, { special: true }));
    const tokens = await here.tokenize('hello world');
    expect(await there.detokenize(tokens)).toBe(await here.detokenize(tokens));
    expect(await there.renderChat(chat.messages)).toBe(await here.renderChat(chat.messages));
    expect(await there.inputTokens(chat)).toEqual(await here.inputTokens(chat));
    expect(await there.countInputTokens({ kind: 'prompt', prompt: 'hello' })).toBe(await here.countInputTokens({ kind: 'prompt', prompt: 'hello' }));
  });

  test('generates the same chunks, tokens and result for the same seed, streamed in order', async () => {
    const req = { input: chat, maxTokens: 200, sampling: { temperature: 1, seed: 7 } };
    const a = await run(here, req);
    const b = await run(there, req);
    expect(b.result).toEqual(a.result);
    expect(b.chunks).toEqual(a.chunks);
    expect(b.chunks.length).toBeGreaterThan(50);
    expect(b.chunks.flatMap((c) => c.tokens).length).toBe(b.result.outputTokens);
  });

  test('stop sequences and input tokens given by the caller behave as on this thread', async () => {
    const first = await run(here, { input: chat, maxTokens: 30, sampling: { temperature: 0, seed: 1 } });
    const text = first.chunks.map((c) => c.text).join('');
    const stop = text.slice(5, 8);
    const req = { input: chat, inputTokens: await here.inputTokens(chat), maxTokens: 30, sampling: { temperature: 0, seed: 1 }, stop: [stop] };
    const a = await run(here, req);
    const b = await run(there, req);
    expect(b).toEqual(a);
    expect(b.result.finishReason).toBe('stop');
  });

  test('embeds as the embedded adapter does', async () => {
    const a = await here.embed(['hello', 'world']);
    const b = await there.embed(['hello', 'world']);
    expect(b.inputTokens).toBe(a.inputTokens);
    expect(b.vectors).toEqual(a.vectors);
  });

  test("the runtime's refusals keep their class and code across the thread", async () => {
    const err = await there.inputTokens({ kind: 'prompt', prompt: 'hello world '.repeat(400) }, { atMost: 10 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnsupportedInputError);
    expect((err as UnsupportedInputError).code).toBe('context_length_exceeded');
    // Its stack says where it was thrown there (the embedded adapter), then where this thread took it.
    const stack = (err as Error).stack!;
    expect(stack).toMatch(/^UnsupportedInputError: /);
    expect(stack).toMatch(/llama-embedded\.ts:\d+/);
    expect(stack.indexOf("(on the runtime thread; taken on the node's thread:)")).toBeGreaterThan(stack.indexOf('llama-embedded.ts'));
    const base = new LlamaThreadAdapter({ modelPath: baseModel, contextLength: 256 });
    await base.start();
    try {
      const gen = base.generate({ input: chat, maxTokens: 4, sampling: { temperature: 0, seed: 1 } });
      const e = await gen.next().catch((x: unknown) => x);
      expect(e).toBeInstanceOf(UnsupportedInputError);
      expect((e as UnsupportedInputError).code).toBe('token_count_unsupported');
      // The thread is still there for the next request.
      expect((await run(base, { input: { kind: 'prompt', prompt: 'hello' }, maxTokens: 3, sampling: { temperature: 0, seed: 1 } })).result.outputTokens).toBe(3);
    } finally {
      await base.stop();
    }
  });

  test('errors are carried with their class, code, timeout flag, stack and cause', () => {
    const busy = decodeError(encodeError(new RuntimeBusyError('busy')));
    expect(busy).toBeInstanceOf(RuntimeBusyError);
    expect(busy.message).toBe('busy');
    const probe = decodeError(encodeError(new Error('load failed', { cause: new ModelProbeError('slow', { timedOut: true }) })));
    expect(withProbeTimeoutHint(probe, 'x')).toBe('load failed (x allows a slower load)');
    const coded = decodeError(encodeError(Object.assign(new Error('gone'), { code: 'ENOENT' })));
    expect((coded as Error & { code?: string }).code).toBe('ENOENT');
    expect(decodeError(encodeError('text')).message).toBe('text');
    const thrownThere = () => new Error('deep', { cause: new TypeError('deeper') });
    const crossed = decodeError(encodeError(thrownThere()));
    expect(crossed.stack).toMatch(/^Error: deep\n {4}at thrownThere /);
    expect((crossed.cause as Error).stack).toMatch(/^TypeError: deeper\n {4}at thrownThere /);
  });

  test('a signal stops the run within a token; what was generated is reported', async () => {
    const ac = new AbortController();
    const gen = there.generate({ input: chat, maxTokens: 400, sampling: { temperature: 1, seed: 3 }, signal: ac.signal });
    let chunks = 0;
    const { result } = await drain(gen, () => void (++chunks === 3 && ac.abort()));
    expect(result.finishReason).toBe('abort');
    expect(result.outputTokens).toBeLessThan(400);
    // A signal aborted before the run asks for nothing to be generated.
    const pre = new AbortController();
    pre.abort();
    const none = await run(there, { input: chat, maxTokens: 50, sampling: { temperature: 1, seed: 3 }, signal: pre.signal });
    expect(none.result).toMatchObject({ finishReason: 'abort', inputTokens: 0, outputTokens: 0 });
  });

  test('a run closed early gives its slot back before the close resolves', async () => {
    for (let i = 0; i < 3; i++) {
      const gen = there.generate({ input: chat, maxTokens: 400, sampling: { temperature: 1, seed: i } });
      await gen.next();
      await gen.return(undefined as never);
      // One slot: a run started at once would find none were the first still holding it.
      const next = await run(there, { input: chat, maxTokens: 5, sampling: { temperature: 0, seed: 1 } });
      expect(next.result.outputTokens).toBe(5);
    }
  });

  test('a run goes at most a window of chunks ahead of what is taken: a reader who stalls stops the runtime, and an abort then ends it within a token', async () => {
    const ac = new AbortController();
    const gen = there.generate({ input: chat, maxTokens: 400, sampling: { temperature: 1, seed: 3 }, signal: ac.signal });
    await gen.next();
    await new Promise((r) => setTimeout(r, 300)); // (the whole run takes ~150 ms unchecked)
    ac.abort();
    const { result } = await drain(gen);
    expect(result.finishReason).toBe('abort');
    // One chunk taken, the window (32) produced beyond it, and the token under way at the abort.
    expect(result.outputTokens).toBeLessThanOrEqual(40);
    // Unchecked, the same run goes to its end (364 tokens, the model's end of generation).
    expect((await run(there, { input: chat, maxTokens: 400, sampling: { temperature: 1, seed: 3 } })).result.outputTokens).toBeGreaterThan(100);
  });

  test('starts and stops at once are taken in turn: a stop during a start stops what it loaded; two stops at once both leave it stopped', async () => {
    const rt = new LlamaThreadAdapter({ modelPath, contextLength: 256 });
    const starting = rt.start();
    const stopping = rt.stop();
    await starting;
    await stopping;
    await expect(rt.tokenize('x')).rejects.toThrow(/not started/);
    await rt.start();
    await Promise.all([rt.stop(), rt.stop()]);
    await expect(rt.tokenize('x')).rejects.toThrow(/not started/);
    expect(LlamaThreadAdapter.threadRunning).toBe(true); // (`there` still holds it)
  });

  test('a model file changed in place after the start is seen from this thread', async () => {
    const copy = path.join(dir, 'copy.gguf');
    fs.copyFileSync(modelPath, copy);
    const rt = new LlamaThreadAdapter({ modelPath: copy, contextLength: 256 });
    await rt.start();
    try {
      expect(rt.modelFileState()).toBe('unchanged');
      fs.appendFileSync(copy, Buffer.alloc(32));
      // Read into memory (not mapped): what is served is the bytes hashed at start.
      expect(rt.modelFileState()).toBe('replaced');
    } finally {
      await rt.stop();
    }
  });

  test('the probe memo is asked and told from this thread', async () => {
    const asked: string[] = [];
    const told: string[] = [];
    const memo = { known: async (k: string) => (asked.push(k), false), remember: (k: string) => void told.push(k) };
    const rt = new LlamaThreadAdapter({ modelPath, contextLength: 256, probe: { memo, timeoutMs: 60_000 } });
    await rt.start();
    try {
      expect(rt.probed).toBe('ran');
      expect(asked).toHaveLength(1);
      expect(told).toEqual(asked); // (told before the start's answer: the thread's messages come in order)
    } finally {
      await rt.stop();
    }
    const again = new LlamaThreadAdapter({ modelPath, contextLength: 256, probe: { memo: { known: () => true, remember: () => undefined } } });
    await again.start();
    expect(again.probed).toBe('remembered');
    await again.stop();
  }, 60_000);

  test('a start that fails says why, leaves nothing loaded, and the adapter can start again', async () => {
    const bad = path.join(dir, 'bad.gguf');
    fs.writeFileSync(bad, 'not a model');
    const rt = new LlamaThreadAdapter({ modelPath: bad });
    await expect(rt.start()).rejects.toThrow(/bad\.gguf/);
    await expect(rt.tokenize('x')).rejects.toThrow(/not started/);
    fs.copyFileSync(modelPath, bad);
    await rt.start();
    expect(rt.info.modelSha256).toBe(here.info.modelSha256);
    await rt.stop();
    await expect(rt.tokenize('x')).rejects.toThrow(/not started/);
  });

  test('a thread that dies: its runs and calls fail at once, each adapter says so once, and a new start gets a new thread', async () => {
    const failures: Error[] = [];
    const rt = new LlamaThreadAdapter({ modelPath, contextLength: 256, onFailure: (e) => failures.push(e) });
    await rt.start();
    const gen = rt.generate({ input: chat, maxTokens: 400, sampling: { temperature: 1, seed: 3 } });
    await gen.next();
    // (the run then stops at its window: no llama.cpp call is under way when the thread ends, as
    // one would end the process itself, and this test with it)
    await new Promise((r) => setTimeout(r, 100));
    await LlamaThreadAdapter.crashThreadForTests();
    await expect(drain(gen)).rejects.toThrow(/runtime thread ended/);
    await expect(rt.tokenize('x')).rejects.toThrow(/runtime thread ended/);
    expect(failures).toHaveLength(1);
    expect(rt.failure()?.message).toMatch(/runtime thread ended/);
    expect(there.failure()?.message).toMatch(/runtime thread ended/);
    await rt.stop(); // (nothing loaded any more: no error)
    await there.stop();
    expect(LlamaThreadAdapter.threadRunning).toBe(false);
    there = new LlamaThreadAdapter({ modelPath, slots: 1, contextLength: 512 });
    await there.start();
    expect(there.failure()).toBeUndefined();
    expect((await run(there, { input: chat, maxTokens: 3, sampling: { temperature: 0, seed: 1 } })).result.outputTokens).toBe(3);
  });

  test('the thread ends with the last adapter that stops', async () => {
    expect(LlamaThreadAdapter.threadRunning).toBe(true);
    const other = new LlamaThreadAdapter({ modelPath, contextLength: 256 });
    await other.start();
    await there.stop();
    expect(LlamaThreadAdapter.threadRunning).toBe(true);
    expect((await run(other, { input: chat, maxTokens: 3, sampling: { temperature: 0, seed: 1 } })).result.outputTokens).toBe(3);
    await other.stop();
    expect(LlamaThreadAdapter.threadRunning).toBe(false);
    there = new LlamaThreadAdapter({ modelPath, slots: 1, contextLength: 512 });
    await there.start();
    expect(LlamaThreadAdapter.threadRunning).toBe(true);
  });
});
