/**
 * What llama.cpp aborts on (GGML_ASSERT, an uncaught C++ exception, a bad pointer) in a model file
 * whose GGUF structure is sound: the whole node process would die at load, or later on the first
 * request whose text reaches the flaw. Each rule below is read from the llama.cpp source that
 * node-llama-cpp bundles (llama-model.cpp load_hparams, llama-vocab.cpp load and byte_to_token,
 * ggml-backend.cpp), and each was seen to abort, fault or hang the process in sessions 17's and
 * 20's fuzzing (a corrupt download flipping a few bytes of the token list among them). A file that
 * breaks one is refused with a message naming the file, the key or tensor, and what is wrong.
 */
import { GgufFileError } from './gguf-errors.ts';

/** What checkGgufFile read of a file for these rules. */
export interface GgufFacts {
  file: string;
  architecture: string | undefined;
  /** Scalar numeric values by key. */
  numbers: Map<string, number | bigint>;
  /** The string values read: tokenizer.ggml.model, {arch}.rope.scaling.type. */
  strings: Map<string, string>;
  /** Integer arrays read: per-layer counts and tokenizer.ggml.token_type. */
  numberArrays: Map<string, number[]>;
  /** tokenizer.ggml.tokens as llama.cpp reads them. */
  vocabulary: GgufVocabulary | undefined;
  tensors: { name: string; type: number; dims: number }[];
}

export interface GgufVocabulary {
  /** Each token's text as llama.cpp keys it (raw bytes, one character a byte; up to a NUL; an empty one renamed), to its first id. */
  ids: Map<string, number>;
  /** 1 where the token's text is spelled <0xHH>; one entry a token. */
  byteText: Uint8Array;
  /** The first two tokens with the same text, if any. */
  duplicate?: { first: number; second: number; text: string };
}

/** llama.cpp's LLAMA_MAX_LAYERS. */
export const MAX_LAYERS = 512;
/** ggml's TENSOR_ALIGNMENT: tensor data in a mapped file is used in place only at this alignment. */
const TENSOR_ALIGNMENT = 32;
/** llama.cpp's LLAMA_MAX_EXPERTS. */
const MAX_EXPERTS = 1024;
/** llama.cpp's rope scaling names (llama-model.cpp LLAMA_ROPE_SCALING_TYPES). */
const ROPE_SCALING = ['none', 'linear', 'yarn', 'longrope'];
/**
 * ggml types no model tensor is stored in, on which llama.cpp aborts or faults: the integer types
 * (I8, I16, I32, I64), the activation-only Q8_1 and Q8_K, and F64.
 */
const UNUSABLE_TENSOR_TYPES = new Map([[9, 'Q8_1'], [15, 'Q8_K'], [24, 'I8'], [25, 'I16'], [26, 'I32'], [27, 'I64'], [28, 'F64']]);
/** ggml's F32. A one-dimensional tensor (a norm, a bias) is always F32 in a model (converters and llama-quantize keep it so); another type aborted llama.cpp. */
const F32 = 0;
/** Architectures without attention (llama-arch.cpp llm_arch_is_recurrent): no head count. */
const RECURRENT = new Set(['mamba', 'mamba2', 'rwkv6', 'rwkv6qwen2', 'rwkv7', 'arwkv7']);
/**
 * Those and the hybrid ones (llm_arch_is_hybrid): a layer's kv head count of 0 marks a recurrent
 * layer there, whose q/k/v weights are shaped by other keys (Kimi-Linear, Jamba, …). The per-layer
 * head rules skip them.
 */
const RECURRENT_OR_HYBRID = new Set([...RECURRENT, 'jamba', 'falcon-h1', 'plamo2', 'granitehybrid', 'lfm2', 'lfm2moe', 'nemotron_h', 'nemotron_h_moe', 'qwen3next', 'kimi-linear', 'bailingmoe3', 'kimi-k3', 'qwen35', 'qwen35moe', 'qwen4exp', 'deepseek4', 'minimax-01']);
/** llama_token_type BYTE. */
const BYTE_TOKEN = 6;

export function checkLlamaCppBounds(f: GgufFacts): void {
  const refuse = (what: string): never => {
    throw new GgufFileError(`${f.file}: ${what}`);
  };
  if (f.architecture !== undefined) hyperparameters(f, f.architecture, refuse);
  const alignment = f.numbers.get('general.alignment');
  if (alignment !== undefined && Number(alignment) % TENSOR_ALIGNMENT !== 0) refuse(`general.alignment is ${alignment}: llama.cpp needs tensor data aligned to ${TENSOR_ALIGNMENT} bytes (a multiple of ${TENSOR_ALIGNMENT})`);
  for (const t of f.tensors) {
    const unusable = UNUSABLE_TENSOR_TYPES.get(t.type);
    if (unusable) refuse(`tensor ${JSON.stringify(t.name.slice(0, 80))} is of type ${unusable}, which no model is stored in: a corrupt file`);
    if (t.dims === 1 && t.type !== F32) refuse(`tensor ${JSON.stringify(t.name.slice(0, 80))} has one dimension and ggml type ${t.type}, not F32 (0): a corrupt file`);
  }
  if (f.architecture !== undefined) {
    layers(f, f.architecture, refuse);
    experts(f, f.architecture, refuse);
    const scaling = f.strings.get(`${f.architecture}.rope.scaling.type`);
    if (scaling !== undefined && !ROPE_SCALING.includes(scaling)) refuse(`${f.architecture}.rope.scaling.type is ${JSON.stringify(scaling.slice(0, 40))} (one of ${ROPE_SCALING.join(', ')})`);
  }
  vocabulary(f, refuse);
}

/** The hyperparameters llama.cpp asserts on (an abort of the whole process), where they are plain numbers. */
function hyperparameters(f: GgufFacts, arch: string, refuse: (what: string) => never): void {
  // (non-transformer models, Mamba and RWKV, have no attention heads: llama.cpp's converter writes 0)
  const heads = RECURRENT.has(arch) ? 0 : 1;
  const counts: [string, number, number][] = [
    [`${arch}.block_count`, 1, MAX_LAYERS],
    [`${arch}.attention.head_count`, heads, 2 ** 31 - 1],
    [`${arch}.attention.head_count_kv`, heads, 2 ** 31 - 1],
    [`${arch}.embedding_length`, 1, 2 ** 31 - 1],
    [`${arch}.feed_forward_length`, heads, 2 ** 31 - 1],
    [`${arch}.context_length`, 16, 2 ** 31 - 1],
    // (a head of more than 2^16 dimensions is no model's: 2^31 aborted llama.cpp)
    [`${arch}.attention.key_length`, 1, 1 << 16],
    [`${arch}.attention.value_length`, 1, 1 << 16],
    [`${arch}.rope.scaling.original_context_length`, 0, 2 ** 31 - 1],
    // (a state-space block of size 0 aborted llama.cpp)
    [`${arch}.ssm.conv_kernel`, 1, 2 ** 31 - 1],
    [`${arch}.ssm.state_size`, 1, 2 ** 31 - 1],
    [`${arch}.ssm.time_step_rank`, 1, 2 ** 31 - 1],
    [`${arch}.ssm.inner_size`, 1, 2 ** 31 - 1],
  ];
  for (const [key, min, max] of counts) {
    const v = f.numbers.get(key);
    if (v === undefined) continue;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) refuse(`${key} is ${v} (${min} to ${max}): a corrupt file`);
  }
  // Finite reals, positive (0 or NaN made a model that loads and answers nothing, billed as
  // tokens), or for a rope scaling factor 0 too (llama.cpp's "none").
  const reals: [string, boolean][] = [
    [`${arch}.rope.freq_base`, false],
    [`${arch}.attention.layer_norm_rms_epsilon`, false],
    [`${arch}.attention.layer_norm_epsilon`, false],
    [`${arch}.rope.scaling.attn_factor`, false],
    [`${arch}.rope.scaling.factor`, true],
    [`${arch}.rope.scale_linear`, true],
  ];
  for (const [key, zero] of reals) {
    const v = f.numbers.get(key);
    if (v === undefined) continue;
    const n = Number(v);
    if (!(Number.isFinite(n) && (n > 0 || (zero && n === 0)))) refuse(`${key} is ${v} (${zero ? '0, none, or a positive number' : 'a positive number'}): a corrupt file`);
  }
}

/** The per-layer counts a layer's attention and feed-forward tensors are built from: each at least 1. */
function layers(f: GgufFacts, arch: string, refuse: (what: string) => never): void {
  const blocks = Number(f.numbers.get(`${arch}.block_count`) ?? 0);
  const names = new Set(f.tensors.map((t) => t.name));
  const uses = (i: number, parts: string[]) => parts.some((p) => names.has(`blk.${i}.${p}.weight`));
  const perLayer = (key: string): ((i: number) => number | undefined) | undefined => {
    const arr = f.numberArrays.get(key);
    if (arr) {
      if (arr.length !== blocks) refuse(`${key} lists ${arr.length} layers, not the ${blocks} of ${arch}.block_count`);
      return (i) => arr[i];
    }
    const v = f.numbers.get(key);
    return v === undefined ? undefined : () => Number(v);
  };
  const heads = perLayer(`${arch}.attention.head_count`);
  const kvHeads = perLayer(`${arch}.attention.head_count_kv`) ?? heads; // (llama.cpp: head_count_kv defaults to head_count)
  const ffn = perLayer(`${arch}.feed_forward_length`);
  for (let i = 0; i < blocks; i++) {
    if (!RECURRENT_OR_HYBRID.has(arch) && uses(i, ['attn_q', 'attn_k', 'attn_v', 'attn_qkv'])) {
      const h = heads?.(i);
      if (h === undefined || h < 1) refuse(`layer ${i} has attention weights but ${arch}.attention.head_count ${h === undefined ? 'is missing' : `is ${h} there`} (at least 1)`);
      const kv = kvHeads?.(i);
      if (kv === undefined || kv < 1) refuse(`layer ${i} has attention weights but ${arch}.attention.head_count_kv is ${kv} there (at least 1)`);
    }
    if (uses(i, ['ffn_up', 'ffn_down', 'ffn_gate'])) {
      const n = ffn?.(i);
      if (n === undefined || n < 1) refuse(`layer ${i} has feed-forward weights but ${arch}.feed_forward_length ${n === undefined ? 'is missing' : `is ${n} there`} (at least 1)`);
    }
  }
  // The rotary dimensions: within the head (its key length, else embedding / heads) and even; 0
  // made llama.cpp spin for ever at start, odd or more than the head aborted it.
  const rot = f.numbers.get(`${arch}.rope.dimension_count`);
  const h0 = heads?.(0);
  if (rot !== undefined && h0 !== undefined && h0 >= 1) {
    const head = Number(f.numbers.get(`${arch}.attention.key_length`) ?? Math.floor(Number(f.numbers.get(`${arch}.embedding_length`) ?? 0) / h0));
    const n = Number(rot);
    if (!(Number.isInteger(n) && n >= 2 && n % 2 === 0 && (head === 0 || n <= head))) refuse(`${arch}.rope.dimension_count is ${rot} (an even number from 2 to the head's ${head} dimensions)`);
  }
}

/** llama.cpp's expert counts (load_hparams): consistent with each other, or it aborts. */
function experts(f: GgufFacts, arch: string, refuse: (what: string) => never): void {
  let count = Number(f.numbers.get(`${arch}.expert_count`) ?? 0);
  const usedArr = f.numberArrays.get(`${arch}.expert_used_count`);
  const usedScalar = f.numbers.get(`${arch}.expert_used_count`);
  let used = usedArr ? usedArr.reduce((a, b) => Math.max(a, b), 0) : Number(usedScalar ?? 0);
  // (llama.cpp reads one expert or none as a dense model for these two)
  if ((arch === 'hunyuan-dense' || arch === 'hunyuan_vl') && count <= 1) count = used = 0;
  const groups = Number(f.numbers.get(`${arch}.expert_group_count`) ?? 0);
  const groupsUsed = Number(f.numbers.get(`${arch}.expert_group_used_count`) ?? 0);
  if (count > MAX_EXPERTS) refuse(`${arch}.expert_count is ${count} (at most ${MAX_EXPERTS})`);
  if (used > count) refuse(`${arch}.expert_used_count is ${used}, more than ${arch}.expert_count (${count})`);
  if (count > 0 && usedArr?.some((u) => u === 0)) refuse(`${arch}.expert_used_count gives a layer 0 experts, on a model with ${count}`);
  if (count > 0) {
    if (used < 1) refuse(`${arch}.expert_count is ${count} but ${arch}.expert_used_count is ${used} (at least 1 with experts)`);
    if (groups >= count) refuse(`${arch}.expert_group_count is ${groups} (fewer than the ${count} experts)`);
    if (groups > 1 && (count % groups !== 0 || groupsUsed < 1 || groupsUsed >= groups)) refuse(`${arch}.expert_group_count ${groups} and expert_group_used_count ${groupsUsed} do not fit ${count} experts`);
  } else if (groups !== 0) {
    refuse(`${arch}.expert_group_count is ${groups} on a model without experts`);
  }
}

/** Bytes valid UTF-8 never holds: a vocabulary need not cover them. */
const NEVER_IN_UTF8 = (b: number): boolean => b === 0xc0 || b === 0xc1 || b >= 0xf5;

/** An RWKV token's bytes, as llama.cpp's llama_unescape_rwkv_token reads its text (\t \n \r \xHH, a backslash before anything else dropped). */
function unescapeRwkv(text: string): number[] {
  const out: number[] = [];
  let escaping = false;
  let hexLeft = 0;
  let acc = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (hexLeft) {
      acc = ((acc << 4) + (c >= 0x61 ? c - 0x61 + 10 : c - 0x30)) & 0xff;
      if (--hexLeft === 0) {
        out.push(acc);
        acc = 0;
      }
    } else if (escaping) {
      escaping = false;
      if (c === 0x78) hexLeft = 2;
      else out.push(c === 0x74 ? 9 : c === 0x6e ? 10 : c === 0x72 ? 13 : c);
    } else if (c === 0x5c) escaping = true;
    else out.push(c);
  }
  return out;
}

/**
 * The vocabulary llama.cpp builds (llama-vocab.cpp): every token's text distinct as it reads it (up
 * to a NUL; an empty one renamed), byte tokens spelled <0xHH>; for a SentencePiece vocabulary a
 * token for every byte UTF-8 can hold (its tokenizer falls back to bytes for text it has no token
 * for, and a byte without a token throws through C: the process ends); for an RWKV one, each byte
 * that begins a token a token of its own. A node serving text needs a vocabulary.
 */
function vocabulary(f: GgufFacts, refuse: (what: string) => never): void {
  const model = f.strings.get('tokenizer.ggml.model');
  if (model === 'none' || model === 'no_vocab') refuse(`tokenizer.ggml.model is "${model}": a model without a vocabulary cannot serve text`);
  const v = f.vocabulary;
  if (!v) return;
  const count = v.byteText.length;
  if (count === 0) refuse('tokenizer.ggml.tokens is empty');
  if (v.duplicate) {
    const { first, second, text } = v.duplicate;
    refuse(`tokenizer.ggml.tokens: tokens ${first} and ${second} have the same text ${JSON.stringify(Buffer.from(text, 'latin1').toString('utf8').slice(0, 40))} (as llama.cpp reads it): a corrupt vocabulary`);
  }
  const types = f.numberArrays.get('tokenizer.ggml.token_type');
  if (types) {
    types.forEach((type, i) => {
      if (type !== BYTE_TOKEN || i >= count) return;
      if (model === 'bert') refuse(`tokenizer.ggml.token_type: token ${i} is a byte token, which a WordPiece ("bert") vocabulary cannot decode`);
      if (!v.byteText[i]) refuse(`tokenizer.ggml.token_type: token ${i} is a byte token, but its text is not <0xHH>: a corrupt vocabulary`);
    });
  }
  if (model === 'llama') {
    for (let b = 0; b < 256; b++) {
      if (NEVER_IN_UTF8(b)) continue; // (the node tokenizes UTF-8 text only)
      const hex = `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`;
      if (!v.ids.has(hex) && !(b > 0 && v.ids.has(String.fromCharCode(b)))) refuse(`tokenizer.ggml.tokens has no token for byte 0x${hex.slice(3, 5)} (${hex}): a text holding it would end the process inside llama.cpp's tokenizer`);
    }
  }
  if (model === 'rwkv') {
    // RWKV's tokenizer walks a trie of the unescaped token texts from each position; a byte that
    // begins a token but is no token itself sends it back to the start for ever (a text as short
    // as "hi" held the node's event loop and grew it without bound).
    const singles = new Set<number>();
    const firsts = new Set<number>();
    for (const text of v.ids.keys()) {
      const bytes = unescapeRwkv(text);
      if (bytes.length === 1) singles.add(bytes[0]!);
      if (bytes.length > 0) firsts.add(bytes[0]!);
    }
    for (const b of [...firsts].sort((x, y) => x - y)) {
      if (!singles.has(b)) refuse(`tokenizer.ggml.tokens: tokens begin with byte 0x${b.toString(16).padStart(2, '0')}, but none is that byte alone: llama.cpp's RWKV tokenizer would loop for ever on a text holding it`);
    }
  }
}
