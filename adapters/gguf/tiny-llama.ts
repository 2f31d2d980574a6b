/**
 * A tiny, deterministic, randomly-initialised `llama`-architecture model in
 * GGUF form (~1 MB, all F32) that llama.cpp (and so node-llama-cpp) loads and
 * runs. It knows nothing; it exists so tests can exercise real model loading,
 * tokenisation, sampling and embeddings without downloading anything.
 *
 * Tokenizer: SentencePiece-style (`tokenizer.ggml.model = "llama"`, llama.cpp's
 * SPM tokenizer) with byte fallback. Normal pieces are the space marker "▁",
 * single printable ASCII characters and a few hundred common English words
 * prefixed with "▁"; every prefix of every word is a piece too, and longer
 * pieces score higher, so the SPM bigram merge builds each known word one
 * character at a time into a single token. Anything else falls back to
 * characters, and non-ASCII to the `<0xXX>` byte tokens.
 */

import { writeFileSync } from 'node:fs';
import {
  bool,
  f32,
  f32Arr,
  i32Arr,
  kv,
  str,
  strArr,
  u32,
  writeGguf,
  type GgufF32Tensor,
  type GgufKv,
} from './gguf-writer.ts';

export interface TinyLlamaOptions {
  /** PRNG seed for the weights (uint32). Same seed, same bytes. Default 1. */
  readonly seed?: number;
  /** `llama.context_length` (training context). Default 2048. */
  readonly contextLength?: number;
  /** `tokenizer.chat_template`. Default: ChatML (TINY_LLAMA_CHAT_TEMPLATE); null: none (a base model's file). */
  readonly chatTemplate?: string | null;
  /** Changes the model before it is written (tests: a file with one flaw). */
  readonly edit?: (model: { metadata: GgufKv[]; tensors: GgufF32Tensor[]; alignment: number }) => void;
}

export const TINY_LLAMA_NAME = 'seller-node tiny llama';

export const TINY_LLAMA_CONFIG = {
  embeddingLength: 64,
  blockCount: 2,
  headCount: 4,
  headCountKv: 4,
  feedForwardLength: 128,
  ropeDimensionCount: 16,
  rmsEpsilon: 1e-5,
  ropeFreqBase: 10000,
  contextLength: 2048,
} as const;

/** ChatML, as a Jinja template (the `\n` are Jinja string escapes). */
export const TINY_LLAMA_CHAT_TEMPLATE =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** SentencePiece / GGUF token types (llama_token_type). */
const TOKEN_TYPE = {
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  USER_DEFINED: 4,
  UNUSED: 5,
  BYTE: 6,
} as const;

/** Fixed token ids of the vocabulary's special tokens. */
export const TINY_LLAMA_TOKENS = {
  unk: 0,
  bos: 1,
  eos: 2,
  /** `<0x00>`; byte b is token `byte0 + b`. */
  byte0: 3,
  imStart: 259,
  imEnd: 260,
  /** First normal piece ("▁"). */
  firstNormal: 261,
} as const;

export const SPACE_MARKER = '\u2581';

/** Common English words; each becomes "▁word" plus all its "▁" prefixes. */
const TINY_LLAMA_WORDS: readonly string[] = [
  'hello', 'world', 'the', 'be', 'to', 'of', 'and', 'a', 'in', 'that', 'have', 'i', 'it', 'for', 'not', 'on',
  'with', 'he', 'as', 'you', 'do', 'at', 'this', 'but', 'his', 'by', 'from', 'they', 'we', 'say', 'her', 'she',
  'or', 'an', 'will', 'my', 'one', 'all', 'would', 'there', 'their', 'what', 'so', 'up', 'out', 'if', 'about',
  'who', 'get', 'which', 'go', 'me', 'when', 'make', 'can', 'like', 'time', 'no', 'just', 'him', 'know', 'take',
  'people', 'into', 'year', 'your', 'good', 'some', 'could', 'them', 'see', 'other', 'than', 'then', 'now',
  'look', 'only', 'come', 'its', 'over', 'think', 'also', 'back', 'after', 'use', 'two', 'how', 'our', 'work',
  'first', 'well', 'way', 'even', 'new', 'want', 'because', 'any', 'these', 'give', 'day', 'most', 'us', 'is',
  'are', 'was', 'were', 'been', 'has', 'had', 'did', 'does', 'said', 'made', 'very', 'more', 'many', 'much',
  'here', 'where', 'why', 'yes', 'thank', 'thanks', 'please', 'sorry', 'help', 'question', 'answer', 'model',
  'token', 'tokens', 'text', 'word', 'words', 'test', 'data', 'file', 'name', 'number', 'value', 'system',
  'user', 'assistant', 'message', 'chat', 'price', 'pay', 'sell', 'buy', 'market', 'node', 'seller', 'buyer',
  'receipt', 'proof', 'sign', 'key', 'hash', 'log', 'audit', 'replay', 'seed', 'random', 'small', 'big',
  'large', 'little', 'old', 'young', 'long', 'short', 'high', 'low', 'great', 'right', 'left', 'same',
  'different', 'next', 'last', 'early', 'late', 'important', 'public', 'private', 'real', 'best', 'better',
  'sure', 'free', 'true', 'false', 'open', 'close', 'start', 'stop', 'end', 'begin', 'run', 'read', 'write',
  'find', 'tell', 'ask', 'feel', 'try', 'leave', 'call', 'keep', 'let', 'put', 'mean', 'seem', 'turn', 'show',
  'hear', 'play', 'move', 'live', 'believe', 'bring', 'happen', 'provide', 'sit', 'stand', 'lose', 'add',
  'change', 'follow', 'learn', 'talk', 'need', 'love', 'hold', 'life', 'man', 'woman', 'child', 'children',
  'thing', 'things', 'place', 'week', 'case', 'point', 'home', 'water', 'room', 'mother', 'father', 'area',
  'money', 'story', 'fact', 'month', 'lot', 'book', 'eye', 'job', 'business', 'issue', 'side', 'kind', 'head',
  'house', 'service', 'friend', 'power', 'hour', 'game', 'line', 'member', 'city', 'car', 'school', 'country',
  'problem', 'hand', 'part', 'state', 'night', 'morning', 'light', 'music', 'food', 'tree', 'sun', 'sky',
  'sea', 'cat', 'dog', 'bird', 'fish', 'red', 'blue', 'green', 'black', 'white', 'yellow', 'every', 'never',
  'always', 'sometimes', 'again', 'still', 'too', 'each', 'both', 'few', 'such', 'own', 'before', 'under',
  'through', 'between', 'while', 'should', 'may', 'might', 'must', 'shall', 'quick', 'brown', 'fox', 'jumps',
  'lazy', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine', 'ten', 'hundred', 'thousand', 'today',
  'tomorrow', 'yesterday', 'once', 'upon', 'king', 'queen', 'happy', 'sad', 'nice', 'okay',
  'The', 'I', 'Hello', 'What', 'How', 'You', 'It', 'This', 'We', 'Yes', 'No',
];

/** Deterministic 32-bit PRNG (mulberry32); only integer ops, so bit-exact everywhere. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface TinyLlamaVocab {
  readonly tokens: string[];
  readonly scores: Float32Array;
  readonly types: Int32Array;
}

/** The tokenizer's pieces, scores and token types, in id order. */
export function tinyLlamaVocab(): TinyLlamaVocab {
  const tokens: string[] = [];
  const scores: number[] = [];
  const types: number[] = [];
  const seen = new Set<string>();
  const add = (piece: string, score: number, type: number): void => {
    if (seen.has(piece)) return;
    seen.add(piece);
    tokens.push(piece);
    scores.push(score);
    types.push(type);
  };

  add('<unk>', 0, TOKEN_TYPE.UNKNOWN);
  add('<s>', 0, TOKEN_TYPE.CONTROL);
  add('</s>', 0, TOKEN_TYPE.CONTROL);
  for (let b = 0; b < 256; b++) {
    add(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, 0, TOKEN_TYPE.BYTE);
  }
  add('<|im_start|>', 0, TOKEN_TYPE.CONTROL);
  add('<|im_end|>', 0, TOKEN_TYPE.CONTROL);
  if (tokens.length !== TINY_LLAMA_TOKENS.firstNormal) throw new Error('internal: special token layout changed');

  // Score = length in code points: the SPM merge takes the highest-scoring
  // bigram first, so longer known pieces win.
  const normal = (piece: string): void => add(piece, [...piece].length, TOKEN_TYPE.NORMAL);
  normal(SPACE_MARKER);
  for (let c = 0x21; c <= 0x7e; c++) normal(String.fromCharCode(c));
  for (const word of TINY_LLAMA_WORDS) {
    const chars = [...word];
    for (let k = 1; k <= chars.length; k++) normal(SPACE_MARKER + chars.slice(0, k).join(''));
  }

  return { tokens, scores: Float32Array.from(scores), types: Int32Array.from(types) };
}

function checkSeed(seed: number): number {
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffff_ffff) throw new RangeError(`seed must be a uint32, got ${seed}`);
  return seed;
}

/** Build the model file in memory. Deterministic: same options, same bytes. */
export function buildTinyLlama(opts: TinyLlamaOptions = {}): Uint8Array {
  const seed = checkSeed(opts.seed ?? 1);
  const contextLength = opts.contextLength ?? TINY_LLAMA_CONFIG.contextLength;
  if (!Number.isInteger(contextLength) || contextLength < 1 || contextLength > 0xffff_ffff) {
    throw new RangeError(`contextLength must be a positive uint32, got ${contextLength}`);
  }
  const c = TINY_LLAMA_CONFIG;
  const vocab = tinyLlamaVocab();
  const nVocab = vocab.tokens.length;
  const nEmbd = c.embeddingLength;
  const nFf = c.feedForwardLength;
  const headDim = nEmbd / c.headCount;
  const nEmbdKv = headDim * c.headCountKv;

  const rand = mulberry32(seed);
  // Uniform in [-a, a] has standard deviation a / sqrt(3).
  const uniform = (dims: readonly number[], std: number): Float32Array => {
    const n = dims.reduce((p, d) => p * d, 1);
    const a = std * Math.sqrt(3);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = (rand() * 2 - 1) * a;
    return out;
  };
  const ones = (n: number): Float32Array => new Float32Array(n).fill(1);

  // ggml dimension order (ne): a weight W used as W·x with x of length `in`
  // and output of length `out` is stored as [in, out].
  const tensors: GgufF32Tensor[] = [];
  const t = (name: string, dims: number[], data: Float32Array): void => {
    tensors.push({ name, dims, data });
  };
  t('token_embd.weight', [nEmbd, nVocab], uniform([nEmbd, nVocab], 0.5));
  t('output_norm.weight', [nEmbd], ones(nEmbd));
  // Logit std ≈ sqrt(n_embd) * 0.25 = 2: peaked enough to be a distribution, flat enough to vary with the seed.
  t('output.weight', [nEmbd, nVocab], uniform([nEmbd, nVocab], 0.25));
  const inStd = 1 / Math.sqrt(nEmbd);
  for (let l = 0; l < c.blockCount; l++) {
    const p = `blk.${l}.`;
    t(`${p}attn_norm.weight`, [nEmbd], ones(nEmbd));
    t(`${p}attn_q.weight`, [nEmbd, headDim * c.headCount], uniform([nEmbd, headDim * c.headCount], inStd));
    t(`${p}attn_k.weight`, [nEmbd, nEmbdKv], uniform([nEmbd, nEmbdKv], inStd));
    t(`${p}attn_v.weight`, [nEmbd, nEmbdKv], uniform([nEmbd, nEmbdKv], inStd));
    t(`${p}attn_output.weight`, [headDim * c.headCount, nEmbd], uniform([headDim * c.headCount, nEmbd], inStd));
    t(`${p}ffn_norm.weight`, [nEmbd], ones(nEmbd));
    t(`${p}ffn_gate.weight`, [nEmbd, nFf], uniform([nEmbd, nFf], inStd));
    t(`${p}ffn_down.weight`, [nFf, nEmbd], uniform([nFf, nEmbd], 1 / Math.sqrt(nFf)));
    t(`${p}ffn_up.weight`, [nEmbd, nFf], uniform([nEmbd, nFf], inStd));
  }

  const metadata: GgufKv[] = [
    kv('general.architecture', str('llama')),
    kv('general.name', str(TINY_LLAMA_NAME)),
    kv('general.file_type', u32(0)), // ALL_F32
    kv('llama.vocab_size', u32(nVocab)),
    kv('llama.context_length', u32(contextLength)),
    kv('llama.embedding_length', u32(nEmbd)),
    kv('llama.block_count', u32(c.blockCount)),
    kv('llama.feed_forward_length', u32(nFf)),
    kv('llama.rope.dimension_count', u32(c.ropeDimensionCount)),
    kv('llama.rope.freq_base', f32(c.ropeFreqBase)),
    kv('llama.attention.head_count', u32(c.headCount)),
    kv('llama.attention.head_count_kv', u32(c.headCountKv)),
    kv('llama.attention.layer_norm_rms_epsilon', f32(c.rmsEpsilon)),
    kv('tokenizer.ggml.model', str('llama')),
    kv('tokenizer.ggml.tokens', strArr(vocab.tokens)),
    kv('tokenizer.ggml.scores', f32Arr(vocab.scores)),
    kv('tokenizer.ggml.token_type', i32Arr(vocab.types)),
    kv('tokenizer.ggml.unknown_token_id', u32(TINY_LLAMA_TOKENS.unk)),
    kv('tokenizer.ggml.bos_token_id', u32(TINY_LLAMA_TOKENS.bos)),
    kv('tokenizer.ggml.eos_token_id', u32(TINY_LLAMA_TOKENS.eos)),
    // llama.cpp treats EOS and EOT (and EOM) as end-of-generation tokens.
    kv('tokenizer.ggml.eot_token_id', u32(TINY_LLAMA_TOKENS.imEnd)),
    kv('tokenizer.ggml.add_bos_token', bool(true)),
    kv('tokenizer.ggml.add_eos_token', bool(false)),
    kv('tokenizer.ggml.add_space_prefix', bool(true)),
    ...(opts.chatTemplate === null ? [] : [kv('tokenizer.chat_template', str(opts.chatTemplate ?? TINY_LLAMA_CHAT_TEMPLATE))]),
  ];

  const model = { metadata, tensors, alignment: 32 };
  opts.edit?.(model);
  return writeGguf(model);
}

/** Build the model and write it to `file`. Returns the byte count. */
export function writeTinyLlama(file: string, opts: TinyLlamaOptions = {}): number {
  const bytes = buildTinyLlama(opts);
  writeFileSync(file, bytes);
  return bytes.length;
}
