// The model probe's child process (model-probe.ts): loads a model with the embedded runtime's GPU
// and mmap settings (not its tensor check: what it is after is a crash) and
// runs a short sample of what requests do: the tokenizer over the characters U+0001–U+00FF and a few scripts, with
// and without special tokens, each of those tokens back to text, four greedy tokens of a short
// prompt, and an embedding (a 256-token context, one sequence, one thread). What llama.cpp aborts
// on kills this process, not the node. Prints "ok" when all of it ran; "js-error" (exit 2) when
// JavaScript refused the model (the node's own load then says why, with the file named).
import { Worker } from 'node:worker_threads';
import { getLlama, LlamaLogLevel, type Token } from 'node-llama-cpp';
import { PROBE_JS_ERROR, PROBE_OK } from './model-probe.ts';

// The node went (stopped, killed): nothing is waiting for this probe. A thread of its own looks,
// since the main one may be held in native code (a read that never returns) when it happens.
// (The node names itself: it may be gone before this line runs, and the parent then is another.)
const [modelPath, gpuArg, mmapArg, parentArg] = process.argv.slice(2);
new Worker(
  `const { workerData } = require('node:worker_threads');
   const check = () => { if (process.ppid !== workerData) process.kill(process.pid, 'SIGKILL'); };
   check();
   setInterval(check, 200);`,
  { eval: true, workerData: Number(parentArg ?? process.ppid) },
).unref();

try {
  if (!modelPath) throw new Error('usage: model-probe-child MODEL auto|false true|false NODE_PID');
  const llama = await getLlama({ gpu: gpuArg === 'auto' ? 'auto' : false, build: 'never', logLevel: LlamaLogLevel.error, progressLogs: false });
  const model = await llama.loadModel({ modelPath, useMmap: mmapArg === 'true' });
  const context = await model.createContext({ contextSize: Math.min(256, model.trainContextSize), sequences: 1, threads: 1 });
  const bytes = Array.from({ length: 255 }, (_, i) => String.fromCharCode(i + 1)).join('');
  const text = `${bytes} héllo wörld, привет, 日本語のテキスト, مرحبا, 🙂👍🏽 ${model.tokens.bosString ?? ''}${model.tokens.eosString ?? ''}`;
  for (const special of [false, true]) {
    for (const t of model.tokenize(text, special)) model.detokenize([t], true);
  }
  const prompt = model.tokenize('The quick brown fox', false).slice(0, 32) as Token[];
  const bos = model.tokens.bos;
  const input = bos !== null && model.tokens.shouldPrependBosToken ? [bos, ...prompt] : prompt;
  let n = 0;
  for await (const token of context.getSequence().evaluate(input, { temperature: 0 })) {
    model.detokenize([token], false);
    if (++n >= 4) break;
  }
  const embedding = await model.createEmbeddingContext({ contextSize: Math.min(256, model.trainContextSize), threads: 1 });
  await embedding.getEmbeddingFor('hello world');
} catch {
  process.stdout.write(PROBE_JS_ERROR);
  process.exit(2);
}
process.stdout.write(PROBE_OK);
process.exit(0);
