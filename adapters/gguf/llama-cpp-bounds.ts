/**
 * What llama.cpp aborts on (GGML_ASSERT, an uncaught C++ exception, a bad pointer) in a model file
 * whose GGUF structure is sound: the whole node process would die at load, or later on the first
 * request whose text reaches the flaw. Each rule below is read from the llama.cpp source that
 * node-llama-cpp bundles (llama-model.cpp load_hparams, llama-vocab.cpp load and byte_to_token,
 * ggml-backend.cpp), and each was seen to abort the process in session 17's fuzzing of the tiny
 * model (a corrupt download flipping a few bytes of the token list among them). A file that breaks
 * one is refused with a message naming the file, the key or tensor, and what is wrong.
 */
import { GgufFileError } from './gguf-errors.ts';

/** What checkGgufFile read of a file for these rules. */
export interface GgufFacts {
  file: string;
  architecture: string | undefined;
  /** Scalar numeric values by key. */
  numbers: ReadonlyMap<string, number | bigint>;
  /** The string values read: tokenizer.ggml.model, {arch}.rope.scaling.type. */
  strings: Map<string, string>;
  /** Integer arrays read: per-layer counts and tokenizer.ggml.token_type. */
  numberArrays: Map<string, number[]>;
  /** tokenizer.ggml.tokens as llama.cpp reads them. */
  vocabulary: GgufVocabulary | undefined;
  tensors: { name: string; type: number }[];
}

export interface GgufVocabulary {
  count: number;
  /** Each token's text as llama.cpp keys it (raw bytes, one character a byte; up to a NUL; an empty one renamed), to its first id. */
  ids: Map<string, number>;
  /** 1 where the token's text is spelled <0xHH>. */
  byteText: Uint8Array;
  /** The first two tokens with the same text, if any. */
  duplicate?: { first: number; second: number; text: string };
}

/** ggml's TENSOR_ALIGNMENT: tensor data in a mapped file is used in place only at this alignment. */
const TENSOR_ALIGNMENT = 32;
/** llama.cpp's LLAMA_MAX_EXPERTS. */
const MAX_EXPERTS = 1024;
/** llama.cpp's rope scaling names (llama-model.cpp LLAMA_ROPE_SCALING_TYPES). */
const ROPE_SCALING = ['none', 'linear', 'yarn', 'longrope'];
/** ggml's integer tensor types (I8, I16, I32, I64): no weight is multiplied in them. */
const INTEGER_TENSOR_TYPES = new Map([[24, 'I8'], [25, 'I16'], [26, 'I32'], [27, 'I64']]);
/**
 * Architectures llama.cpp runs as recurrent or hybrid (llama-arch.cpp llm_arch_is_recurrent and
 * llm_arch_is_hybrid): a layer's kv head count of 0 marks a recurrent layer there, whose q/k/v
 * weights are shaped by other keys (Kimi-Linear, Jamba, …). The per-layer head rules skip them.
 */
const RECURRENT_OR_HYBRID = new Set(['mamba', 'mamba2', 'rwkv6', 'rwkv6qwen2', 'rwkv7', 'arwkv7', 'jamba', 'falcon-h1', 'plamo2', 'granitehybrid', 'lfm2', 'lfm2moe', 'nemotron_h', 'nemotron_h_moe', 'qwen3next', 'kimi-linear', 'bailingmoe3', 'kimi-k3', 'qwen35', 'qwen35moe', 'qwen4exp', 'deepseek4', 'minimax-01']);
/** llama_token_type BYTE. */
const BYTE_TOKEN = 6;

export function checkLlamaCppBounds(f: GgufFacts): void {
  const refuse = (what: string): never => {
    throw new GgufFileError(`${f.file}: ${what}`);
  };
  const alignment = f.numbers.get('general.alignment');
  if (alignment !== undefined && Number(alignment) % TENSOR_ALIGNMENT !== 0) refuse(`general.alignment is ${alignment}: llama.cpp needs tensor data aligned to ${TENSOR_ALIGNMENT} bytes (a multiple of ${TENSOR_ALIGNMENT})`);
  for (const t of f.tensors) {
    const integer = INTEGER_TENSOR_TYPES.get(t.type);
    if (integer && t.name.endsWith('.weight')) refuse(`tensor ${JSON.stringify(t.name.slice(0, 80))} is of type ${integer}: llama.cpp computes with no integer weights (a corrupt file)`);
  }
  if (f.architecture !== undefined) {
    layers(f, f.architecture, refuse);
    experts(f, f.architecture, refuse);
    const scaling = f.strings.get(`${f.architecture}.rope.scaling.type`);
    if (scaling !== undefined && !ROPE_SCALING.includes(scaling)) refuse(`${f.architecture}.rope.scaling.type is ${JSON.stringify(scaling.slice(0, 40))} (one of ${ROPE_SCALING.join(', ')})`);
  }
  vocabulary(f, refuse);
}

/** The per-layer counts a layer's attention and feed-forward tensors are built from: each at least 1. */
function layers(f: GgufFacts, arch: string, refuse: (what: string) => never): void {
  const blocks = Number(f.numbers.get(`${arch}.block_count`) ?? 0);
  const uses = (i: number, parts: string[]) => parts.some((p) => tensorNames(f).has(`blk.${i}.${p}.weight`));
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
    if (!RECURRENT_OR_HYBRID.has(arch) && uses(i, ['attn_q', 'attn_k', 'attn_v'])) {
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
  for (const key of [`${arch}.attention.key_length`, `${arch}.attention.value_length`]) {
    const v = f.numbers.get(key);
    if (v !== undefined && !(Number(v) >= 1)) refuse(`${key} is ${v} (at least 1)`);
  }
}

const names = new WeakMap<GgufFacts, Set<string>>();
function tensorNames(f: GgufFacts): Set<string> {
  let s = names.get(f);
  if (!s) names.set(f, (s = new Set(f.tensors.map((t) => t.name))));
  return s;
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
  if (count > 0) {
    if (used < 1) refuse(`${arch}.expert_count is ${count} but ${arch}.expert_used_count is ${used} (at least 1 with experts)`);
    if (groups >= count) refuse(`${arch}.expert_group_count is ${groups} (fewer than the ${count} experts)`);
    if (groups > 1 && (count % groups !== 0 || groupsUsed < 1 || groupsUsed >= groups)) refuse(`${arch}.expert_group_count ${groups} and expert_group_used_count ${groupsUsed} do not fit ${count} experts`);
  } else if (groups !== 0) {
    refuse(`${arch}.expert_group_count is ${groups} on a model without experts`);
  }
}

/** Most tokens a vocabulary may have here (real ones have up to ~10^6). */
export const MAX_VOCABULARY = 1 << 22;

/**
 * The vocabulary llama.cpp builds (llama-vocab.cpp): every token's text distinct as it reads it (up
 * to a NUL; an empty one renamed), byte tokens spelled <0xHH>, and, for a SentencePiece vocabulary,
 * a token for every byte (its tokenizer falls back to bytes for text it has no token for, and a
 * byte without a token throws through C: the process ends). A node serving text needs a vocabulary.
 */
function vocabulary(f: GgufFacts, refuse: (what: string) => never): void {
  const model = f.strings.get('tokenizer.ggml.model');
  if (model === 'none' || model === 'no_vocab') refuse(`tokenizer.ggml.model is "${model}": a model without a vocabulary cannot serve text`);
  const v = f.vocabulary;
  if (!v) return;
  if (v.count === 0) refuse('tokenizer.ggml.tokens is empty');
  if (v.duplicate) {
    const { first, second, text } = v.duplicate;
    refuse(`tokenizer.ggml.tokens: tokens ${first} and ${second} have the same text ${JSON.stringify(Buffer.from(text, 'latin1').toString('utf8').slice(0, 40))} (as llama.cpp reads it): a corrupt vocabulary`);
  }
  const types = f.numberArrays.get('tokenizer.ggml.token_type');
  if (types) {
    types.forEach((type, i) => {
      if (type !== BYTE_TOKEN || i >= v.count) return;
      if (model === 'bert') refuse(`tokenizer.ggml.token_type: token ${i} is a byte token, which a WordPiece ("bert") vocabulary cannot decode`);
      if (!v.byteText[i]) refuse(`tokenizer.ggml.token_type: token ${i} is a byte token, but its text is not <0xHH>: a corrupt vocabulary`);
    });
  }
  if (model === 'llama') {
    for (let b = 0; b < 256; b++) {
      const hex = `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`;
      if (!v.ids.has(hex) && !(b > 0 && v.ids.has(String.fromCharCode(b)))) refuse(`tokenizer.ggml.tokens has no token for byte 0x${hex.slice(3, 5)} (${hex}): a text holding it would end the process inside llama.cpp's tokenizer`);
    }
  }
}
