// seller-node check-model: the checks `seller-node start` runs on a model file before it serves it
// (the GGUF reader and llama.cpp's bounds, the load in a child process, every weight for NaN and
// infinity, two greedy tokens, the chat template), without a config or a data dir: an operator
// checks a download before a node depends on it.
import fs from 'node:fs';
import path from 'node:path';
import { Command, Option } from 'commander';
import { CliError, intOption } from './cli-error.ts';

export function checkModelCommand(): Command {
  return new Command('check-model')
    .summary('check a model file as start would')
    .description("run the checks `start` runs on a model file (GGUF, a load and run in a child process, the weights, the chat template); exit 0 when it would be served")
    .argument('<file>', 'the GGUF model file')
    .addOption(new Option('--gpu <setting>', 'auto (the GPU when the host has one) or false (the CPU only), as the config\'s gpu').choices(['auto', 'false']).default('auto'))
    .option('--mmap', 'map the file, as models[].mmap: true', false)
    .option('--context <n>', 'the context length to open (default: the model\'s, at most 4096)', intOption('--context', 16, 2 ** 31 - 1))
    .option('--probe-timeout <s>', 'seconds the load and run in a child process may take, as models[].probe_timeout_s', intOption('--probe-timeout', 1, 86_400), 600)
    .action(async (file: string, opts: { gpu: 'auto' | 'false'; mmap: boolean; context?: number; probeTimeout: number }) => {
      const modelPath = path.resolve(file);
      if (!fs.existsSync(modelPath)) throw new CliError(`model file ${modelPath} not found`);
      // (node-llama-cpp loaded only here: the other commands start fast)
      const { LlamaEmbeddedAdapter } = await import('../../adapters/llama-embedded.ts');
      const { withProbeTimeoutHint } = await import('../../adapters/model-probe.ts');
      const { namingModelFile } = await import('../../adapters/llama-load-errors.ts');
      const adapter = new LlamaEmbeddedAdapter({ modelPath, gpu: opts.gpu === 'auto' ? 'auto' : false, mmap: opts.mmap, probe: { timeoutMs: opts.probeTimeout * 1000 }, ...(opts.context ? { contextLength: opts.context } : {}) });
      try {
        await adapter.start();
      } catch (e) {
        const msg = withProbeTimeoutHint(e, '--probe-timeout S');
        throw new CliError(namingModelFile(modelPath, msg) ?? `model file ${modelPath}: ${msg}`);
      }
      try {
        const i = adapter.info;
        process.stdout.write(`${modelPath}: would be served\n  sha256 ${i.modelSha256}\n  runtime ${i.version}\n  context ${i.contextLength}, embedding length ${i.embeddingLength}\n  chat template ${i.chatTemplate === null ? 'none (completions only)' : 'yes'}\n`);
      } finally {
        await adapter.stop();
      }
    });
}
