// The model probe's child process (model-probe.ts): loads a model as the embedded runtime would and
// runs what every kind of request will: the tokenizer over every byte and a few scripts, each token
// back to text, a few greedy tokens of a short prompt, and an embedding. What llama.cpp aborts on
// kills this process, not the node. Prints "ok" when all of it ran; a JavaScript error exits 1
// (the node's own load then says why, with the file named).
import { getLlama, LlamaLogLevel, type Token } from 'node-llama-cpp';

const [modelPath, gpuArg, mmapArg] = process.argv.slice(2);
if (!modelPath) throw new Error('usage: model-probe-child MODEL auto|false true|false');
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
process.stdout.write('ok');
process.exit(0);
