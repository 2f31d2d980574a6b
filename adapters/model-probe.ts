// What llama.cpp aborts on (a GGML_ASSERT: a head count its kv heads do not divide, and rarer
// shapes each fuzzing round finds) kills the process it runs in. Before the node loads a model, a
// child process loads it and runs what requests will (model-probe-child.ts); a model that kills
// the child is refused, naming llama.cpp's assertion, and the node stays up. The verdict is kept
// (ProbeMemo, keyed by the file's SHA-256 and the runtime's version): a restart on the same file
// does not probe again.
import { spawn } from 'node:child_process';
import path from 'node:path';

export class ModelProbeError extends Error {
  override name = 'ModelProbeError';
}

/** Where verdicts are kept: `known` a model that passed, `remember` one that did (told again after each start it passed or was known). */
export interface ProbeMemo {
  known(key: string): boolean;
  remember(key: string): void;
}

export interface ProbeOptions {
  modelPath: string;
  gpu: 'auto' | false;
  mmap: boolean;
  /** How long loading and running may take (default 10 minutes: a large model on a slow disk). */
  timeoutMs?: number;
}

/** What a verdict holds for: the file's bytes (their SHA-256), the runtime that ran them and how. */
export function probeKey(sha256: string, runtime: string, opts: Pick<ProbeOptions, 'gpu' | 'mmap'>): string {
  return JSON.stringify([sha256, runtime, opts.gpu, opts.mmap]);
}

const CHILD = new URL(`./model-probe-child${path.extname(new URL(import.meta.url).pathname)}`, import.meta.url);

/**
 * Resolves when a child process loaded the model and ran it, or failed with a JavaScript error (the
 * node's own load then names the problem); throws ModelProbeError when llama.cpp killed the child
 * or it did not finish in time.
 */
export async function probeModel(opts: ProbeOptions): Promise<void> {
  const timeoutMs = opts.timeoutMs ?? 600_000;
  const child = spawn(process.execPath, [CHILD.pathname, opts.modelPath, String(opts.gpu), String(opts.mmap)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out = (out + d).slice(-100)));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (err = (err + d).slice(-8000)));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    child.kill('SIGKILL');
  }, timeoutMs);
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
    child.once('error', reject); // (no process at all: the node's own load goes on to say what it can)
    child.once('close', (c, s) => resolve([c, s]));
  }).finally(() => clearTimeout(timer));
  if (code === 0 && out === 'ok') return;
  if (timedOut) throw new ModelProbeError(`llama.cpp did not load and run it within ${timeoutMs / 1000} s in a child process: the node would hang on it`);
  if (signal) throw new ModelProbeError(`llama.cpp crashed loading or running it in a child process (${signal})${crashLine(err)}: the node would have died with it`);
}

/** llama.cpp's own last word before it aborted (an assertion), without the build machine's path. */
function crashLine(stderr: string): string {
  const line = stderr.split('\n').filter((l) => /GGML_ASSERT|GGML_ABORT|error|fault|abort/i.test(l)).pop()?.trim();
  if (!line) return '';
  const assert = /(GGML_ASSERT\(.*\) failed|GGML_ABORT.*)$/.exec(line)?.[1] ?? line.replace(/^.*\/(ggml|src|llama\.cpp)\//, '');
  return `: ${assert.slice(0, 300)}`;
}
