// The embedded runtime on the real llama.cpp (node-llama-cpp, CPU), with the generated tiny model.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { drain } from './helpers/generation.ts';
import type { GeneratedChunk, GenerateRequest, GenerationResult } from '../adapters/runtime-adapter.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-embedded-'));
const modelPath = path.join(dir, 'tiny.gguf');
let rt: LlamaEmbeddedAdapter;

beforeAll(async () => {
  writeTinyLlama(modelPath);
  rt = new LlamaEmbeddedAdapter({ modelPath, slots: 2, contextLength: 512 });
  await rt.start();
});
afterAll(async () => {
  await rt?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** Runs a generation to its end; `onChunk` sees each chunk as it comes. */
function run(req: GenerateRequest, onChunk?: () => void): Promise<{ chunks: GeneratedChunk[]; result: GenerationResult }> {
  return drain(rt.generate(req), onChunk);
}

const chat = { kind: 'chat' as const, messages: [{ role: 'user' as const, content: 'hello world' }] };

describe('LlamaEmbeddedAdapter', () => {
  test('reports what it serves: model hash, context, embedding size, chat template', () => {
    expect(rt.info.modelSha256).toBe(crypto.createHash('sha256').update(fs.readFileSync(modelPath)).digest('hex'));
    expect(rt.info.contextLength).toBe(512);
    expect(rt.info.embeddingLength).toBe(64);
    expect(rt.info.chatTemplate).toContain('<|im_start|>');
  });

  test('renders chats with the model\'s template and counts input tokens exactly', async () => {
    const prompt = await rt.renderChat(chat.messages);
    expect(prompt).toBe('<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n');
    const tokens = await rt.tokenize(prompt, { special: true });
    const n = await rt.countInputTokens(chat);
    expect(n).toBe(tokens.length + 1); // + BOS: the tiny model asks for it
    expect(await rt.detokenize(await rt.tokenize('hello world'))).toBe('hello world');
  });

  test('a message\'s name, tool calls and tool_call_id reach the chat template as sent (the template decides how they read)', async () => {
    const templated = path.join(dir, 'named.gguf');
    writeTinyLlama(templated, {
      chatTemplate: "{% for m in messages %}{{ m.role }}{% if m.name %}({{ m.name }}){% endif %}{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}:{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<call {{ c.id }} {{ c.function.name }} {{ c.function.arguments }}>{% endfor %}{% endif %};{% endfor %}",
    });
    const named = new LlamaEmbeddedAdapter({ modelPath: templated, slots: 1, contextLength: 256 });
    await named.start();
    try {
      const text = await named.renderChat([
        { role: 'user', name: 'alice', content: 'weather?' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: '42' },
      ]);
      expect(text).toBe('user(alice):weather?;assistant:<call c1 get_weather {"city":"Paris"}>;tool[c1]:42;');
    } finally {
      await named.stop();
    }
  });

  test('with atMost, an input too long by its length alone is refused before it is rendered or tokenised; one near the limit is counted', async () => {
    // (Tokenising 8 MiB holds the event loop for seconds here: the bound spares it.)
    const huge = 'hello world the quick brown fox '.repeat(256 * 1024);
    await expect(rt.inputTokens({ kind: 'prompt', prompt: huge }, { atMost: 512 })).rejects.toMatchObject({ code: 'context_length_exceeded', message: expect.stringMatching(/^an input of at least \d+ tokens \(8388608 bytes\) exceeds the model's context of 512$/) });
    await expect(rt.inputTokens({ kind: 'chat', messages: [{ role: 'user', content: huge }] }, { atMost: 512 })).rejects.toMatchObject({ code: 'context_length_exceeded' });
    // Just within the context, by its real count: counted, never refused by the bound.
    let text = '';
    while ((await rt.countInputTokens({ kind: 'prompt', prompt: text + 'hello world ' })) <= 512) text += 'hello world ';
    expect((await rt.inputTokens({ kind: 'prompt', prompt: text }, { atMost: 512 })).length).toBeLessThanOrEqual(512);
    expect((await rt.inputTokens({ kind: 'prompt', prompt: text + 'hello world ' }, { atMost: 512 })).length).toBeGreaterThan(512); // (counted, not refused: the bound is loose)
  });

  test('a fixed seed replays the same tokens; maxTokens is exact; usage adds up', async () => {
    const req: GenerateRequest = { input: chat, maxTokens: 24, sampling: { temperature: 0.8, seed: 42 } };
    const a = await run(req);
    const b = await run(req);
    const ids = (x: { chunks: GeneratedChunk[] }) => x.chunks.flatMap((c) => c.tokens);
    expect(ids(a)).toEqual(ids(b));
    expect(a.chunks.map((c) => c.text).join('')).toBe(b.chunks.map((c) => c.text).join(''));
    expect(a.result.outputTokens).toBe(ids(a).length);
    expect(a.result).toMatchObject({ finishReason: 'length', outputTokens: 24 });
    expect(a.result.inputTokens).toBe(await rt.countInputTokens(chat));
    expect(a.result.usageRuntime).toEqual({ prompt_tokens: a.result.inputTokens, completion_tokens: a.result.outputTokens, total_tokens: a.result.inputTokens + a.result.outputTokens });
    const other = await run({ ...req, sampling: { temperature: 1, seed: 7 } });
    const again = await run({ ...req, sampling: { temperature: 1, seed: 8 } });
    expect(ids(other)).not.toEqual(ids(again));
  });

  test('llama.cpp\'s samplers as asked: top_k 1 and min_p 1 are greedy at any temperature; a repeat penalty changes a seeded run, the same way every time', async () => {
    const ids = (x: { chunks: GeneratedChunk[] }) => x.chunks.flatMap((c) => c.tokens);
    const greedy = ids(await run({ input: chat, maxTokens: 24, sampling: { temperature: 0, seed: 0 } }));
    const sampled = ids(await run({ input: chat, maxTokens: 24, sampling: { temperature: 1.5, seed: 3 } }));
    expect(sampled).not.toEqual(greedy); // (so the two below are the samplers' doing)
    expect(ids(await run({ input: chat, maxTokens: 24, sampling: { temperature: 1.5, seed: 3, topK: 1 } }))).toEqual(greedy);
    expect(ids(await run({ input: chat, maxTokens: 24, sampling: { temperature: 1.5, seed: 3, minP: 1 } }))).toEqual(greedy);
    const penalised = { input: chat, maxTokens: 24, sampling: { temperature: 1.5, seed: 3, repeatPenalty: 1.8 } };
    const p1 = ids(await run(penalised));
    expect(p1).not.toEqual(sampled);
    expect(ids(await run(penalised))).toEqual(p1);
    expect(ids(await run({ ...penalised, sampling: { temperature: 1.5, seed: 3, repeatPenalty: 1 } }))).toEqual(sampled);
  });

  test('a generation does not depend on another running beside it (audit replay runs requests one at a time)', async () => {
    // Two slots decode in shared batches; each request must still get exactly the tokens it gets alone.
    const a: GenerateRequest = { input: chat, maxTokens: 40, sampling: { temperature: 1, seed: 3 } };
    const b: GenerateRequest = { input: { kind: 'chat', messages: [{ role: 'user', content: 'the quick brown fox' }] }, maxTokens: 40, sampling: { temperature: 0.7, seed: 11 } };
    const ids = (x: { chunks: GeneratedChunk[] }) => x.chunks.flatMap((c) => c.tokens);
    const aloneA = ids(await run(a));
    const aloneB = ids(await run(b));
    expect(aloneA).not.toEqual(aloneB);
    for (let round = 0; round < 3; round++) {
      const order: string[] = [];
      const [ta, tb] = await Promise.all([run(a, () => order.push('a')), run(b, () => order.push('b'))]);
      expect(ids(ta)).toEqual(aloneA);
      expect(ids(tb)).toEqual(aloneB);
      // The premise: the two really ran side by side (their chunks interleave), not one after the other.
      expect(order.indexOf('b')).toBeLessThan(order.lastIndexOf('a'));
      expect(order.indexOf('a')).toBeLessThan(order.lastIndexOf('b'));
    }
  });

  test('aborting stops generation promptly and still accounts for every token produced', async () => {
    const ac = new AbortController();
    const chunks: GeneratedChunk[] = [];
    const gen = rt.generate({ input: { kind: 'prompt', prompt: 'the' }, maxTokens: 400, sampling: { temperature: 1, seed: 3 }, signal: ac.signal });
    let result: GenerationResult | undefined;
    for (;;) {
      const n = await gen.next();
      if (n.done) {
        result = n.value;
        break;
      }
      chunks.push(n.value);
      if (chunks.length === 5) ac.abort();
    }
    expect(result).toMatchObject({ finishReason: 'abort', outputTokens: 5 });
    expect(chunks.flatMap((c) => c.tokens).length).toBe(result.outputTokens);
  });

  test('stop sequences: the text ends before the stop, even one that spans tokens; an unfinished stop is sent', async () => {
    const base: GenerateRequest = { input: chat, maxTokens: 12, sampling: { temperature: 0, seed: 1 } };
    const free = await run(base);
    const whole = free.chunks.map((c) => c.text).join('');
    expect(whole.startsWith('quee lit*')).toBe(true); // greedy: the same start every time
    // A stop that is exactly the second token.
    const at = await run({ ...base, stop: [' lit'] });
    expect(at.chunks.map((c) => c.text).join('')).toBe('quee');
    expect(at.result).toMatchObject({ finishReason: 'stop', outputTokens: 2 });
    expect(at.chunks.flatMap((c) => c.tokens).length).toBe(2);
    // A stop that begins inside the first token and ends in the second: no part of it is sent.
    const across = await run({ ...base, stop: ['ee li'] });
    expect(across.chunks.map((c) => c.text).join('')).toBe('qu');
    expect(across.result).toMatchObject({ finishReason: 'stop', outputTokens: 2 });
    // A stop that starts to match and then does not: the held text is sent, the answer is whole.
    const unfinished = await run({ ...base, stop: [' lit#'] });
    expect(unfinished.chunks.map((c) => c.text).join('')).toBe(whole);
    expect(unfinished.result).toMatchObject({ finishReason: 'length', outputTokens: 12 });
  });

  test('a token whose text is held back, wholly or in part, comes with the chunk that sends the end of its text: every token counted so far has all its text sent', async () => {
    const base: GenerateRequest = { input: chat, maxTokens: 12, sampling: { temperature: 0, seed: 1 } };
    // "quee" (the first token) ends in the start of "ee!": "qu" goes out at once, the token only with "ee".
    const partly = await run({ ...base, stop: ['ee!'] });
    const free = await run(base);
    const [first, second] = free.chunks.map((c) => c.tokens);
    expect(await rt.detokenize(first!)).toBe('quee'); // (the premise)
    expect(partly.chunks[0]).toEqual({ text: 'qu', tokens: [] });
    expect(partly.chunks[1]).toEqual({ text: 'ee lit', tokens: [...first!, ...second!] });
    expect(partly.chunks.flatMap((c) => c.tokens)).toEqual(free.chunks.flatMap((c) => c.tokens));
    // A stop inside "quee": "qu" is sent, and the token, whose text ends in the stop, comes after it with no text.
    const inside = await run({ ...base, stop: ['e'] });
    expect(inside.chunks).toEqual([{ text: 'qu', tokens: [] }, { text: '', tokens: first }]);
    expect(inside.result).toMatchObject({ finishReason: 'stop', outputTokens: 1 });
    // Over runs with partial characters and stops that start to match: at every chunk, the tokens
    // counted so far detokenize to a start of the text sent so far; the last chunk settles the rest.
    const long = await run({ input: { kind: 'prompt', prompt: 'hello' }, maxTokens: 120, sampling: { temperature: 1, seed: 0 } });
    const answer = long.chunks.map((c) => c.text).join('');
    const stops = [answer.slice(3, 5) + '\u0001', answer.slice(10, 13) + '\u0001', answer.slice(20, 21) + '\u0001'];
    let held = 0;
    for (const stop of [undefined, stops]) {
      const r = await run({ input: { kind: 'prompt', prompt: 'hello' }, maxTokens: 120, sampling: { temperature: 1, seed: 0 }, ...(stop ? { stop } : {}) });
      let text = '';
      const counted: number[] = [];
      for (const [i, c] of r.chunks.entries()) {
        text += c.text;
        counted.push(...c.tokens);
        if (i < r.chunks.length - 1) expect(text.startsWith(await rt.detokenize(counted))).toBe(true);
        if (i < r.chunks.length - 1 && (await rt.detokenize(counted)).length < text.length) held++;
      }
      expect(text).toBe(answer);
      expect(counted).toEqual(long.chunks.flatMap((c) => c.tokens));
      expect(r.result.outputTokens).toBe(counted.length);
    }
    // (The premise: some chunk really sent part of a token whose count came later.)
    expect(held).toBeGreaterThan(0);
  });

  test('nor does a token whose text was all sent wait for a later chunk: a byte that is no character\'s start counts with its U+FFFD, not with the text decoded after it', async () => {
    let finalBytes = 0;
    const runs: GenerateRequest[] = [
      // (greedy: "…y" then byte 0xBB, decoded only with " pu"; the "u" held for the stop)
      { input: { kind: 'prompt', prompt: 'hello' }, maxTokens: 60, sampling: { temperature: 0, seed: 0 }, stop: ['u\u0001'] },
      ...[0, 1, 2].map((seed) => ({ input: { kind: 'prompt' as const, prompt: 'hello' }, maxTokens: 120, sampling: { temperature: 1, seed }, stop: ['e\u0001', ' t\u0001'] })),
    ];
    for (const req of runs) {
      const r = await run(req);
      const flat = r.chunks.flatMap((c) => c.tokens);
      let text = '';
      let n = 0;
      for (const [i, c] of r.chunks.entries()) {
        text += c.text;
        n += c.tokens.length;
        if (i === r.chunks.length - 1 || n + 1 >= flat.length) continue;
        // The next token's text is final when what follows does not change it (a U+FFFD for good, not a character to come).
        const [before, upTo, after] = await Promise.all([rt.detokenize(flat.slice(0, n)), rt.detokenize(flat.slice(0, n + 1)), rt.detokenize(flat.slice(0, n + 2))]);
        if (upTo.endsWith('\uFFFD') && after.startsWith(upTo)) finalBytes++;
        const whollySent = upTo !== before && after.startsWith(upTo) && text.startsWith(upTo);
        expect(whollySent, `chunk ${i}: token ${n} (${JSON.stringify(upTo.slice(-6))}) was sent (${JSON.stringify(text.slice(-6))}) but not counted`).toBe(false);
      }
    }
    expect(finalBytes).toBeGreaterThan(0); // (the premise)
  });

  test('a run that ends in the middle of a character (its length reached) still sends that token\'s bytes, as U+FFFD: every billed token is in the text', async () => {
    const base: GenerateRequest = { input: { kind: 'prompt', prompt: 'hello' }, maxTokens: 200, sampling: { temperature: 1, seed: 0 } };
    const long = await run(base);
    const tokens = long.chunks.flatMap((c) => c.tokens);
    // The premise: some length k cuts the answer inside a character (byte tokens of the tiny vocabulary).
    const cuts: number[] = [];
    for (let k = 1; k <= tokens.length; k++) if ((await rt.detokenize(tokens.slice(0, k))).endsWith('\uFFFD')) cuts.push(k);
    expect(cuts.length).toBeGreaterThan(0);
    for (const k of cuts.slice(0, 3)) {
      const cut = await run({ ...base, maxTokens: k });
      expect(cut.result).toMatchObject({ finishReason: 'length', outputTokens: k });
      const text = cut.chunks.map((c) => c.text).join('');
      expect(text).toBe(await rt.detokenize(tokens.slice(0, k)));
      expect(text.endsWith('\uFFFD')).toBe(true);
      // One token more completes nothing already sent: the shorter answer is the longer one's start, up to the cut character.
      const next = (await run({ ...base, maxTokens: k + 1 })).chunks.map((c) => c.text).join('');
      expect(next.startsWith(text.slice(0, -1))).toBe(true);
    }
  });

  test('maxTokens 0 generates nothing; an aborted signal generates nothing', async () => {
    expect((await run({ input: chat, maxTokens: 0, sampling: { temperature: 0, seed: 1 } })).result).toMatchObject({ outputTokens: 0, finishReason: 'length' });
    const ac = new AbortController();
    ac.abort();
    expect((await run({ input: chat, maxTokens: 10, sampling: { temperature: 0, seed: 1 }, signal: ac.signal })).result).toMatchObject({ outputTokens: 0, finishReason: 'abort' });
  });

  test('slots bound concurrency: a third concurrent generation is refused, and slots come back', async () => {
    const req: GenerateRequest = { input: chat, maxTokens: 8, sampling: { temperature: 0, seed: 1 } };
    const g1 = rt.generate(req);
    const g2 = rt.generate(req);
    await g1.next();
    await g2.next();
    await expect(rt.generate(req).next()).rejects.toThrow(/no free slot/);
    await g1.return(undefined as never);
    await g2.return(undefined as never);
    expect((await run(req)).result.outputTokens).toBeGreaterThan(0);
  });

  test('each slot gets the configured context, so the KV cache is slots × context, not slots² × context', () => {
    // node-llama-cpp sizes a context per sequence; this reads its own figure (no public figure of ours says it).
    const context = (rt as unknown as { context: { contextSize: number; totalSequences: number } }).context;
    expect([context.contextSize, context.totalSequences]).toEqual([512, 2]);
    expect(rt.info.contextLength).toBe(512);
  });

  test('embeddings: one vector of the model\'s width per input, tokens counted', async () => {
    const e = await rt.embed(['hello', 'hello world']);
    expect(e.vectors.map((v) => v.length)).toEqual([64, 64]);
    expect(e.inputTokens).toBe((await rt.countInputTokens({ kind: 'prompt', prompt: 'hello' })) + (await rt.countInputTokens({ kind: 'prompt', prompt: 'hello world' })));
  });

  test('embeddings stop at the next input once the signal is aborted, and count only the inputs embedded', async () => {
    const inputs = ['hello', 'hello world', 'world', 'hello hello'];
    const aborted = new AbortController();
    aborted.abort();
    expect(await rt.embed(inputs, undefined, aborted.signal)).toEqual({ vectors: [], inputTokens: 0 });
    // Aborted while the second input is embedded: that one finishes, the rest are never started.
    const whole = await rt.embed(inputs);
    const ac = new AbortController();
    const inner = rt as unknown as { embedding: Promise<{ getEmbeddingFor(t: unknown): Promise<unknown> }> };
    const real = await inner.embedding;
    let calls = 0;
    inner.embedding = Promise.resolve({ getEmbeddingFor: (t: unknown) => (++calls === 2 && ac.abort(), real.getEmbeddingFor(t)) });
    try {
      const part = await rt.embed(inputs, undefined, ac.signal);
      expect(calls).toBe(2);
      expect(part.vectors).toEqual(whole.vectors.slice(0, 2));
      expect(part.inputTokens).toBe((await rt.countInputTokens({ kind: 'prompt', prompt: 'hello' })) + (await rt.countInputTokens({ kind: 'prompt', prompt: 'hello world' })));
    } finally {
      inner.embedding = Promise.resolve(real);
    }
  });
});

// Freeing the embedding context under an embedding crashed the process (SIGSEGV in every run of
// a probe: the node stops its runtimes while a cancelled embeddings request may still be on its
// current input). A stop now lets each embedding finish the input it is on; the batch then fails.
test('a stop during an embeddings batch: the batch fails saying so, as does one asked for during the stop; the process lives, and the adapter starts again', async () => {
  const a = new LlamaEmbeddedAdapter({ modelPath, contextLength: 256 });
  for (let i = 0; i < 4; i++) {
    await a.start();
    expect((await a.embed(['warm'])).vectors).toHaveLength(1);
    const batch = a.embed(Array.from({ length: 200 }, (_, k) => `hello world ${k}`)).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    await new Promise((r) => setTimeout(r, i % 2));
    await a.stop();
    expect((await batch)?.message).toBe('the embedded runtime was stopped before the inputs were embedded');
  }
  // One asked for while the stop frees the model (none under way: the stop goes straight to it) opens nothing on it.
  await a.start();
  expect((await a.embed(['warm'])).vectors).toHaveLength(1);
  const stopping = a.stop();
  await expect(a.embed(['late'])).rejects.toThrow('the embedded runtime was stopped before the inputs were embedded');
  await stopping;
  await a.start();
  expect((await a.embed(['hello', 'world'])).vectors).toHaveLength(2);
  await a.stop();
});
