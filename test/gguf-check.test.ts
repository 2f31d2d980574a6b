// The GGUF header check the embedded adapter runs before node-llama-cpp reads a model file: a file
// that is not a model, or claims more entries than it holds, is refused at once with a message
// naming the file, where node-llama-cpp would hang on some of them.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { checkGgufFile, GgufFileError } from '../adapters/gguf/gguf-check.ts';
import { f32, f32Arr, i32Arr, kv, str, strArr, u32, type GgufKv } from '../adapters/gguf/gguf-writer.ts';
import { tinyLlamaVocab, writeTinyLlama, type TinyLlamaOptions } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gguf-header-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const file = (name: string, bytes: Uint8Array | string) => {
  const f = path.join(dir, name);
  fs.writeFileSync(f, bytes);
  return f;
};
function header(version: number, tensors: bigint, kvs: bigint, rest = 0): Buffer {
  const b = Buffer.alloc(24 + rest);
  b.write('GGUF', 0, 'latin1');
  b.writeUInt32LE(version, 4);
  b.writeBigUInt64LE(tensors, 8);
  b.writeBigUInt64LE(kvs, 16);
  return b;
}

describe('checkGgufFile', () => {
  test('passes a real model and reports its counts', () => {
    const f = path.join(dir, 'tiny.gguf');
    writeTinyLlama(f);
    const h = checkGgufFile(f);
    expect(h.version).toBe(3);
    expect(h.tensors).toBeGreaterThan(0n);
    expect(h.kvs).toBeGreaterThan(0n);
  });

  test.each([
    ['text.gguf', 'hello, this is a web page, not a model\n', /text\.gguf is not a GGUF model file \(it starts with "hell", not "GGUF"\)/],
    ['empty.gguf', '', /empty\.gguf is empty \(0 bytes\), not a GGUF model file/],
    ['short.gguf', 'GGUF\x03\x00', /short\.gguf is a truncated GGUF file \(6 bytes, shorter than its 24-byte header\)/],
    ['v9.gguf', header(9, 1n, 1n, 64), /v9\.gguf: GGUF version 9 is not supported \(2 or 3\)/],
    ['counts.gguf', header(3, 1000n, 2n, 64), /counts\.gguf: its GGUF header claims 1000 tensors and 2 metadata entries, more than its 88 bytes can hold/],
    ['huge.gguf', header(3, 0n, 2n ** 63n, 0), /claims 0 tensors and 9223372036854775808 metadata entries/],
  ])('refuses %s', (name, bytes, message) => {
    const f = file(name, bytes);
    expect(() => checkGgufFile(f)).toThrow(GgufFileError);
    expect(() => checkGgufFile(f)).toThrow(message);
  });

  test('a missing file is the file system error', () => {
    expect(() => checkGgufFile(path.join(dir, 'nope.gguf'))).toThrow(/ENOENT/);
  });

  test('a folder, a FIFO, a socket and a device are refused as not model files, at once (a FIFO is never waited on)', async () => {
    const folder = path.join(dir, 'folder.gguf');
    fs.mkdirSync(folder);
    expect(() => checkGgufFile(folder)).toThrow(`${folder} is a folder, not a model file`);
    const fifo = path.join(dir, 'fifo.gguf');
    execFileSync('mkfifo', [fifo]);
    expect(() => checkGgufFile(fifo)).toThrow(`${fifo} is not a regular file (a FIFO), not a model file`);
    expect(() => checkGgufFile('/dev/zero')).toThrow('/dev/zero is not a regular file (a device), not a model file');
    const socket = path.join(dir, 'socket.gguf');
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(socket, r));
    try {
      expect(() => checkGgufFile(socket)).toThrow(`${socket} is not a regular file (a socket), not a model file`);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  // This file hung node-llama-cpp's metadata reader (the start never returned).
  test('the embedded adapter refuses a 15-byte file starting "GGUF" at once', async () => {
    const f = file('not-really.gguf', 'GGUF not really');
    const a = new LlamaEmbeddedAdapter({ modelPath: f, contextLength: 256 });
    await expect(a.start()).rejects.toThrow(/not-really\.gguf is a truncated GGUF file \(15 bytes/);
    // Nothing was loaded: the adapter can start on a good model afterwards.
    const good = path.join(dir, 'good.gguf');
    writeTinyLlama(good);
    const b = new LlamaEmbeddedAdapter({ modelPath: good, contextLength: 256 });
    await b.start();
    await b.stop();
  }, 20_000);
});

/** The tiny model with one field changed: the field found after `key` (its UTF-8 bytes) at `after` bytes past it. */
function corrupted(name: string, key: string, after: number, write: (b: Buffer, at: number) => void): string {
  const f = path.join(dir, 'source.gguf');
  writeTinyLlama(f);
  const b = fs.readFileSync(f);
  const at = b.indexOf(Buffer.from(key, 'utf8'));
  if (at < 0) throw new Error(`no ${key} in the tiny model`);
  write(b, at + Buffer.byteLength(key) + after);
  return file(name, b);
}

// Each of these hung node-llama-cpp's reader (memory growing without end) or aborted the process
// (SIGABRT in fs.read, or a GGML_ASSERT in llama.cpp) before the check (session 17's fuzzing).
describe('checkGgufFile: the metadata and tensor table, bounded before any reader sees them', () => {
  test.each([
    // key, then u32 type 9 (array), then the element type
    ['nested-array.gguf', 'tokenizer.ggml.tokens', 4, (b: Buffer, at: number) => b.writeUInt32LE(9, at), /metadata entry \d+ \("tokenizer\.ggml\.tokens"\): an array of arrays, which GGUF does not have/],
    ['array-2p40.gguf', 'tokenizer.ggml.tokens', 8, (b: Buffer, at: number) => b.writeBigUInt64LE(2n ** 40n, at), /"tokenizer\.ggml\.tokens"\): its array length is 1099511627776, more than the file can hold/],
    ['elem-type.gguf', 'tokenizer.ggml.tokens', 4, (b: Buffer, at: number) => b.writeUInt32LE(77, at), /array element type 77 is not a GGUF type/],
    // key, then its value type
    ['value-type.gguf', 'general.architecture', 0, (b: Buffer, at: number) => b.writeUInt32LE(7169, at), /"general\.architecture"\): value type 7169 is not a GGUF type/],
    // key, then u32 type, then the u32 value
    ['blocks-0.gguf', 'llama.block_count', 4, (b: Buffer, at: number) => b.writeUInt32LE(0, at), /llama\.block_count is 0 \(1 to 512\)/],
    ['heads-0.gguf', 'llama.attention.head_count', 4, (b: Buffer, at: number) => b.writeUInt32LE(0, at), /llama\.attention\.head_count is 0/],
    ['kv-heads-0.gguf', 'llama.attention.head_count_kv', 4, (b: Buffer, at: number) => b.writeUInt32LE(0, at), /llama\.attention\.head_count_kv is 0/],
    ['ffn-0.gguf', 'llama.feed_forward_length', 4, (b: Buffer, at: number) => b.writeUInt32LE(0, at), /llama\.feed_forward_length is 0/],
    ['ctx-2.gguf', 'llama.context_length', 4, (b: Buffer, at: number) => b.writeUInt32LE(2, at), /llama\.context_length is 2 \(16 to/],
    // float32 values: 0 and NaN (rope.freq_base 0 made a model that answered nothing, billed)
    ['rope-0.gguf', 'llama.rope.freq_base', 4, (b: Buffer, at: number) => b.writeFloatLE(0, at), /llama\.rope\.freq_base is 0 \(a positive number\)/],
    ['eps-nan.gguf', 'llama.attention.layer_norm_rms_epsilon', 4, (b: Buffer, at: number) => b.writeFloatLE(Number.NaN, at), /llama\.attention\.layer_norm_rms_epsilon is NaN/],
    // a tensor's name, then its u32 number of dimensions, then the dimensions
    ['ndims.gguf', 'blk.1.ffn_gate.weight', 0, (b: Buffer, at: number) => b.writeUInt32LE(0xffffffff, at), /tensor \d+ \("blk\.1\.ffn_gate\.weight"\): 4294967295 dimensions \(1 to 4\)/],
    ['dim-0.gguf', 'blk.1.ffn_gate.weight', 4, (b: Buffer, at: number) => b.writeBigInt64LE(0n, at), /"blk\.1\.ffn_gate\.weight"\): dimension 0 is 0/],
    // the u64 length in front of a key or a string value
    ['keylen.gguf', 'general.architecture', -'general.architecture'.length - 8, (b: Buffer, at: number) => b.writeBigUInt64LE(2n ** 31n, at), /metadata entry \d+: the length of its key is 2147483648, more than the file can hold/],
    ['strlen.gguf', 'general.architecture', 4, (b: Buffer, at: number) => b.writeBigUInt64LE(10n ** 9n, at), /"general\.architecture"\): the length of its string value is 1000000000, more than the file can hold/],
  ])('%s is refused naming the field, and the runtime refuses it at once', async (name, key, after, write, message) => {
    const f = corrupted(name, key, after, write);
    expect(() => checkGgufFile(f)).toThrow(GgufFileError);
    expect(() => checkGgufFile(f)).toThrow(message);
    const a = new LlamaEmbeddedAdapter({ modelPath: f, contextLength: 256 });
    await expect(a.start()).rejects.toThrow(message);
  });

  test('the whole tiny model passes, its architecture read', () => {
    const f = path.join(dir, 'whole.gguf');
    writeTinyLlama(f);
    expect(checkGgufFile(f)).toMatchObject({ version: 3, architecture: 'llama' });
  });
});

describe('the GGUF writer', () => {
  test('arrays larger than its first buffer (64 KiB) are written whole, and the file checks', async () => {
    const { writeGguf } = await import('../adapters/gguf/gguf-writer.ts');
    const ints = Array.from({ length: 40_000 }, (_, i) => i); // 160 KB of int32
    const bytes = writeGguf({ metadata: [{ key: 'test.ints', value: { type: 'int32[]', value: ints } }, { key: 'test.after', value: { type: 'uint32', value: 7 } }], tensors: [{ name: 't', dims: [4], data: new Float32Array(4) }] });
    const f = file('big-array.gguf', bytes);
    expect(checkGgufFile(f)).toMatchObject({ version: 3, tensors: 1 });
    const b = Buffer.from(bytes);
    const at = b.indexOf(Buffer.from('test.ints')) + 'test.ints'.length + 4 + 4 + 8; // type, element type, count
    expect(b.readInt32LE(at + 4 * 39_999)).toBe(39_999);
  });
});

test('a node on a corrupt model names the model and the file once, with the entry at fault', async () => {
  const { parseConfig } = await import('../src/config.ts');
  const { startNode } = await import('../src/node.ts');
  const { createKeyFile } = await import('../src/identity.ts');
  const { tinyNodeConfigYaml } = await import('./helpers/node-config.ts');
  const home = fs.mkdtempSync(path.join(dir, 'node-'));
  createKeyFile(path.join(home, 'node.key'));
  fs.copyFileSync(corrupted('for-node.gguf', 'llama.block_count', 4, (b, at) => b.writeUInt32LE(0, at)), path.join(home, 'tiny.gguf'));
  const e = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: '11'.repeat(32) }), home)).then(() => undefined, (err: unknown) => err as Error);
  expect(e?.message).toMatch(/^models: tiny\/llama: the runtime could not start: model file \/\S+\/tiny\.gguf: llama\.block_count is 0 \(1 to 512\): a corrupt file$/);
}, 30_000);

/** The tiny model with a change made before it is written (buildTinyLlama's edit). */
function edited(name: string, edit: NonNullable<TinyLlamaOptions['edit']>): string {
  const f = path.join(dir, name);
  writeTinyLlama(f, { edit });
  return f;
}
const setKv = (m: { metadata: GgufKv[] }, key: string, value: GgufKv['value']) => {
  const i = m.metadata.findIndex((e) => e.key === key);
  if (i >= 0) m.metadata[i] = kv(key, value);
  else m.metadata.push(kv(key, value));
};
const dropKv = (m: { metadata: GgufKv[] }, key: string) => m.metadata.splice(m.metadata.findIndex((e) => e.key === key), 1);
/** The tiny model's keys under another architecture's name. */
const asArch = (m: { metadata: GgufKv[] }, arch: string) => m.metadata.forEach((e, i) => (m.metadata[i] = kv(e.key.replace(/^llama\./, `${arch}.`), e.key === 'general.architecture' ? str(arch) : e.value)));
/** Sets token `i`'s text (and, when given, its type) in the tiny vocabulary. */
const retoken = (i: number, text: string, type?: number) => (m: { metadata: GgufKv[] }) => {
  const v = tinyLlamaVocab();
  const tokens = [...v.tokens];
  tokens[i] = text;
  setKv(m, 'tokenizer.ggml.tokens', strArr(tokens));
  if (type !== undefined) setKv(m, 'tokenizer.ggml.token_type', i32Arr(v.types.map((t, j) => (j === i ? type : t))));
};

// Each of these aborted the whole process inside llama.cpp (GGML_ASSERT, an uncaught C++
// exception, a bad pointer) at load or at the first request whose text reached the flaw, in
// session 17's fuzzing; the rules are read from the llama.cpp source node-llama-cpp bundles.
describe('checkGgufFile: what llama.cpp would abort on, refused first', () => {
  test.each<[string, NonNullable<TinyLlamaOptions['edit']>, RegExp]>([
    ['align-16.gguf', (m) => (m.alignment = 16), /general\.alignment is 16: llama\.cpp needs tensor data aligned to 32 bytes/],
    ['experts-unused.gguf', (m) => setKv(m, 'llama.expert_count', u32(2)), /llama\.expert_count is 2 but llama\.expert_used_count is 0 \(at least 1 with experts\)/],
    ['used-no-experts.gguf', (m) => setKv(m, 'llama.expert_used_count', u32(1)), /llama\.expert_used_count is 1, more than llama\.expert_count \(0\)/],
    ['experts-2000.gguf', (m) => (setKv(m, 'llama.expert_count', u32(2000)), setKv(m, 'llama.expert_used_count', u32(2))), /llama\.expert_count is 2000 \(at most 1024\)/],
    ['value-length-0.gguf', (m) => setKv(m, 'llama.attention.value_length', u32(0)), /llama\.attention\.value_length is 0 \(1 to 65536\)/],
    ['heads-array-0.gguf', (m) => setKv(m, 'llama.attention.head_count', i32Arr([4, 0])), /layer 1 has attention weights but llama\.attention\.head_count is 0 there \(at least 1\)/],
    ['kv-heads-array-0.gguf', (m) => setKv(m, 'llama.attention.head_count_kv', i32Arr([0, 4])), /layer 0 has attention weights but llama\.attention\.head_count_kv is 0 there/],
    ['heads-missing.gguf', (m) => (dropKv(m, 'llama.attention.head_count'), dropKv(m, 'llama.attention.head_count_kv')), /layer 0 has attention weights but llama\.attention\.head_count is missing/],
    ['ffn-missing.gguf', (m) => dropKv(m, 'llama.feed_forward_length'), /layer 0 has feed-forward weights but llama\.feed_forward_length is missing/],
    ['ffn-3-layers.gguf', (m) => setKv(m, 'llama.feed_forward_length', i32Arr([128, 128, 128])), /llama\.feed_forward_length lists 3 layers, not the 2 of llama\.block_count/],
    ['heads-600.gguf', (m) => setKv(m, 'llama.attention.head_count', i32Arr(new Array(600).fill(4))), /"llama\.attention\.head_count"\): 600 entries \(at most 512\)/],
    ['rope-bogus.gguf', (m) => setKv(m, 'llama.rope.scaling.type', str('bogus')), /llama\.rope\.scaling\.type is "bogus" \(one of none, linear, yarn, longrope\)/],
    ['no-vocab.gguf', (m) => setKv(m, 'tokenizer.ggml.model', str('no_vocab')), /tokenizer\.ggml\.model is "no_vocab": a model without a vocabulary cannot serve text/],
    ['tokens-empty.gguf', (m) => setKv(m, 'tokenizer.ggml.tokens', strArr([])), /tokenizer\.ggml\.tokens is empty/],
    ['tokens-dup.gguf', retoken(301, tinyLlamaVocab().tokens[300]!), /tokens 300 and 301 have the same text .* \(as llama\.cpp reads it\): a corrupt vocabulary/],
    ['tokens-nul.gguf', retoken(400, 'a\0b'), /tokens \d+ and 400 have the same text "a"/],
    ['byte-token-text.gguf', retoken(10, '<0xZZ>'), /token 10 is a byte token, but its text is not <0xHH>/],
    ['byte-missing.gguf', retoken(3 + 0x80, 'zz-not-a-byte', 1), /tokenizer\.ggml\.tokens has no token for byte 0x80 \(<0x80>\): a text holding it would end the process/],
    ['bert-bytes.gguf', (m) => setKv(m, 'tokenizer.ggml.model', str('bert')), /token 3 is a byte token, which a WordPiece \("bert"\) vocabulary cannot decode/],
  ])('%s is refused naming the fault, and the runtime refuses it at once', async (name, edit, message) => {
    const f = edited(name, edit);
    expect(() => checkGgufFile(f)).toThrow(GgufFileError);
    expect(() => checkGgufFile(f)).toThrow(message);
    const a = new LlamaEmbeddedAdapter({ modelPath: f, contextLength: 256 });
    await expect(a.start()).rejects.toThrow(message);
  });

  test('a per-layer count read as llama.cpp reads it (uint32: -1 is 2^32 − 1), of a 32-bit integer type only; long tensor names; a vocabulary of more than 64 MiB of text', () => {
    const negative = edited('used-negative.gguf', (m) => (setKv(m, 'llama.expert_count', u32(2)), setKv(m, 'llama.expert_used_count', i32Arr([-1, -1]))));
    expect(() => checkGgufFile(negative)).toThrow(/llama\.expert_used_count is 4294967295, more than llama\.expert_count \(2\)/);
    const floats = edited('heads-f32-array.gguf', (m) => setKv(m, 'llama.attention.head_count', f32Arr([4, 4])));
    expect(() => checkGgufFile(floats)).toThrow(/"llama\.attention\.head_count"\): an array of GGUF type 6, where llama\.cpp reads 32-bit integers/);
    const wide = edited('heads-u64.gguf', (m) => setKv(m, 'llama.attention.head_count', { type: 'uint64', value: 4 }));
    expect(checkGgufFile(wide)).toMatchObject({ architecture: 'llama' }); // (a scalar of another integer type: llama.cpp converts it)
    const named = edited('long-name.gguf', (m) => m.tensors.push({ name: `x.${'n'.repeat(62)}`, dims: [4], data: new Float32Array(4) }));
    expect(() => checkGgufFile(named)).toThrow(/: a name of 64 bytes \(llama\.cpp takes at most 63\): a corrupt file/);
    const big = edited('vocab-65mib.gguf', retoken(500, 'a'.repeat(65 << 20)));
    expect(() => checkGgufFile(big)).toThrow(/vocab-65mib\.gguf: metadata entry \d+ \("tokenizer\.ggml\.tokens"\): its element 500 is 68157440 bytes long, more token text than a vocabulary may have/);
  });

  test('a recurrent or hybrid architecture marks its recurrent layers with 0 kv heads: not refused for that (Kimi-Linear, Jamba, …)', () => {
    // The tiny model as a hybrid architecture: its keys under that name, layer 0 "recurrent".
    const hybrid = edited('hybrid.gguf', (m) => {
      asArch(m, 'kimi-linear');
      setKv(m, 'kimi-linear.attention.head_count_kv', i32Arr([0, 4]));
    });
    expect(checkGgufFile(hybrid)).toMatchObject({ architecture: 'kimi-linear' });
    // The same layout as a plain llama model aborts llama.cpp: refused.
    const plain = edited('plain-kv0.gguf', (m) => setKv(m, 'llama.attention.head_count_kv', i32Arr([0, 4])));
    expect(() => checkGgufFile(plain)).toThrow(/layer 0 has attention weights but llama\.attention\.head_count_kv is 0 there/);
  });

  test('tensor types no model is stored in, and one-dimensional tensors (norms, biases) not F32, are refused (s20 h1: aborts and segmentation faults)', () => {
    // (the tensor's name, then u32 dimensions = 1, one u64 dimension, then its u32 type)
    for (const [type, name] of [[1, 'F16'], [8, 'Q8_0']] as const) {
      const f = corrupted(`norm-${name}.gguf`, 'output_norm.weight', 4 + 8, (b, at) => b.writeUInt32LE(type, at));
      expect(() => checkGgufFile(f), name).toThrow(/tensor "output_norm\.weight" has one dimension and ggml type \d+, not F32 \(0\)/);
    }
    for (const [type, name] of [[9, 'Q8_1'], [15, 'Q8_K'], [28, 'F64'], [24, 'I8']] as const) {
      const f = corrupted(`weight-${name}.gguf`, 'blk.1.ffn_up.weight', 4 + 16, (b, at) => b.writeUInt32LE(type, at));
      expect(() => checkGgufFile(f), name).toThrow(new RegExp(`tensor "blk\\.1\\.ffn_up\\.weight" is of type ${name}, which no model is stored in`));
    }
  });

  test('rope dimensions within the head and even, rope scaling factors positive: refused otherwise (s20 h1: a start spinning for ever, aborts, empty answers billed)', () => {
    for (const rot of [0, 15, 18]) {
      const f = edited(`rope-dim-${rot}.gguf`, (m) => setKv(m, 'llama.rope.dimension_count', u32(rot)));
      expect(() => checkGgufFile(f), String(rot)).toThrow(new RegExp(`llama\\.rope\\.dimension_count is ${rot} \\(an even number from 2 to the head's 16 dimensions\\)`));
    }
    for (const key of ['llama.rope.scaling.factor', 'llama.rope.scaling.attn_factor']) {
      for (const v of [Number.NaN, -1, Number.POSITIVE_INFINITY]) {
        const f = edited('rope-factor.gguf', (m) => setKv(m, key, f32(v)));
        expect(() => checkGgufFile(f), `${key} ${v}`).toThrow(new RegExp(`${key.replace(/\./g, '\\.')} is ${v} \\(`));
      }
    }
    expect(() => checkGgufFile(edited('yarn-ctx.gguf', (m) => setKv(m, 'llama.rope.scaling.original_context_length', u32(2 ** 32 - 1))))).toThrow(/original_context_length is 4294967295/);
    // What llama.cpp reads as "none" passes: a scaling factor of 0, an original context of 0 (s20 h1: both served).
    expect(checkGgufFile(edited('rope-none.gguf', (m) => (setKv(m, 'llama.rope.scaling.type', str('yarn')), setKv(m, 'llama.rope.scaling.factor', f32(0)), setKv(m, 'llama.rope.scaling.original_context_length', u32(0)))))).toMatchObject({ architecture: 'llama' });
    expect(() => checkGgufFile(edited('used-0.gguf', (m) => (setKv(m, 'llama.expert_count', u32(2)), setKv(m, 'llama.expert_used_count', i32Arr([1, 0])))))).toThrow(/llama\.expert_used_count gives a layer 0 experts, on a model with 2/);
  });

  test('a non-transformer model (Mamba, RWKV) has no attention heads: 0 is taken (llama.cpp\'s converter writes it)', () => {
    const mamba = edited('mamba.gguf', (m) => {
      asArch(m, 'mamba');
      for (const k of ['mamba.attention.head_count', 'mamba.attention.head_count_kv', 'mamba.feed_forward_length']) setKv(m, k, u32(0));
      dropKv(m, 'mamba.rope.dimension_count');
      m.tensors = m.tensors.filter((t) => !/\.(attn_[qkv]|ffn_\w+)\.weight$/.test(t.name)); // (its layers are state-space blocks)
    });
    expect(checkGgufFile(mamba)).toMatchObject({ architecture: 'mamba' });
    const empty = edited('mamba-state-0.gguf', (m) => (asArch(m, 'mamba'), setKv(m, 'mamba.ssm.state_size', u32(0))));
    expect(() => checkGgufFile(empty)).toThrow(/mamba\.ssm\.state_size is 0 \(1 to/);
  });

  test('an RWKV vocabulary needs every byte that begins a token as a token of its own (else its tokenizer loops for ever); a SentencePiece one need not cover bytes UTF-8 never holds', () => {
    const rwkv = edited('rwkv-gap.gguf', (m) => setKv(m, 'tokenizer.ggml.model', str('rwkv')));
    expect(() => checkGgufFile(rwkv)).toThrow(/tokens begin with byte 0xe2, but none is that byte alone: llama\.cpp's RWKV tokenizer would loop for ever/);
    // "\xe2" is how an RWKV vocabulary spells the lone byte 0xE2.
    const covered = edited('rwkv-covered.gguf', (m) => (retoken(400, '\\xe2')(m), setKv(m, 'tokenizer.ggml.model', str('rwkv'))));
    expect(checkGgufFile(covered)).toMatchObject({ architecture: 'llama' });
    expect(checkGgufFile(edited('spm-no-f5.gguf', retoken(3 + 0xf5, 'zz-not-a-byte', 1)))).toMatchObject({ architecture: 'llama' });
  });

  test('a weight of an integer type (I32: a segmentation fault at the first request) is refused', () => {
    // (the tensor's name, then u32 dimensions = 2, two u64 dimensions, then its u32 type)
    const f = corrupted('weight-i32.gguf', 'blk.0.attn_q.weight', 4 + 16, (b, at) => b.writeUInt32LE(26, at));
    expect(() => checkGgufFile(f)).toThrow(/tensor "blk\.0\.attn_q\.weight" is of type I32, which no model is stored in: a corrupt file/);
  });

  test('what llama.cpp takes passes: per-layer counts, a consistent expert count, a byte fallback by the character itself', async () => {
    const layered = edited('per-layer.gguf', (m) => (setKv(m, 'llama.attention.head_count', i32Arr([4, 4])), setKv(m, 'llama.feed_forward_length', i32Arr([128, 128]))));
    expect(checkGgufFile(layered)).toMatchObject({ architecture: 'llama' });
    // (llama.cpp loads it and answers: the per-layer form is its own)
    const a = new LlamaEmbeddedAdapter({ modelPath: layered, contextLength: 256 });
    await a.start();
    expect((await a.tokenize('hello')).length).toBeGreaterThan(0);
    await a.stop();
    expect(checkGgufFile(edited('experts-ok.gguf', (m) => (setKv(m, 'llama.expert_count', u32(8)), setKv(m, 'llama.expert_used_count', u32(2)))))).toMatchObject({ architecture: 'llama' });
    // Byte 0x41 without <0x41>: llama.cpp falls back to the token "A", which the vocabulary has.
    expect(checkGgufFile(edited('byte-by-char.gguf', retoken(3 + 0x41, 'zz-not-a-byte', 1)))).toMatchObject({ architecture: 'llama' });
    expect(checkGgufFile(edited('rope-yarn.gguf', (m) => setKv(m, 'llama.rope.scaling.type', str('yarn'))))).toMatchObject({ architecture: 'llama' });
    // HunYuan's dense models say one expert (llama.cpp reads that as none).
    const hunyuan = edited('hunyuan-1-expert.gguf', (m) => {
      asArch(m, 'hunyuan-dense');
      setKv(m, 'hunyuan-dense.expert_count', u32(1));
    });
    expect(checkGgufFile(hunyuan)).toMatchObject({ architecture: 'hunyuan-dense' });
  }, 20_000);
});
