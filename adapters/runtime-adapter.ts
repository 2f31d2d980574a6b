// The one interface every runtime implements: the embedded llama.cpp (node-llama-cpp) and, later,
// llama-server, vLLM and ComfyUI over HTTP. The node meters with what an adapter reports, so token
// counts come from the runtime's own tokenizer with its chat template applied, never an estimate.
// Nothing here imports from src/.
import type { ModelFileState } from './model-file.ts';

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | 'developer';
  content: string;
  /** The participant's name, for the chat template. */
  name?: string;
  /** A tool result: the call it answers. */
  tool_call_id?: string;
  /** An assistant turn's calls, as the chat API gives them (arguments: JSON text). */
  tool_calls?: ToolCall[];
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export type GenerationInput = { kind: 'chat'; messages: ChatMessage[] } | { kind: 'prompt'; prompt: string };

export interface SamplingOptions {
  /** 0 = greedy. */
  temperature: number;
  topP?: number;
  /** 0 turns it off. */
  topK?: number;
  minP?: number;
  /** A repeat penalty over the last 64 tokens (input and output); 1 turns it off. */
  repeatPenalty?: number;
  /** Fixed seed: the same request gives the same tokens (audit replay relies on it). */
  seed: number;
}

export interface GenerateRequest {
  input: GenerationInput;
  /** inputTokens(input), when the caller already has them (saves rendering and tokenizing twice). */
  inputTokens?: number[];
  /** Hard cap, already lowered by the node so the worst case stays within the ticket's hold. */
  maxTokens: number;
  sampling: SamplingOptions;
  stop?: string[];
  /** Aborting stops generation promptly; what was generated so far is still reported. */
  signal?: AbortSignal;
}

export type FinishReason = 'stop' | 'length' | 'abort';

export interface GeneratedChunk {
  /** The next part of the answer's text (possibly empty while a multi-byte character is incomplete or a possible stop sequence is held back). */
  text: string;
  /**
   * The tokens whose text ends in this chunk, so that every token counted has all its text in the
   * chunks up to here (a buyer who leaves is billed only for text they got). A run's chunks carry
   * every output token once, in order; a token with its text partly held comes with a later chunk,
   * and the tokens of a stop sequence (text the answer leaves out) last, in a chunk with no text.
   */
  tokens: number[];
}

/**
 * The runtime cannot take this input now (its tokenizer's child process has as many long inputs
 * waiting as it queues): 503, nothing run; another provider can take the request. Thrown before any work.
 */
export class RuntimeBusyError extends Error {
  override name = 'RuntimeBusyError';
}

/**
 * An input the runtime cannot take as asked, e.g. chat messages for a model without a chat template
 * (`token_count_unsupported`: it has no exact way to tokenize them). Thrown before any work.
 */
export class UnsupportedInputError extends Error {
  override name = 'UnsupportedInputError';
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.code = code;
  }
}

export interface GenerationResult {
  finishReason: FinishReason;
  /** Input tokens evaluated: 0 when the run ended before its prompt was (nothing to bill). */
  inputTokens: number;
  outputTokens: number;
  /** Usage as the runtime itself reported it, for the receipt's usage_runtime. */
  usageRuntime: Record<string, unknown>;
}

export interface EmbeddingResult {
  /** One vector per input embedded: fewer than the inputs when the signal stopped the batch. */
  vectors: number[][];
  /** The tokens of the inputs embedded. */
  inputTokens: number;
}

export interface RuntimeInfo {
  adapter: string;
  version: string;
  /** SHA-256 of the model file (hex), computed once. */
  modelSha256: string;
  contextLength: number;
  embeddingLength: number;
  chatTemplate: string | null;
  /** The quantization bucket the model file says it is (q4-k-m, f16), when the runtime can read it. */
  quantization?: string;
}

export interface RuntimeAdapter {
  readonly info: RuntimeInfo;
  /** Loads the model; resolves when the adapter can serve. */
  start(): Promise<void>;
  stop(): Promise<void>;
  /** Tokens of a text (special tokens parsed when `special`). */
  tokenize(text: string, opts?: { special?: boolean }): Promise<number[]>;
  detokenize(tokens: number[]): Promise<string>;
  /** The prompt a chat becomes under the model's chat template (with the generation prompt). */
  renderChat(messages: ChatMessage[]): Promise<string>;
  /**
   * The tokens a generation input becomes, exactly as generation evaluates them (BOS included).
   * With `atMost`, an input that needs more tokens than that by its length alone is refused
   * (UnsupportedInputError context_length_exceeded) before it is rendered or tokenised.
   */
  inputTokens(input: GenerationInput, opts?: { atMost?: number }): Promise<number[]>;
  /** inputTokens(input).length. */
  countInputTokens(input: GenerationInput): Promise<number>;
  /** Streams chunks; the returned value is the final accounting. */
  generate(req: GenerateRequest): AsyncGenerator<GeneratedChunk, GenerationResult, void>;
  /**
   * One vector per input; `inputTokens[i]` is inputTokens(prompt i) when the caller already has
   * them. Once `signal` is aborted no further input is embedded: the result holds those done.
   */
  embed(inputs: string[], inputTokens?: number[][], signal?: AbortSignal): Promise<EmbeddingResult>;
  /**
   * For a runtime that serves a local file: whether that file was modified in place since it was
   * loaded and hashed (`modified`: the running weights may no longer be those of modelSha256).
   */
  modelFileState?(): ModelFileState;
  /** Why the runtime can no longer serve at all (e.g. its thread died); undefined while it can. */
  failure?(): Error | undefined;
}
