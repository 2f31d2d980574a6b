// What llama.cpp aborts on (a GGML_ASSERT: a head count its kv heads do not divide, and rarer
// shapes each fuzzing round finds) kills the process it runs in. Before the node loads a model, a
// child process loads it and runs a short sample of what requests do (model-probe-child.ts); a
// model that kills the child is refused, naming llama.cpp's assertion, and the node stays up. The
// verdict is kept (ProbeMemo, keyed by the file's SHA-256, the runtime's version, the device and mmap):
// a restart on the same file does not probe again.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export class ModelProbeError extends Error {
  override name = 'ModelProbeError';
  /** The child was still loading or running when its time was up (not a crash): a longer timeout may let it pass. */
  readonly timedOut: boolean;
  constructor(message: string, opts: { timedOut?: boolean } = {}) {
    super(message);
    this.timedOut = opts.timedOut ?? false;
  }
}

/** Where verdicts are kept: `known` a model that passed, `remember` one that did (told again after each start it passed or was known). */
export interface ProbeMemo {
  known(key: string): boolean | Promise<boolean>;
  remember(key: string): void | Promise<void>;
}

export interface ProbeOptions {
  modelPath: string;
  gpu: 'auto' | false;
  mmap: boolean;
  /** How long loading and running may take (default 10 minutes: a large model on a slow disk). */
  timeoutMs?: number;
}

/**
 * `e`'s message, and when it is (or was caused by) a probe whose time ran out, what allows more:
 * ` (<how> allows a slower load)`, `how` naming the caller's setting.
 */
export function withProbeTimeoutHint(e: unknown, how: string): string {
  const message = (e as Error | undefined)?.message ?? String(e);
  for (let x = e; x instanceof Error; x = x.cause) if (x instanceof ModelProbeError) return x.timedOut ? `${message} (${how} allows a slower load)` : message;
  return message;
}

/** What a verdict holds for: the file's bytes (their SHA-256), the runtime that ran them (its version and device) and mmap. */
export function probeKey(sha256: string, runtime: string, mmap: boolean): string {
  return JSON.stringify([sha256, runtime, mmap]);
}

/** The child's file, beside this one (.ts in the source tree, .js once built). */
export const PROBE_CHILD = fileURLToPath(new URL(`./model-probe-child${path.extname(fileURLToPath(import.meta.url))}`, import.meta.url));

/** What the child prints: `ok` when all of it ran, `js-error` when JavaScript refused the model (the node's own load then says why). */
export const PROBE_OK = 'ok';
export const PROBE_JS_ERROR = 'js-error';

/**
 * Resolves `true` when a child process loaded the model and ran it, `false` when JavaScript
 * refused the model there (the node's own load then names the problem, and nothing is
 * remembered); throws ModelProbeError when llama.cpp killed the child, it did not finish in time,
 * or it could not run at all.
 */
export async function probeModel(opts: ProbeOptions, child = PROBE_CHILD): Promise<boolean> {
  const timeoutMs = opts.timeoutMs ?? 600_000;
  // (the child ends itself when this process goes, even by SIGKILL: model-probe-child.ts)
  const proc = spawn(process.execPath, [child, opts.modelPath, String(opts.gpu), String(opts.mmap), String(process.pid)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stdout!.setEncoding('utf8').on('data', (d: string) => (out = (out + d).slice(-100)));
  proc.stderr!.setEncoding('utf8').on('data', (d: string) => (err = (err + d).slice(-8000)));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    proc.kill('SIGKILL');
  }, timeoutMs);
  const [code, signal, spawnError] = await new Promise<[number | null, NodeJS.Signals | null, Error | undefined]>((resolve) => {
    proc.once('error', (e) => resolve([null, null, e]));
    proc.once('close', (c, s) => resolve([c, s, undefined]));
  }).finally(() => clearTimeout(timer));
  if (code === 0 && out === PROBE_OK) return true;
  if (code === 2 && out === PROBE_JS_ERROR) return false;
  if (timedOut) throw new ModelProbeError(`llama.cpp did not load and run it within ${timeoutMs / 1000} s in a child process: the node would hang on it`, { timedOut: true });
  if (signal) throw new ModelProbeError(`llama.cpp crashed loading or running it in a child process (${signal})${crashLine(err)}: the node would have died with it`);
  // The probe itself could not run (its file missing from an install, no process): the model is
  // not known to be safe, so it is not loaded.
  const why = spawnError?.message ?? `exit code ${code}${lastLine(err)}`;
  throw new ModelProbeError(`the model probe (${child}) could not run: ${why}; the node loads no model it could not probe`);
}

/** llama.cpp's own last word before it aborted, without the build machine's path; '' when it said none. */
export function crashLine(stderr: string): string {
  const lines = stderr.split('\n').map((l) => l.trim());
  const assert = lines.map((l) => /(GGML_ASSERT\(.*\) failed)/.exec(l)?.[1]).filter((l) => l !== undefined).pop();
  // ggml_abort prints "<file>:<line>: <message>" (GGML_ASSERT and GGML_ABORT alike).
  const abort = lines.map((l) => /\.(?:c|cc|cpp|h|hpp):\d+: (.+)$/.exec(l)?.[1]).filter((l) => l !== undefined).pop();
  const heap = lines.find((l) => /JavaScript heap out of memory/.test(l)) ? 'JavaScript heap out of memory' : undefined;
  const said = assert ?? abort ?? heap;
  return said ? `: ${said.slice(0, 300)}` : '';
}

/** What a child that failed said: its error line (Node ends with its own version line), else its last line. */
function lastLine(stderr: string): string {
  const lines = stderr.split('\n').map((l) => l.trim()).filter((l) => l !== '' && !/^Node\.js v\d/.test(l));
  const line = lines.filter((l) => /^(?:[A-Z]\w*)?Error\b/.test(l)).pop() ?? lines.pop();
  return line ? `: ${line.slice(0, 300)}` : '';
}
