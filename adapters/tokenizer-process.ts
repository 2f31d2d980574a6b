// Long texts are tokenised in a child process (tokenizer-child.ts) with the model's vocabulary
// alone, so that llama.cpp's tokenizer, synchronous and quadratic on some texts, never holds the
// node's event loop (s24 hB: 104,000 "<unk>" held a node 13.8 s, 262,000 "é" 9.6 s, and every
// request, /healthz and heartbeat with it). One text at a time, each bounded by a deadline: past
// it the child is killed (started again for the next text) and the text is refused. Large chats
// are rendered there too, with the model's chat template, under the same deadline. Its JavaScript
// heap is capped (`maxHeapMiB`): a text or chat that needs more ends the child, not the node's
// host's memory, and is refused as one past the deadline is.
import { fork, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const CHILD = fileURLToPath(new URL(`./tokenizer-child${path.extname(fileURLToPath(import.meta.url))}`, import.meta.url));
/** How long the child may take to load the vocabulary. */
const START_MS = 60_000;

/** The text was not tokenised (or the chat not rendered) within the deadline (the child was killed). */
export class TokenizeDeadlineError extends Error {
  override name = 'TokenizeDeadlineError';
}

/** The child ran out of its heap (`maxHeapMiB`) on the text or chat. */
export class TokenizeMemoryError extends Error {
  override name = 'TokenizeMemoryError';
}

/** As many texts wait for the child as it queues (`maxWaiting`): this one was not queued. */
export class TokenizerBusyError extends Error {
  override name = 'TokenizerBusyError';
}

/** The chat template refused the messages (its raise_exception, or a shape it cannot handle). */
export class TemplateRefusedError extends Error {
  override name = 'TemplateRefusedError';
}

/** What the child answers a text or a chat with. */
interface Answer {
  id?: number;
  tokens?: Int32Array;
  text?: string;
  refused?: string;
  error?: string;
}

export class TokenizerProcess {
  private readonly modelPath: string;
  readonly deadlineMs: number;
  private child: ChildProcess | undefined;
  private ready: Promise<ChildProcess> | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  private nextId = 1;
  private stopped = false;
  /** At most this many texts wait behind the one under way (each may take up to the deadline). */
  readonly maxWaiting: number;
  private waiting = 0;
  /** The child's V8 heap limit (--max-old-space-size): 8 MiB of messages, their rendering and their tokens fit many times over. */
  readonly maxHeapMiB: number;
  /** The end of each child's stderr (why it failed to load; where V8 says it ran out of heap). */
  private readonly stderr = new WeakMap<ChildProcess, string>();
  private stderrOf(child: ChildProcess): string {
    return this.stderr.get(child) ?? '';
  }

  constructor(modelPath: string, deadlineMs: number, opts: { maxWaiting?: number; maxHeapMiB?: number } = {}) {
    this.modelPath = modelPath;
    this.deadlineMs = deadlineMs;
    this.maxWaiting = opts.maxWaiting ?? 8;
    this.maxHeapMiB = opts.maxHeapMiB ?? 512;
  }

  /** The tokens of `pieces` laid end to end, each tokenised on its own; one text at a time. */
  tokenize(pieces: string[], special: boolean): Promise<Int32Array> {
    return this.queued(() => this.one({ pieces, special }, 'the text was', 'tokenised', (m) => m.tokens));
  }

  /** `template` rendered with `messages` (add_generation_prompt, bos_token, eos_token), as the node's own Jinja renders it. */
  render(template: string, messages: unknown[], tokens: { bos: string; eos: string }): Promise<string> {
    return this.queued(() => this.one({ render: { template, messages, bos: tokens.bos, eos: tokens.eos } }, 'the chat was', 'rendered', (m) => m.text));
  }

  private queued<T>(run: () => Promise<T>): Promise<T> {
    if (this.waiting >= this.maxWaiting) return Promise.reject(new TokenizerBusyError(`${this.waiting} long inputs are waiting for the tokenizer process already`));
    this.waiting++;
    const next = this.queue.then(() => {
      this.waiting--;
      return run();
    });
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** Starts the child now, in the background (what fails is said at the first text). */
  warm(): void {
    if (!this.stopped) this.start().catch(() => undefined);
  }

  /** Ends the child (a text under way is refused). */
  stop(): void {
    this.stopped = true;
    this.child?.kill('SIGKILL');
    this.child = undefined;
    this.ready = undefined;
  }

  /** `child` is no longer the one to ask (it ended, or is being killed). */
  private forget(child: ChildProcess): void {
    if (this.child !== child) return;
    this.child = undefined;
    this.ready = undefined;
  }

  private start(): Promise<ChildProcess> {
    if (this.ready) return this.ready;
    const execArgv = [...process.execArgv.filter((a) => !a.startsWith('--max-old-space-size')), `--max-old-space-size=${this.maxHeapMiB}`];
    const child = fork(CHILD, [this.modelPath], { serialization: 'advanced', stdio: ['ignore', 'ignore', 'pipe', 'ipc'], execArgv });
    this.child = child;
    child.stderr?.on('data', (b: Buffer) => this.stderr.set(child, (this.stderrOf(child) + b.toString('utf8')).slice(-2000)));
    const gone = () => this.forget(child);
    child.on('exit', gone);
    child.on('error', gone);
    this.ready = new Promise<ChildProcess>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`the tokenizer process did not load ${this.modelPath} within ${START_MS / 1000} s`));
      }, START_MS);
      const done = (e?: Error) => {
        clearTimeout(timer);
        child.off('message', onMessage);
        child.off('exit', onExit);
        // Idle, the child never keeps the node's process alive (a text under way refs it: one()).
        child.unref();
        child.channel?.unref();
        if (e) reject(e);
        else resolve(child);
      };
      const onMessage = (m: { ready?: boolean; error?: string }) => {
        if (m.ready === true) done();
        else if (m.ready === false) done(new Error(`the tokenizer process could not load ${this.modelPath}: ${m.error ?? 'unknown error'}`));
      };
      const onExit = (code: number | null, signal: string | null) => {
        const err = this.stderrOf(child);
        done(new Error(`the tokenizer process ended (${signal ?? `exit code ${code}`}) before it loaded ${this.modelPath}${err ? `: ${err.trim().split('\n').pop()}` : ''}`));
      };
      child.on('message', onMessage);
      child.on('exit', onExit);
    });
    this.ready.catch(() => gone());
    return this.ready;
  }

  private async one<T>(ask: object, what: string, done: string, pick: (m: Answer) => T | undefined): Promise<T> {
    if (this.stopped) throw new Error('the tokenizer process is stopped');
    const child = await this.start();
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        finish();
        this.forget(child); // (the next text starts another now, not when this one's exit comes)
        child.kill('SIGKILL');
        reject(new TokenizeDeadlineError(`not ${done} within ${this.deadlineMs / 1000} s`));
      }, this.deadlineMs);
      const onMessage = (m: Answer) => {
        if (m.id !== id) return;
        finish();
        const value = pick(m);
        if (value !== undefined) resolve(value);
        else if (m.refused !== undefined) reject(new TemplateRefusedError(m.refused));
        else reject(new Error(`the tokenizer process failed: ${m.error ?? 'unknown error'}`));
      };
      // ('close', not 'exit': by then its stderr has been read, and says whether V8 ran out of heap.)
      const onExit = (code: number | null, signal: string | null) => {
        finish();
        if (/heap out of memory/i.test(this.stderrOf(child))) reject(new TokenizeMemoryError(`more than ${this.maxHeapMiB} MiB`));
        else reject(new Error(`the tokenizer process ended (${signal ?? `exit code ${code}`}) before ${what} ${done}`));
      };
      const finish = () => {
        clearTimeout(timer);
        child.off('message', onMessage);
        child.off('close', onExit);
        child.channel?.unref();
      };
      child.on('message', onMessage);
      child.on('close', onExit);
      child.channel?.ref();
      child.send({ id, ...ask });
    });
  }
}
