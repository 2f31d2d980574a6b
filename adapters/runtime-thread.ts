// The embedded runtime on a thread of its own: LlamaThreadAdapter is the RuntimeAdapter a serving
// node uses, and runs a LlamaEmbeddedAdapter in the process's runtime thread
// (runtime-thread-worker.ts), one thread for every model of the process (one llama.cpp binding,
// whose log lines the adapter reads). On the node's own thread, node-llama-cpp's token loop waited
// behind the relay's work between two tokens (streaming ran at ~0.91-0.94 of the runtime alone);
// on its own it runs as it does alone (docs/decisions.md, "The runtime thread"). Behaviour is the
// embedded adapter's: the same answers, errors of the same classes, a signal that stops a run
// within a token, a run closed early that gives its slot back before its close resolves.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { LlamaEmbeddedOptions } from './llama-embedded.ts';
import { llamaLineFromThread } from './llama-load-errors.ts';
import { LoadedModelFile, type ModelFileState } from './model-file.ts';
import type { ChatMessage, EmbeddingResult, GeneratedChunk, GenerateRequest, GenerationInput, GenerationResult, RuntimeAdapter, RuntimeInfo } from './runtime-adapter.ts';
import { decodeError, type CallMethod, type FromThread, type Started, type ToThread } from './runtime-thread-messages.ts';

/** The thread's file, beside this one (.ts in the source tree, .js once built). */
const WORKER_FILE = fileURLToPath(new URL(`./runtime-thread-worker${path.extname(fileURLToPath(import.meta.url))}`, import.meta.url));

/** How long the last adapter's stop waits for the runtime thread to end by itself. */
const ENDING_MS = 5000;

type Batch = { chunks: GeneratedChunk[]; done?: GenerationResult; error?: Error };

/** A generation's messages as they come, for the adapter's generator to read. */
class ChunkStream {
  private readonly queue: Batch[] = [];
  private wake: (() => void) | undefined;
  ended = false;
  readonly closed: Promise<void>;
  private close!: () => void;

  constructor() {
    this.closed = new Promise((resolve) => (this.close = resolve));
  }

  push(b: Batch): void {
    if (b.done || b.error) {
      this.ended = true;
      this.close();
    }
    this.queue.push(b);
    this.wake?.();
    this.wake = undefined;
  }

  async next(): Promise<Batch> {
    while (this.queue.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
    return this.queue.shift()!;
  }
}

type Pending = { resolve: (v: unknown) => void; reject: (e: Error) => void } | { stream: ChunkStream };

/** The process's runtime thread, shared by its adapters; it ends when the last of them stops. */
class RuntimeThread {
  private static shared: RuntimeThread | undefined;
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  readonly adapters = new Map<number, LlamaThreadAdapter>();
  private nextId = 1;
  private users = 0;
  private failure: Error | undefined;
  /** Set when the last adapter stopped and the thread is being ended (not a failure to report). */
  private ending = false;
  private readonly exited: Promise<unknown>;

  static acquire(): RuntimeThread {
    const t = (RuntimeThread.shared ??= new RuntimeThread());
    t.users++;
    return t;
  }

  /** Whether the process has a runtime thread (for tests: it must end with its last adapter). */
  static get running(): boolean {
    return RuntimeThread.shared !== undefined;
  }

  /** Ends the process's runtime thread as a crash there would (tests). */
  static async crash(): Promise<void> {
    await RuntimeThread.shared?.worker.terminate();
  }

  private constructor() {
    this.worker = new Worker(WORKER_FILE);
    this.worker.on('message', (m: FromThread) => this.received(m));
    this.worker.on('error', (e: Error) => this.fail(new Error(`the runtime thread failed: ${e.message}`, { cause: e })));
    this.exited = new Promise((resolve) => this.worker.once('exit', resolve));
    this.worker.on('exit', (code) => this.fail(new Error(`the runtime thread ended (exit code ${code})`)));
  }

  /**
   * One adapter less; the last asks the thread to end by itself once its work has (ending a thread
   * while a llama.cpp call or its last log lines are under way aborts the process), and resolves
   * when it has, or after ENDING_MS (the thread then no longer holds the process up).
   */
  async release(): Promise<void> {
    if (--this.users > 0) return;
    if (RuntimeThread.shared === this) RuntimeThread.shared = undefined;
    this.ending = true;
    if (this.failure) return;
    this.worker.postMessage({ op: 'close' } satisfies ToThread);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.exited, new Promise((resolve) => (timer = setTimeout(resolve, ENDING_MS)))]);
    clearTimeout(timer);
    this.worker.unref();
  }

  id(): number {
    return this.nextId++;
  }

  /** Tells the thread the node has taken `n` more of a generation's chunks. */
  credit(id: number, n: number): void {
    if (!this.failure) this.worker.postMessage({ op: 'credit', id, n } satisfies ToThread);
  }

  /** Aborts a generation or an embedding (nothing when it has ended, or the thread has). */
  abort(id: number): void {
    if (!this.failure) this.worker.postMessage({ op: 'abort', id } satisfies ToThread);
  }

  /** Sends a message whose answer is one result (or error). */
  ask<T>(make: (id: number) => ToThread): Promise<T> {
    if (this.failure) return Promise.reject(this.failure);
    const id = this.id();
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.worker.postMessage(make(id));
    });
  }

  /** Sends a generation, whose answer is chunks until its result (or an error). */
  open(make: (id: number) => ToThread): { id: number; stream: ChunkStream } {
    const stream = new ChunkStream();
    const id = this.id();
    if (this.failure) stream.push({ chunks: [], error: this.failure });
    else {
      this.pending.set(id, { stream });
      this.worker.postMessage(make(id));
    }
    return { id, stream };
  }

  private received(m: FromThread): void {
    if (m.op === 'memo-known') {
      void (async () => {
        let known = false;
        try {
          known = (await this.adapters.get(m.handle)?.memo?.known(m.key)) ?? false;
        } catch {
          // (a memo that cannot answer: the probe runs)
        }
        this.worker.postMessage({ op: 'memo-answer', id: m.id, known } satisfies ToThread);
      })();
      return;
    }
    if (m.op === 'llama-line') {
      llamaLineFromThread(m.line);
      return;
    }
    if (m.op === 'memo-remember') {
      void Promise.resolve()
        .then(() => this.adapters.get(m.handle)?.memo?.remember(m.key))
        .catch(() => undefined);
      return;
    }
    const p = this.pending.get(m.id);
    if (!p) return;
    if ('stream' in p) {
      if (m.op === 'chunks') p.stream.push(m.done ? { chunks: m.chunks, done: m.done } : { chunks: m.chunks });
      else if (m.op === 'error') p.stream.push({ chunks: m.chunks ?? [], error: decodeError(m.error) });
      if (p.stream.ended) this.pending.delete(m.id);
      return;
    }
    this.pending.delete(m.id);
    if (m.op === 'result') p.resolve(m.value);
    else if (m.op === 'error') p.reject(decodeError(m.error));
  }

  private fail(e: Error): void {
    if (this.failure) return;
    this.failure = e;
    if (RuntimeThread.shared === this) RuntimeThread.shared = undefined;
    if (!this.ending) for (const a of this.adapters.values()) a.threadFailed(e);
    for (const p of this.pending.values()) {
      if ('stream' in p) p.stream.push({ chunks: [], error: e });
      else p.reject(e);
    }
    this.pending.clear();
  }
}

export interface LlamaThreadOptions extends LlamaEmbeddedOptions {
  /**
   * Told once when the runtime thread failed (it ended by itself: an uncaught error there) while
   * this adapter was started: every call fails from then on, and the node should be restarted.
   */
  onFailure?: (e: Error) => void;
}

export class LlamaThreadAdapter implements RuntimeAdapter {
  private readonly opts: LlamaThreadOptions;
  private thread: RuntimeThread | undefined;
  private failed: Error | undefined;
  /** A start or stop under way: the next waits for it (a stop during a start stops what the start loaded). */
  private busy: Promise<unknown> = Promise.resolve();
  private handle = 0;
  private file: LoadedModelFile | undefined;
  info: RuntimeInfo = { adapter: 'llama-embedded', version: '', modelSha256: '', contextLength: 0, embeddingLength: 0, chatTemplate: null };
  /** What the latest start did about the child-process probe (as the embedded adapter's). */
  probed: 'ran' | 'remembered' | 'off' = 'off';

  constructor(opts: LlamaThreadOptions) {
    this.opts = opts;
  }

  /** Why this adapter can no longer serve: its runtime thread failed (undefined while it can). */
  failure(): Error | undefined {
    return this.failed;
  }

  /** (RuntimeThread: the thread failed while this adapter was started.) */
  threadFailed(e: Error): void {
    if (this.failed) return;
    this.failed = e;
    this.opts.onFailure?.(e);
  }

  /** Whether the process has a runtime thread. */
  static get threadRunning(): boolean {
    return RuntimeThread.running;
  }

  /** Ends the process's runtime thread as an uncaught error there would: for tests of what follows. */
  static crashThreadForTests(): Promise<void> {
    return RuntimeThread.crash();
  }

  get memo() {
    return this.opts.probe?.memo;
  }

  start(): Promise<void> {
    return this.inTurn(() => this.startNow());
  }

  private async startNow(): Promise<void> {
    if (this.thread) throw new Error('the embedded runtime is already started (stop it first)');
    this.failed = undefined;
    const thread = RuntimeThread.acquire();
    this.thread = thread;
    this.handle = thread.id();
    thread.adapters.set(this.handle, this);
    const { probe, onFailure: _, ...rest } = this.opts;
    try {
      const started = await thread.ask<Started>((id) => ({ op: 'start', id, handle: this.handle, opts: { ...rest, ...(probe ? { probe: probe.timeoutMs !== undefined ? { timeoutMs: probe.timeoutMs } : {} } : {}) }, memo: probe?.memo !== undefined }));
      this.info = started.info;
      this.probed = started.probed;
      this.file = started.file ? new LoadedModelFile(this.opts.modelPath, started.file.identity, started.file.mapped) : undefined;
    } catch (e) {
      await this.detach();
      throw e;
    }
  }

  /** Stops the model (after a start under way, which it undoes); stops at once share one. */
  stop(): Promise<void> {
    return this.inTurn(() => this.stopNow());
  }

  /** Runs a start or a stop once those before it have ended. */
  private inTurn(step: () => Promise<void>): Promise<void> {
    const done = this.busy.then(step);
    this.busy = done.catch(() => undefined);
    return done;
  }

  private async stopNow(): Promise<void> {
    if (!this.thread) return;
    try {
      await this.call('stop', []);
    } catch (e) {
      if (!this.failed) throw e; // (a thread that failed has nothing loaded any more)
    } finally {
      await this.detach();
    }
  }

  private async detach(): Promise<void> {
    const thread = this.thread;
    this.thread = undefined;
    thread?.adapters.delete(this.handle);
    await thread?.release();
  }

  private get t(): RuntimeThread {
    if (!this.thread) throw new Error('the embedded runtime is not started');
    return this.thread;
  }

  private async call<T>(method: CallMethod, args: unknown[]): Promise<T> {
    const t = this.t;
    return await t.ask<T>((id) => ({ op: 'call', id, handle: this.handle, method, args }));
  }

  tokenize(text: string, opts?: { special?: boolean }): Promise<number[]> {
    return this.call('tokenize', opts === undefined ? [text] : [text, opts]);
  }

  detokenize(tokens: number[]): Promise<string> {
    return this.call('detokenize', [tokens]);
  }

  renderChat(messages: ChatMessage[]): Promise<string> {
    return this.call('renderChat', [messages]);
  }

  inputTokens(input: GenerationInput, opts?: { atMost?: number }): Promise<number[]> {
    return this.call('inputTokens', opts === undefined ? [input] : [input, opts]);
  }

  countInputTokens(input: GenerationInput): Promise<number> {
    return this.call('countInputTokens', [input]);
  }

  async *generate(req: GenerateRequest): AsyncGenerator<GeneratedChunk, GenerationResult, void> {
    const t = this.t;
    const { signal, ...rest } = req;
    // (an input already tokenised is not copied across: the runtime evaluates the tokens)
    const sent = rest.inputTokens ? { ...rest, input: { kind: 'prompt' as const, prompt: '' } } : rest;
    const { id, stream } = t.open((id) => ({ op: 'generate', id, handle: this.handle, req: sent, aborted: signal?.aborted ?? false }));
    const abort = () => {
      if (!stream.ended) t.abort(id);
    };
    signal?.addEventListener('abort', abort, { once: true });
    try {
      for (;;) {
        const b = await stream.next();
        for (const c of b.chunks) yield c;
        if (b.chunks.length > 0 && !stream.ended) t.credit(id, b.chunks.length);
        if (b.error) throw b.error;
        if (b.done) return b.done;
      }
    } finally {
      signal?.removeEventListener('abort', abort);
      // Closed early: the run stops within a token, and its slot is free once it has ended.
      if (!stream.ended) {
        abort();
        await stream.closed;
      }
    }
  }

  async embed(inputs: string[], inputTokens?: number[][], signal?: AbortSignal): Promise<EmbeddingResult> {
    const t = this.t;
    let id = 0;
    const abort = () => t.abort(id);
    const result = t.ask<EmbeddingResult>((i) => {
      id = i;
      return { op: 'embed', id: i, handle: this.handle, inputs, inputTokens, aborted: signal?.aborted ?? false };
    });
    signal?.addEventListener('abort', abort, { once: true });
    try {
      return await result;
    } finally {
      signal?.removeEventListener('abort', abort);
    }
  }

  modelFileState(): ModelFileState {
    return this.file?.state() ?? 'unchanged';
  }
}
