// Large chats are rendered with the model's chat template in the tokenizer's child process, off
// the node's event loop and within its deadline (s26: 280,000 empty messages, 8 MiB, held the
// event loop 1.5 s in the template). The text is the node's own Jinja's, byte for byte; a template
// that refuses the messages is a 400 as before; past the deadline the chat is refused and the
// next one is rendered.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { afterAll, afterEach, beforeAll, expect, test, vi } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { chatWeight, LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { UnsupportedInputError, type ChatMessage } from '../adapters/runtime-adapter.ts';
import { TokenizerBusyError, TokenizerProcess } from '../adapters/tokenizer-process.ts';

const REFUSING = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'chat-render-child-'));
const adapters: LlamaEmbeddedAdapter[] = [];

async function start(opts: { chatTemplate?: string; tokenizeDeadlineMs?: number } = {}): Promise<LlamaEmbeddedAdapter> {
  const file = path.join(dir, `m${adapters.length}.gguf`);
  writeTinyLlama(file, opts.chatTemplate ? { chatTemplate: opts.chatTemplate } : {});
  const a = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 2048, ...(opts.tokenizeDeadlineMs ? { tokenizeDeadlineMs: opts.tokenizeDeadlineMs } : {}) });
  adapters.push(a);
  await a.start();
  return a;
}

/** What the node's own Jinja renders in its event loop. */
function inline(a: LlamaEmbeddedAdapter, messages: unknown[]): string {
  return new Template(a.info.chatTemplate!).render({ messages, add_generation_prompt: true, bos_token: '<s>', eos_token: '</s>' });
}

const chat = (n: number, first?: ChatMessage): ChatMessage[] => [
  ...(first ? [first] : []),
  ...Array.from({ length: n }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: i % 3 ? `turn ${i}: héllo wörld 🙂 <|im_end|>` : '' }) as ChatMessage),
];

let plain: LlamaEmbeddedAdapter;
beforeAll(async () => {
  plain = await start();
});
afterEach(() => {
  vi.restoreAllMocks();
});
afterAll(async () => {
  for (const a of adapters) await a.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('chatWeight counts messages and their strings, up to the cap', () => {
  expect(chatWeight([], 100)).toBe(0);
  expect(chatWeight([{ role: 'user', content: 'abc' }], 1000)).toBe(64 + 4 + 3);
  expect(chatWeight([{ role: 'user', content: [{ type: 'text', text: 'abcd' }] }], 1000)).toBe(64 + 4 + 64 + 64 + 4 + 4);
  expect(chatWeight(chat(100_000), 1000)).toBeLessThan(1100);
});

test('a large chat is rendered in the child, byte for byte what the node renders; a small one in the event loop', async () => {
  const spy = vi.spyOn(TokenizerProcess.prototype, 'render');
  const small = chat(4);
  expect(await plain.renderChat(small)).toBe(inline(plain, small));
  expect(spy).not.toHaveBeenCalled();
  const large = chat(3000, { role: 'system', content: 'be brief' });
  expect(chatWeight(large, Infinity)).toBeGreaterThan(65_536);
  const text = await plain.renderChat(large);
  expect(spy).toHaveBeenCalledTimes(1);
  expect(text).toBe(inline(plain, large));
  expect(text.endsWith('<|im_start|>assistant\n')).toBe(true);
  // The tokens a generation starts from are those of that text.
  expect(await plain.countInputTokens({ kind: 'chat', messages: large })).toBe((await plain.tokenize(inline(plain, large), { special: true })).length + 1);
}, 60_000);

test('a template that refuses a large chat: 400 invalid_request with its message; the next large chat renders', async () => {
  const strict = await start({ chatTemplate: REFUSING });
  const refused = await strict.renderChat(chat(3000, { role: 'system', content: 'be brief' })).catch((e: unknown) => e);
  expect(refused).toBeInstanceOf(UnsupportedInputError);
  expect(refused).toMatchObject({ code: 'invalid_request', message: expect.stringMatching(/chat template refuses them: .*System role not supported/) });
  const ok = chat(3000);
  expect(await strict.renderChat(ok)).toBe(inline(strict, ok));
}, 60_000);

test('a chat not rendered within the deadline is refused 400 input_too_complex; the child starts again for the next', async () => {
  const quick = await start({ tokenizeDeadlineMs: 100 });
  await quick.renderChat(chat(3000)); // (the child started and loaded: the deadline is the render's alone)
  // ~1.5 s of rendering here, against a deadline of 0.1 s.
  const slow = await quick.renderChat(chat(280_000)).catch((e: unknown) => e);
  expect(slow).toMatchObject({ code: 'input_too_complex', message: expect.stringMatching(/the messages \(280000\) were not rendered with the model's chat template within 0\.1 s/) });
  const next = chat(2000);
  expect(await quick.renderChat(next)).toBe(inline(quick, next));
}, 60_000);

test('at most maxWaiting texts wait behind the one under way: the next is refused at once (TokenizerBusyError), the queue goes on', async () => {
  const t = new TokenizerProcess(path.join(dir, 'm0.gguf'), 30_000, { maxWaiting: 2 });
  try {
    expect([...(await t.tokenize(['hello'], false))].length).toBeGreaterThan(0); // (started)
    const slow = t.tokenize(['é'.repeat(100_000)], false); // (a second or so in llama.cpp's tokenizer)
    await new Promise((r) => setImmediate(r)); // (under way: no longer waiting)
    const waiting = [t.tokenize(['hello world'], false), t.render(plain.info.chatTemplate!, [{ role: 'user', content: 'hi' }], { bos: '<s>', eos: '</s>' })];
    await expect(t.tokenize(['one too many'], false)).rejects.toBeInstanceOf(TokenizerBusyError);
    await expect(t.render(plain.info.chatTemplate!, [], { bos: '<s>', eos: '</s>' })).rejects.toThrow(/^2 long inputs are waiting for the tokenizer process already$/);
    expect((await slow).length).toBeGreaterThan(0);
    const [tokens, text] = await Promise.all(waiting);
    expect((tokens as Int32Array).length).toBeGreaterThan(0);
    expect(text).toBe(inline(plain, [{ role: 'user', content: 'hi' }]));
    expect([...(await t.tokenize(['hello'], false))].length).toBeGreaterThan(0); // (room again)
  } finally {
    t.stop();
  }
}, 60_000);

test('a child that dies while it renders: that chat is refused naming it, and the next chat renders in a new child', async () => {
  const t = new TokenizerProcess(path.join(dir, 'm0.gguf'), 60_000);
  try {
    const tokens = { bos: '<s>', eos: '</s>' };
    expect(await t.render(plain.info.chatTemplate!, [{ role: 'user', content: 'hi' }], tokens)).toBe(inline(plain, [{ role: 'user', content: 'hi' }])); // (started)
    const pid = (t as unknown as { child?: { pid?: number } }).child?.pid;
    expect(pid).toBeGreaterThan(0);
    const slow = t.render(plain.info.chatTemplate!, chat(280_000), tokens); // (~1.5 s of rendering)
    await new Promise((r) => setTimeout(r, 200));
    process.kill(pid!, 'SIGKILL');
    await expect(slow).rejects.toThrow(/^the tokenizer process ended \(SIGKILL\) before the chat was rendered$/);
    const next = chat(5);
    expect(await t.render(plain.info.chatTemplate!, next, tokens)).toBe(inline(plain, next));
    expect((t as unknown as { child?: { pid?: number } }).child?.pid).not.toBe(pid);
  } finally {
    t.stop();
  }
}, 60_000);
