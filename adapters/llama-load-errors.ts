// Why llama.cpp refused to load a model. node-llama-cpp's error says only "Failed to load model";
// llama.cpp says why in its log lines ("tensor 'output.weight' data is not within the file bounds",
// "tensor 'x' has invalid data"), which node-llama-cpp prints. They are printed as before (or, in
// the node, logged as its own JSON lines) and kept here, and a failed load's error names them.
// llama.cpp's lines go to the node-llama-cpp binding loaded last: a process that loads one (the
// node: CPU or GPU, not both) gets them all; otherwise a failed load keeps node-llama-cpp's own
// message.
import type { Llama, LlamaModel, LlamaModelOptions } from 'node-llama-cpp';

/** llama.cpp's latest error lines (at most 64), and how many it has written in all. */
const kept = { lines: [] as string[], count: 0 };

/** Where llama.cpp's lines go instead of node-llama-cpp's printing (the node's JSON log); undefined: printed. */
let sink: ((message: string) => void) | undefined;

/**
 * Sends llama.cpp's lines to `to` (the node logs them as JSON lines of its own, not raw text among
 * them) until the returned function undoes it; they are kept for load errors either way. Process-wide,
 * as the binding is: the latest caller has them.
 */
export function sendLlamaLines(to: (message: string) => void): () => void {
  sink = to;
  return () => {
    if (sink === to) sink = undefined;
  };
}

/**
 * A llama.cpp line from the runtime thread (runtime-thread.ts), whose binding has the lines: sent
 * where sendLlamaLines says on this thread, or printed as node-llama-cpp prints them.
 */
export function llamaLineFromThread(message: string): void {
  if (sink) sink(message);
  else process.stderr.write(`[node-llama-cpp] ${message.endsWith('\n') ? message : `${message}\n`}`);
}

/** Keeps the binding's llama.cpp lines (printed as before, or sent where sendLlamaLines says); returns the binding. */
export function keepErrorLines(llama: Llama): Llama {
  const print = llama.logger;
  llama.logger = (level, message) => {
    kept.lines.push(message);
    if (kept.lines.length > 64) kept.lines.shift();
    kept.count++;
    if (sink) sink(message);
    else print(level, message);
  };
  return llama;
}

let loads: Promise<unknown> = Promise.resolve();

/**
 * llama.loadModel, one load at a time in the process (so that a failed load's lines are its own);
 * a failure names llama.cpp's reason, the file first.
 */
export function loadNamingWhy(llama: Llama, modelPath: string, opts: Omit<LlamaModelOptions, 'modelPath'>): Promise<LlamaModel> {
  const load = async (): Promise<LlamaModel> => {
    const from = kept.count;
    try {
      return await llama.loadModel({ ...opts, modelPath });
    } catch (e) {
      throw await loadFailure(from, modelPath, e);
    }
  };
  const run = loads.then(load, load);
  loads = run.catch(() => undefined);
  return run;
}

/** llama.cpp's error lines after the `from`th. */
function linesSince(from: number): string[] {
  const n = Math.min(kept.lines.length, kept.count - from);
  return n > 0 ? kept.lines.slice(-n) : [];
}

/**
 * Why llama.cpp refused to load a model, from its error lines after the `from`th, when they say.
 * They reach JavaScript from llama.cpp's thread on their own way, maybe after the failed load
 * does: up to ~0.2 s is given for its closing line ("failed to load model").
 */
async function loadFailure(from: number, path: string, e: unknown): Promise<Error> {
  for (let i = 0; i < 10 && !linesSince(from).some((l) => /failed to load model/.test(l)); i++) await new Promise((r) => setTimeout(r, 20));
  const lines = linesSince(from);
  const invalid = lines.map((l) => /tensor '([^']{1,80})' has invalid data/.exec(l)?.[1]).filter((t) => t !== undefined);
  if (invalid.length) return new Error(`${path}: tensor ${invalid.map((t) => `'${t}'`).join(', ')} holds NaN or infinite values (a corrupt file): llama.cpp refuses to load it`, { cause: e });
  const why = lines.map((l) => /error loading model: (.{1,300})/.exec(l)?.[1]?.trim()).find((w) => w !== undefined);
  return why ? new Error(`${path}: llama.cpp could not load it: ${why}`, { cause: e }) : (e as Error);
}

/**
 * A start failure's message with the model file named once, `model file <path>: …` (the model
 * checks name the file themselves); undefined when it does not name the file.
 */
export function namingModelFile(modelPath: string, message: string): string | undefined {
  if (message.startsWith(`model file ${modelPath}`)) return message;
  return message.startsWith(modelPath) ? `model file ${message}` : undefined;
}
