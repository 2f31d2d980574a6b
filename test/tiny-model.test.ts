import { execFile } from 'node:child_process';
import crypto from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import {
  ChatMLChatWrapper,
  getLlama,
  LlamaLogLevel,
  LlamaVocabularyType,
  readGgufFileInfo,
  resolveChatWrapper,
  type ChatHistoryItem,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaModel,
  type Token,
} from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { bool, f32, f32Arr, GGUF_TYPE, i32, i32Arr, kv, str, strArr, u32, u64, writeGguf, writeGgufFile } from '../adapters/gguf/gguf-writer.ts';
import {
  buildTinyLlama,
  SPACE_MARKER,
  TINY_LLAMA_CHAT_TEMPLATE,
  TINY_LLAMA_CONFIG,
  TINY_LLAMA_NAME,
  TINY_LLAMA_TOKENS,
  tinyLlamaVocab,
  writeTinyLlama,
} from '../adapters/gguf/tiny-llama.ts';

const execFileP = promisify(execFile);
const nodeLlamaCppUrl = pathToFileURL(createRequire(import.meta.url).resolve('node-llama-cpp')).href;
const sha256 = (b: Uint8Array): string => crypto.createHash('sha256').update(b).digest('hex');

const vocab = tinyLlamaVocab();
const pieceId = (piece: string): number => {
  const id = vocab.tokens.indexOf(piece);
  if (id < 0) throw new Error(`no piece ${piece}`);
  return id;
};
const byteId = (b: number): number => TINY_LLAMA_TOKENS.byte0 + b;

const N_GEN = 32;
const PROMPT = 'hello world';

/** Generation exactly as the child process below does it: prompt = BOS + text, N_GEN tokens, EOG tokens kept. */
async function generate(seq: LlamaContextSequence, model: LlamaModel, opts: { temperature: number; seed?: number }): Promise<number[]> {
  await seq.clearHistory();
  const prompt: Token[] = [model.tokens.bos as Token, ...model.tokenize(PROMPT)];
  const out: number[] = [];
  for await (const token of seq.evaluate(prompt, { ...opts, yieldEogToken: true })) {
    out.push(token);
    if (out.length >= N_GEN) break;
  }
  return out;
}

// Runs in a fresh `node`, from a file: node-llama-cpp's binary self-test forks with
// process.execArgv, which breaks under `node --input-type=module -e`.
const CHILD_SCRIPT = `
import { getLlama, LlamaLogLevel } from ${JSON.stringify(nodeLlamaCppUrl)};
const { file, prompt, n, temperature, seed } = JSON.parse(process.argv[process.argv.length - 1]);
const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: file });
const ctx = await model.createContext({ threads: 1, contextSize: 256 });
const seq = ctx.getSequence();
const out = [];
for await (const token of seq.evaluate([model.tokens.bos, ...model.tokenize(prompt)], { temperature, seed, yieldEogToken: true })) {
  out.push(token);
  if (out.length >= n) break;
}
await ctx.dispose();
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out));
`;

describe('GGUF writer', () => {
  test('header, typed KVs and aligned tensor data are laid out as GGUF v3 says', () => {
    const data = Float32Array.from([1.5, -2, 3.25]);
    const bytes = writeGguf({
      metadata: [kv('general.architecture', str('llama')), kv('x.n', u32(7))],
      tensors: [
        { name: 'a', dims: [3], data },
        { name: 'b', dims: [1, 2], data: Float32Array.from([9, 10]) },
      ],
    });
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    expect(Buffer.from(bytes.subarray(0, 4)).toString('latin1')).toBe('GGUF');
    expect(dv.getUint32(4, true)).toBe(3);
    expect(dv.getBigUint64(8, true)).toBe(2n); // tensors
    expect(dv.getBigUint64(16, true)).toBe(3n); // kvs: + general.alignment
    // first KV: key "general.architecture", type STRING, "llama"
    expect(dv.getBigUint64(24, true)).toBe(20n);
    expect(Buffer.from(bytes.subarray(32, 52)).toString()).toBe('general.architecture');
    expect(dv.getUint32(52, true)).toBe(GGUF_TYPE.STRING);
    // second KV is the inserted alignment
    let o = 52 + 4 + 8 + 5;
    expect(dv.getBigUint64(o, true)).toBe(17n);
    expect(Buffer.from(bytes.subarray(o + 8, o + 25)).toString()).toBe('general.alignment');
    expect(dv.getUint32(o + 25, true)).toBe(GGUF_TYPE.UINT32);
    expect(dv.getUint32(o + 29, true)).toBe(32);
    // data section: 32-aligned, "a" at 0 (12 bytes padded to 32), "b" at 32, file padded to 32
    expect(bytes.length % 32).toBe(0);
    const dataStart = bytes.length - 64;
    o = dataStart;
    expect([dv.getFloat32(o, true), dv.getFloat32(o + 4, true), dv.getFloat32(o + 8, true)]).toEqual([1.5, -2, 3.25]);
    expect(dv.getFloat32(dataStart + 32, true)).toBe(9);
    expect(dv.getFloat32(dataStart + 36, true)).toBe(10);
  });

  test('every value type reads back through an independent GGUF parser', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'gguf-writer-'));
    try {
      const file = path.join(dir, 'kv.gguf');
      writeGgufFile(file, {
        metadata: [
          kv('general.architecture', str('llama')),
          kv('t.u32', u32(4_000_000_000)),
          kv('t.i32', i32(-7)),
          kv('t.f32', f32(0.5)),
          kv('t.bool', bool(true)),
          kv('t.str', str('héllo ▁ 😀')),
          kv('t.u64', u64(2n ** 40n + 3n)),
          kv('t.strs', strArr(['a', '', 'ü'])),
          kv('t.f32s', f32Arr([1.25, -0.5])),
          kv('t.i32s', i32Arr([-1, 0, 2_000_000_000])),
        ],
        tensors: [{ name: 'w', dims: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) }],
        alignment: 64,
      });
      const info = await readGgufFileInfo(file, { logWarnings: false });
      const t = (info.metadata as unknown as { t: Record<string, unknown> }).t;
      expect(info.version).toBe(3);
      expect(info.metadata.general.alignment).toBe(64);
      expect(t).toEqual({
        u32: 4_000_000_000,
        i32: -7,
        f32: 0.5,
        bool: true,
        str: 'héllo ▁ 😀',
        u64: 2n ** 40n + 3n,
        strs: ['a', '', 'ü'],
        f32s: [1.25, -0.5],
        i32s: [-1, 0, 2_000_000_000],
      });
      expect(info.tensorInfo?.[0]).toMatchObject({ name: 'w', dimensions: [2, 3], ggmlType: 0, offset: 0 });
      expect(Number(info.tensorInfo?.[0]?.fileOffset) % 64).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('rejects inconsistent input', () => {
    expect(() => writeGguf({ metadata: [], tensors: [{ name: 'a', dims: [2, 2], data: new Float32Array(3) }] })).toThrow(/need 4/);
    expect(() => writeGguf({ metadata: [kv('k', u32(1)), kv('k', u32(2))], tensors: [] })).toThrow(/duplicate/);
    expect(() => writeGguf({ metadata: [kv('general.alignment', u32(64))], tensors: [] })).toThrow(/alignment/);
    expect(() => writeGguf({ metadata: [], tensors: [], alignment: 24 })).toThrow(/power of two/);
  });
});

describe('tiny llama model (real llama.cpp via node-llama-cpp)', () => {
  let dir: string;
  let file: string;
  let llama: Llama;
  let model: LlamaModel;
  let ctx: LlamaContext;
  let seq: LlamaContextSequence;
  let loadMs = 0;

  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'tiny-llama-'));
    file = path.join(dir, 'tiny.gguf');
    writeTinyLlama(file);
    llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
    const t0 = performance.now();
    model = await llama.loadModel({ modelPath: file });
    loadMs = performance.now() - t0;
    ctx = await model.createContext({ threads: 1, contextSize: 256 });
    seq = ctx.getSequence();
  });

  afterAll(async () => {
    await ctx?.dispose();
    await model?.dispose();
    await llama?.dispose();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the build is byte-for-byte deterministic, seed-dependent and about 1 MB', () => {
    const a = buildTinyLlama();
    const b = buildTinyLlama();
    expect(sha256(a)).toBe(sha256(b));
    expect(sha256(readFileSync(file))).toBe(sha256(a));
    expect(sha256(buildTinyLlama({ seed: 2 }))).not.toBe(sha256(a));
    expect(sha256(buildTinyLlama({ seed: 1 }))).toBe(sha256(a));
    const size = statSync(file).size;
    expect(size).toBeGreaterThan(800_000);
    expect(size).toBeLessThan(1_300_000);
  });

  test('the file parses as GGUF v3 with llama hyperparameters and 32-byte aligned tensors', async () => {
    const info = await readGgufFileInfo(file, { logWarnings: false });
    expect(info.version).toBe(3);
    expect(info.tensorCount).toBe(3 + 9 * TINY_LLAMA_CONFIG.blockCount);
    const md = info.metadata;
    expect(md.general.architecture).toBe('llama');
    expect(md.general.name).toBe(TINY_LLAMA_NAME);
    expect(md.general.alignment).toBe(32);
    expect(md.general.file_type).toBe(0);
    const arch = (md as unknown as { llama: Record<string, unknown> }).llama;
    expect(arch).toMatchObject({
      context_length: 2048,
      embedding_length: 64,
      block_count: 2,
      feed_forward_length: 128,
      rope: { dimension_count: 16, freq_base: 10000 },
      attention: { head_count: 4, head_count_kv: 4 },
    });
    expect(md.tokenizer.ggml.model).toBe('llama');
    expect(md.tokenizer.ggml.tokens.length).toBe(vocab.tokens.length);
    const tensors = info.tensorInfo ?? [];
    const names = tensors.map((t) => t.name);
    expect(names.slice(0, 3)).toEqual(['token_embd.weight', 'output_norm.weight', 'output.weight']);
    expect(names).toContain('blk.1.ffn_down.weight');
    for (const t of tensors) {
      expect(t.ggmlType).toBe(0);
      expect(Number(t.offset) % 32).toBe(0);
      expect(Number(t.fileOffset) % 32).toBe(0);
    }
    const dims = (name: string): number[] => (tensors.find((t) => t.name === name)?.dimensions ?? []).map(Number);
    expect(dims('token_embd.weight')).toEqual([64, vocab.tokens.length]);
    expect(dims('blk.0.attn_q.weight')).toEqual([64, 64]);
    expect(dims('blk.0.ffn_up.weight')).toEqual([64, 128]);
    expect(dims('blk.0.ffn_down.weight')).toEqual([128, 64]);

    const other = path.join(dir, 'ctx512.gguf');
    writeTinyLlama(other, { contextLength: 512 });
    const otherInfo = await readGgufFileInfo(other, { logWarnings: false, readTensorInfo: false });
    expect((otherInfo.metadata as unknown as { llama: { context_length: number } }).llama.context_length).toBe(512);
  });

  test('llama.cpp loads it, quickly, with the expected shape and special tokens', () => {
    console.log(`tiny llama: ${statSync(file).size} bytes, loaded in ${loadMs.toFixed(1)} ms`);
    expect(loadMs).toBeLessThan(5_000);
    expect(model.architecture).toBe('llama');
    expect(model.vocabularyType).toBe(LlamaVocabularyType.spm);
    expect(model.trainContextSize).toBe(2048);
    expect(model.embeddingVectorSize).toBe(64);
    expect(model.tokens.bos).toBe(TINY_LLAMA_TOKENS.bos);
    expect(model.tokens.eos).toBe(TINY_LLAMA_TOKENS.eos);
    expect(model.tokens.eot).toBe(TINY_LLAMA_TOKENS.imEnd);
    expect(model.tokens.shouldPrependBosToken).toBe(true);
    expect(model.isEogToken(TINY_LLAMA_TOKENS.imEnd as Token)).toBe(true);
    expect(model.isEogToken(TINY_LLAMA_TOKENS.eos as Token)).toBe(true);
    expect(model.isEogToken(TINY_LLAMA_TOKENS.imStart as Token)).toBe(false);
    expect(model.getWarnings()).toEqual([]);
    expect(ctx.contextSize).toBeGreaterThanOrEqual(256);
  });

  test('known words tokenize to one token each and round-trip', () => {
    const tokens = model.tokenize('hello world');
    expect(tokens).toEqual([pieceId(`${SPACE_MARKER}hello`), pieceId(`${SPACE_MARKER}world`)]);
    expect(model.detokenize(tokens)).toBe('hello world');
    const sentence = 'the quick brown fox jumps over the lazy dog';
    const st = model.tokenize(sentence);
    expect(st).toEqual(sentence.split(' ').map((w) => pieceId(SPACE_MARKER + w)));
    expect(model.detokenize(st)).toBe(sentence);
  });

  test('unknown words fall back to characters, non-ASCII to byte tokens, and still round-trip', () => {
    const unknown = model.tokenize('xyzzy');
    expect(unknown.length).toBeGreaterThanOrEqual(5);
    for (const t of unknown) expect([...(vocab.tokens[t] ?? 'missing')].length).toBeLessThanOrEqual(2);
    expect(model.detokenize(unknown)).toBe('xyzzy');

    const cafe = model.tokenize('café');
    const e = cafe.indexOf(byteId(0xc3) as Token);
    expect(e).toBeGreaterThan(0);
    expect(cafe[e + 1]).toBe(byteId(0xa9));
    expect(model.getTokenAttributes(cafe[e] as Token).byte).toBe(true);
    expect(model.detokenize(cafe)).toBe('café');

    const emoji = model.tokenize('😀');
    expect(emoji.slice(-4)).toEqual([0xf0, 0x9f, 0x98, 0x80].map(byteId));
    expect(model.detokenize(emoji)).toBe('😀');

    const mixed = 'hello café 😀, Zürich\nworld!';
    expect(model.detokenize(model.tokenize(mixed))).toBe(mixed);
  });

  test('ChatML control tokens are single tokens only when special-token parsing is on', () => {
    expect(model.tokenize('<|im_start|>', true)).toEqual([TINY_LLAMA_TOKENS.imStart]);
    expect(model.tokenize('<|im_end|>', true)).toEqual([TINY_LLAMA_TOKENS.imEnd]);
    const plain = model.tokenize('<|im_start|>');
    expect(plain.length).toBeGreaterThan(1);
    expect(plain).not.toContain(TINY_LLAMA_TOKENS.imStart);
    expect(model.detokenize([TINY_LLAMA_TOKENS.imStart as Token], true)).toBe('<|im_start|>');
    expect(model.isSpecialToken(TINY_LLAMA_TOKENS.imStart as Token)).toBe(true);
  });

  test('the chat template is read from the file and resolves to ChatML', () => {
    expect(model.fileInfo.metadata.tokenizer.chat_template).toBe(TINY_LLAMA_CHAT_TEMPLATE);
    const wrapper = resolveChatWrapper(model);
    expect(wrapper).toBeInstanceOf(ChatMLChatWrapper);
    const history: ChatHistoryItem[] = [
      { type: 'user', text: 'hi' },
      { type: 'model', response: [] },
    ];
    const text = wrapper.generateContextState({ chatHistory: history }).contextText.toString();
    expect(text).toContain('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
  });

  test('sampling with a fixed seed is deterministic in-process; greedy too; the seed matters', async () => {
    const t0 = performance.now();
    const a = await generate(seq, model, { temperature: 0.8, seed: 42 });
    const ms = performance.now() - t0;
    console.log(`tiny llama: ${N_GEN} tokens in ${ms.toFixed(1)} ms (${((N_GEN * 1000) / ms).toFixed(0)} tokens/s, threads: 1)`);
    const b = await generate(seq, model, { temperature: 0.8, seed: 42 });
    expect(a).toHaveLength(N_GEN);
    expect(b).toEqual(a);
    expect(new Set(a).size).toBeGreaterThan(4); // actually sampling, not stuck on one token

    const g1 = await generate(seq, model, { temperature: 0, seed: 1 });
    const g2 = await generate(seq, model, { temperature: 0, seed: 2 });
    expect(g1).toHaveLength(N_GEN);
    expect(g2).toEqual(g1);

    const s1 = await generate(seq, model, { temperature: 1, seed: 1 });
    const s2 = await generate(seq, model, { temperature: 1, seed: 2 });
    expect(s1).toHaveLength(N_GEN);
    expect(s2).toHaveLength(N_GEN);
    expect(s2).not.toEqual(s1);
    expect(s1).not.toEqual(g1);
    expect(ms).toBeLessThan(10_000);
  });

  test('a second process generates the same token ids (audit replay)', async () => {
    const opts = { temperature: 0.8, seed: 42 };
    const here = await generate(seq, model, opts);
    const script = path.join(dir, 'replay.mjs');
    writeFileSync(script, CHILD_SCRIPT);
    const { stdout } = await execFileP(process.execPath, [script, JSON.stringify({ file, prompt: PROMPT, n: N_GEN, ...opts })], {
      timeout: 50_000,
    });
    const there = JSON.parse(stdout) as number[];
    expect(there).toHaveLength(N_GEN);
    expect(there).toEqual(here);
  });

  test('an embedding context returns 64-dimensional, deterministic, input-dependent vectors', async () => {
    const ectx = await model.createEmbeddingContext({ threads: 1, contextSize: 256 });
    try {
      const a = await ectx.getEmbeddingFor('hello world');
      const b = await ectx.getEmbeddingFor('hello world');
      const c = await ectx.getEmbeddingFor('the lazy dog');
      expect(a.vector).toHaveLength(64);
      expect(a.vector.every(Number.isFinite)).toBe(true);
      expect(a.vector.some((x) => x !== 0)).toBe(true);
      expect([...b.vector]).toEqual([...a.vector]);
      expect([...c.vector]).not.toEqual([...a.vector]);
    } finally {
      await ectx.dispose();
    }
  });
});
