// What the node's thread and the runtime thread (runtime-thread.ts, runtime-thread-worker.ts) say
// to each other, and errors carried across with their class: the node answers a RuntimeBusyError
// 503 and an UnsupportedInputError 400 with its code, and names a probe that ran out of time.
import type { LlamaEmbeddedOptions } from './llama-embedded.ts';
import type { FileIdentity } from './model-file.ts';
import { ModelProbeError } from './model-probe.ts';
import { RuntimeBusyError, UnsupportedInputError, type GeneratedChunk, type GenerateRequest, type GenerationResult, type RuntimeInfo } from './runtime-adapter.ts';

/** The adapter's options that cross to the thread (the probe's memo stays here: the thread asks it by message). */
export type ThreadAdapterOptions = Omit<LlamaEmbeddedOptions, 'probe'> & { probe?: { timeoutMs?: number } };

/** The adapter methods answered by a plain call. */
export type CallMethod = 'tokenize' | 'detokenize' | 'renderChat' | 'inputTokens' | 'countInputTokens' | 'stop';

export type ToThread =
  | { op: 'start'; id: number; handle: number; opts: ThreadAdapterOptions; memo: boolean }
  | { op: 'call'; id: number; handle: number; method: CallMethod; args: unknown[] }
  | { op: 'generate'; id: number; handle: number; req: Omit<GenerateRequest, 'signal'>; aborted: boolean }
  | { op: 'embed'; id: number; handle: number; inputs: string[]; inputTokens: number[][] | undefined; aborted: boolean }
  /** Aborts a generation or an embedding (its signal). */
  | { op: 'abort'; id: number }
  /** The node's thread has taken `n` more of a generation's chunks (the window it may run ahead). */
  | { op: 'credit'; id: number; n: number }
  /** Every adapter has stopped: end once the work under way has. */
  | { op: 'close' }
  /** The memo's answer to the thread's `memo-known`. */
  | { op: 'memo-answer'; id: number; known: boolean };

export interface Started {
  info: RuntimeInfo;
  probed: 'ran' | 'remembered' | 'off';
  file: { identity: FileIdentity; mapped: boolean } | undefined;
}

export type FromThread =
  | { op: 'result'; id: number; value: unknown }
  | { op: 'error'; id: number; error: WireError; chunks?: GeneratedChunk[] }
  /** A generation's next chunks, and with the last of them its result. */
  | { op: 'chunks'; id: number; chunks: GeneratedChunk[]; done?: GenerationResult }
  | { op: 'memo-known'; id: number; handle: number; key: string }
  | { op: 'memo-remember'; handle: number; key: string }
  /** A line llama.cpp wrote (the node logs them as its own JSON lines). */
  | { op: 'llama-line'; line: string };

export interface WireError {
  name: string;
  message: string;
  code?: string;
  timedOut?: boolean;
  /** Where it was thrown, on the runtime thread. */
  stack?: string;
  cause?: WireError;
}

export function encodeError(e: unknown, depth = 0): WireError {
  if (!(e instanceof Error)) return { name: 'Error', message: String(e) };
  const w: WireError = { name: e.name, message: e.message };
  const code = (e as { code?: unknown }).code;
  if (typeof code === 'string') w.code = code;
  if (e instanceof ModelProbeError) w.timedOut = e.timedOut;
  if (typeof e.stack === 'string') w.stack = e.stack;
  if (e.cause !== undefined && depth < 4) w.cause = encodeError(e.cause, depth + 1);
  return w;
}

/** The error again, as the class the node tells apart (others as an Error with the same name and message). */
export function decodeError(w: WireError): Error {
  let e: Error;
  if (w.name === 'RuntimeBusyError') e = new RuntimeBusyError(w.message);
  else if (w.name === 'UnsupportedInputError') e = new UnsupportedInputError(w.code ?? 'invalid_request', w.message);
  else if (w.name === 'ModelProbeError') e = new ModelProbeError(w.message, { timedOut: w.timedOut ?? false });
  else {
    e = new Error(w.message);
    e.name = w.name;
    if (w.code !== undefined) Object.assign(e, { code: w.code });
  }
  // Its stack is where it was thrown on the runtime thread, then where the node's thread took it.
  if (w.stack !== undefined) e.stack = `${w.stack}\n    (on the runtime thread; taken on the node's thread:)${e.stack?.slice(e.stack.indexOf('\n')) ?? ''}`;
  if (w.cause) e.cause = decodeError(w.cause);
  return e;
}
