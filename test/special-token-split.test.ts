// A long text with special tokens in it is tokenised in pieces cut where llama.cpp surely cuts
// it: the tokens are exactly those of the whole text, and many empty chat messages (whose
// tokenising took time growing with the square of their number: 35,000 held the node 13 s, s23 h6)
// are counted, or refused for the context, without that.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { getLlama, type LlamaModel } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { GgufKv } from '../adapters/gguf/gguf-writer.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { UnsupportedInputError, type ChatMessage } from '../adapters/runtime-adapter.ts';
import { piecesAt, scanSpecials, type SpecialText } from '../adapters/special-token-split.ts';

describe('scanSpecials', () => {
  const specials: SpecialText[] = [
    { text: '<|im_start|>', sure: true, rstrip: false },
    { text: '<|im_end|>', sure: true, rstrip: false },
    { text: '<s>', sure: true, rstrip: false },
    { text: 's><s', sure: false, rstrip: false },
    { text: '<eot>', sure: true, rstrip: true },
  ];

  test('an occurrence alone is sure and a cut follows it; overlapping ones, and a token that strips what follows, are not cut', () => {
    const text = '<|im_start|>user\nhi<|im_end|>\n<s><s>x<eot> y';
    const scan = scanSpecials(text, specials);
    // <|im_start|>, <|im_end|>, <eot> are alone; the two <s> overlap "s><s", which is not sure.
    expect(scan.sure).toBe(3);
    expect(scan.cuts).toEqual([12, 29]);
    expect(scan.otherBytes).toBe(Buffer.byteLength(text) - 12 - 10 - 5);
  });

  test('a special text overlapping itself is not sure', () => {
    const scan = scanSpecials('aaa', [{ text: 'aa', sure: true, rstrip: false }]);
    expect(scan.sure).toBe(0);
    expect(scan.cuts).toEqual([]);
  });

  test('no cut after an occurrence at the very end; bytes are UTF-8', () => {
    const scan = scanSpecials('é<s>', specials);
    expect(scan).toEqual({ sure: 1, otherBytes: 2, cuts: [] });
  });

  test('piecesAt cuts at every n-th place and loses nothing', () => {
    const text = 'abcdefghij';
    expect(piecesAt(text, [1, 2, 3, 4, 5], 2)).toEqual(['ab', 'cd', 'efghij']);
    expect(piecesAt(text, [], 2)).toEqual([text]);
    expect(piecesAt(text, [3], 1)).toEqual(['abc', 'defghij']);
  });
});

describe('the embedded runtime tokenises long texts in pieces, to the same tokens', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'special-split-'));
  const file = path.join(dir, 'tiny.gguf');
  let adapter: LlamaEmbeddedAdapter;
  let whole: LlamaModel;

  beforeAll(async () => {
    writeTinyLlama(file);
    adapter = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 4096 });
    await adapter.start();
    // The reference: the same file tokenised whole by llama.cpp.
    const llama = await getLlama({ gpu: false, build: 'never' });
    whole = await llama.loadModel({ modelPath: file });
  });
  afterAll(async () => {
    await adapter?.stop();
    await whole?.dispose();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  // Pieces that make cutting hard: special texts whole, broken, overlapping and glued to words,
  // whitespace of every kind beside them, words of the vocabulary and bytes outside it.
  const parts = ['<|im_start|>', '<|im_end|>', '<s>', '</s>', '<unk>', '<|im_', 'im_end|>', '<|im_start|><|im_end|>', '<s></s>', '</s><s>', 's>', '<', '|', '>', ' ', '  ', '\n', '\n\n', '\t', 'user', 'assistant', 'the', ' word', 'hello', 'é', '日本', '🙂', 'x', '0', '<<s>>'];

  function randomText(seed: number, length: number): string {
    let x = seed;
    const next = () => {
      x = (x * 1103515245 + 12345) % 2147483648;
      return x;
    };
    let s = '';
    while (s.length < length) s += parts[next() % parts.length];
    return s;
  }

  test('random texts of special tokens, fragments of them, whitespace and words', async () => {
    for (let seed = 1; seed <= 12; seed++) {
      const text = randomText(seed, 20_000 + seed * 997);
      const tokens = await adapter.tokenize(text, { special: true });
      expect(tokens, `seed ${seed}`).toEqual([...whole.tokenize(text, true)]);
      // The cut really happened (else this test proves nothing).
      expect(piecesAt(text, scanSpecials(text, specialsOf(whole)).cuts, 32).length, `seed ${seed}`).toBeGreaterThan(10);
    }
  });

  test('a long text without special tokens parsed, and a short one with, are tokenised as before', async () => {
    const text = randomText(99, 30_000);
    expect(await adapter.tokenize(text)).toEqual([...whole.tokenize(text, false)]);
    const short = randomText(7, 2_000);
    expect(await adapter.tokenize(short, { special: true })).toEqual([...whole.tokenize(short, true)]);
  });

  test('a conversation of many messages counts the tokens of the whole rendering', async () => {
    const messages: ChatMessage[] = Array.from({ length: 3000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: i % 3 ? `hello word ${i}` : '' }));
    const rendered = await adapter.renderChat(messages);
    const reference = [...whole.tokenize(rendered, true)];
    const bos = whole.tokens.bos;
    const expected = whole.tokens.shouldPrependBosToken && bos !== null && reference[0] !== bos ? [bos, ...reference] : reference;
    expect(await adapter.inputTokens({ kind: 'chat', messages })).toEqual(expected);
    expect(await adapter.countInputTokens({ kind: 'chat', messages })).toBe(expected.length);
  });

  test('35,000 empty messages are refused for the context from their special tokens, and the runtime still serves', async () => {
    const messages: ChatMessage[] = Array.from({ length: 35_000 }, () => ({ role: 'user', content: '' }));
    const refused = await adapter.inputTokens({ kind: 'chat', messages }, { atMost: 4096 }).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(UnsupportedInputError);
    expect((refused as UnsupportedInputError).code).toBe('context_length_exceeded');
    const said = /^messages of at least (\d+) tokens \(35000 messages\) exceed the model's context of 4096$/.exec((refused as Error).message);
    expect(said).not.toBeNull();
    const atLeast = Number(said![1]);
    // Two special tokens a message at least, and the bound is one: never above the true count.
    expect(atLeast).toBeGreaterThan(70_000);
    // Without a bound they are counted exactly (what count_tokens does): each empty message adds
    // what the second adds to the first, by llama.cpp's count of those two rendered whole.
    const count = async (n: number) => (await adapter.countInputTokens({ kind: 'chat', messages: messages.slice(0, n) }));
    const one = whole.tokenize(await adapter.renderChat(messages.slice(0, 1)), true).length;
    const two = whole.tokenize(await adapter.renderChat(messages.slice(0, 2)), true).length;
    expect(await count(2) - (await count(1))).toBe(two - one);
    expect(await count(35_000)).toBe((await count(1)) + 34_999 * (two - one));
    expect(atLeast).toBeLessThanOrEqual(await count(35_000));
    expect(await adapter.countInputTokens({ kind: 'chat', messages: [{ role: 'user', content: 'hello' }] })).toBeGreaterThan(3);
  }, 120_000);
});

test('a vocabulary whose control token reads back without its leading space (" <x>" as "<x>") is tokenised as llama.cpp does whole (s24 hA: cut where llama.cpp does not)', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'special-lead-space-'));
  const file = path.join(dir, 'lead-space.gguf');
  writeTinyLlama(file, {
    edit: (m) => {
      const md = m.metadata as GgufKv[];
      const at = (k: string) => md.findIndex((e) => e.key === k);
      const ti = at('tokenizer.ggml.tokens');
      const yi = at('tokenizer.ggml.token_type');
      const tokens = [...(md[ti]!.value.value as string[])];
      const types = Array.from(md[yi]!.value.value as ArrayLike<number>);
      tokens[tokens.length - 1] = ' <x>';
      types[types.length - 1] = 3; // control
      md[ti] = { key: 'tokenizer.ggml.tokens', value: { type: 'string[]', value: tokens } };
      md[yi] = { key: 'tokenizer.ggml.token_type', value: { type: 'int32[]', value: Int32Array.from(types) } };
    },
  });
  const adapter = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 4096 });
  await adapter.start();
  const whole = await (await getLlama({ gpu: false, build: 'never' })).loadModel({ modelPath: file });
  try {
    const parts = ['<|im_start|>', '<|im_end|>', '<s>', '</s>', ' ', '\n', 'user', 'hello', '<x>', ' <x>', 'a<x>b', '<x>hello', 'é'];
    for (let seed = 1; seed <= 4; seed++) {
      let x = seed;
      let text = '';
      while (text.length < 20_000) text += parts[(x = (x * 1103515245 + 12345) % 2147483648) % parts.length];
      expect(await adapter.tokenize(text, { special: true }), `seed ${seed}`).toEqual([...whole.tokenize(text, true)]);
    }
  } finally {
    await adapter.stop();
    await whole.dispose();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);

function specialsOf(model: LlamaModel): SpecialText[] {
  const out: SpecialText[] = [];
  for (const t of model.iterateAllTokens()) {
    const a = model.getTokenAttributes(t);
    if (a.control || a.userDefined || a.unknown) out.push({ text: model.detokenize([t], true), sure: a.control, rstrip: a.rstrip });
  }
  return out;
}

test('a chat is judged by its rendering: a template that leaves out earlier turns is not refused for their bytes (s24 hB: a 36-token chat was refused as "at least 5003")', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'special-last-turn-'));
  const file = path.join(dir, 'last-turn.gguf');
  writeTinyLlama(file, { chatTemplate: "{% for m in messages %}{% if loop.last %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n" });
  const adapter = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 512 });
  await adapter.start();
  try {
    const messages: ChatMessage[] = [{ role: 'user', content: 'hello world '.repeat(20_000) }, { role: 'user', content: 'hi' }];
    const tokens = await adapter.inputTokens({ kind: 'chat', messages }, { atMost: 512 });
    expect(tokens.length).toBeLessThan(20);
    expect(tokens.length).toBe(await adapter.countInputTokens({ kind: 'chat', messages }));
  } finally {
    await adapter.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);
