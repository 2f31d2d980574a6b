// Long texts are tokenised in a child process with the vocabulary alone: llama.cpp's tokenizer is
// quadratic on runs of characters its vocabulary has no token for (262,000 "é" held a node's event
// loop 9.6 s, s24 hB). The event loop stays free meanwhile, the tokens are llama.cpp's own, and a
// text past the deadline is refused (the child killed, started again for the next).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { getLlama, type LlamaModel } from 'node-llama-cpp';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { UnsupportedInputError } from '../adapters/runtime-adapter.ts';
import { TokenizerProcess } from '../adapters/tokenizer-process.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tokenizer-process-'));
const file = path.join(dir, 'tiny.gguf');
let adapter: LlamaEmbeddedAdapter;
let whole: LlamaModel;

beforeAll(async () => {
  writeTinyLlama(file);
  adapter = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 2048, tokenizeDeadlineMs: 3000 });
  await adapter.start();
  whole = await (await getLlama({ gpu: false, build: 'never' })).loadModel({ modelPath: file });
});
afterAll(async () => {
  await adapter?.stop();
  await whole?.dispose();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a slow text is tokenised while the event loop turns, to llama.cpp\'s tokens', async () => {
  const text = 'é'.repeat(60_000);
  let turns = 0;
  const tick = setInterval(() => turns++, 10);
  const started = performance.now();
  const tokens = await adapter.tokenize(text);
  const took = performance.now() - started;
  clearInterval(tick);
  expect(tokens).toEqual([...whole.tokenize(text, false)]);
  // The loop turned through the whole wait (in process it would not have turned at all).
  expect(turns).toBeGreaterThan(Math.floor(took / 10 / 4));
  expect(await adapter.countInputTokens({ kind: 'prompt', prompt: text })).toBe(tokens.length + (whole.tokens.shouldPrependBosToken ? 1 : 0));
}, 60_000);

test('a text past the deadline is refused (input_too_complex); the next one is tokenised', async () => {
  const slow = 'é'.repeat(400_000); // (tens of seconds for llama.cpp here)
  const refused = await adapter.tokenize(slow).then(() => undefined, (e: unknown) => e);
  expect(refused).toBeInstanceOf(UnsupportedInputError);
  expect((refused as UnsupportedInputError).code).toBe('input_too_complex');
  expect((refused as Error).message).toMatch(/^the input \(400000 characters\) was not tokenised within 3 s: /);
  const text = 'hello world '.repeat(3000);
  expect(await adapter.tokenize(text)).toEqual([...whole.tokenize(text, false)]);
}, 60_000);

test('a model the child cannot load, a child killed while it works, and a stopped tokenizer are errors that say so; a killed child is started again', async () => {
  const missing = new TokenizerProcess(path.join(dir, 'missing.gguf'), 3000);
  await expect(missing.tokenize(['hello'], false)).rejects.toThrow(/^the tokenizer process (could not load|ended \(.*\) before it loaded) .*missing\.gguf/);
  missing.stop();

  const t = new TokenizerProcess(file, 30_000);
  expect([...(await t.tokenize(['hello world'], false))]).toEqual([...whole.tokenize('hello world', false)]);
  const slow = t.tokenize(['é'.repeat(400_000)], false);
  await new Promise((r) => setTimeout(r, 300));
  const pid = (t as unknown as { child?: { pid?: number } }).child?.pid;
  expect(pid).toBeGreaterThan(0);
  process.kill(pid!, 'SIGKILL');
  await expect(slow).rejects.toThrow(/^the tokenizer process ended \(SIGKILL\) before the text was tokenised$/);
  expect([...(await t.tokenize(['hello', ' world'], false))]).toEqual([...whole.tokenize('hello', false), ...whole.tokenize(' world', false)]);
  t.stop();
  await expect(t.tokenize(['hello'], false)).rejects.toThrow('the tokenizer process is stopped');
}, 60_000);

test('a chat whose rendering needs more than the child\'s heap is refused (input_too_complex, naming the limit); the next is rendered', async () => {
  // A template that builds millions of pieces for one large message only: it passes the start's probe.
  const amplifying = path.join(dir, 'amplifying.gguf');
  writeTinyLlama(amplifying, {
    chatTemplate: "{% for m in messages %}{% if m.content|length > 60000 %}{% for i in range(3000000) %}{{ m.content[:10] }}{% endfor %}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
  });
  const capped = new LlamaEmbeddedAdapter({ modelPath: amplifying, contextLength: 512, tokenizerHeapMiB: 64 });
  await capped.start();
  try {
    const big = [{ role: 'user' as const, content: 'x'.repeat(70_000) }];
    const refused = await capped.renderChat(big).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(UnsupportedInputError);
    expect(refused).toMatchObject({ code: 'input_too_complex', message: "the messages (1) needed more than 64 MiB to render with the model's chat template" });
    // The next large chat (another content: no amplification) is rendered by a new child.
    const other = [{ role: 'user' as const, content: 'y'.repeat(50_000) }, { role: 'user' as const, content: 'z'.repeat(30_000) }];
    expect(await capped.renderChat(other)).toBe(`<|im_start|>user\n${'y'.repeat(50_000)}<|im_end|>\n<|im_start|>user\n${'z'.repeat(30_000)}<|im_end|>\n<|im_start|>assistant\n`);
  } finally {
    await capped.stop();
  }
  // Without the option, the child's limit is 512 MiB.
  expect(new TokenizerProcess(file, 1000).maxHeapMiB).toBe(512);
}, 60_000);
