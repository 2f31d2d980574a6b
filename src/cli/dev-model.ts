import path from 'node:path';
import { Command } from 'commander';
import { writeTinyLlama } from '../../adapters/gguf/tiny-llama.ts';
import { fileSha256 } from '../../adapters/file-sha256.ts';
import { CliError, intOption } from './cli-error.ts';
import { fsProblem } from '../fs-problem.ts';

export function devModelCommand(): Command {
  return new Command('dev-model')
    .summary('write the tiny test model (GGUF)')
    .description('write the tiny deterministic llama GGUF (about 1 MB) that tests and the demo serve')
    .requiredOption('--out <file>', 'where to write the .gguf file')
    .option('--seed <n>', 'weight seed (the same seed writes the same bytes)', intOption('--seed', 0, 2 ** 31 - 1), 1)
    .action(async (opts: { out: string; seed: number }) => {
      let bytes: number;
      try {
        bytes = writeTinyLlama(opts.out, { seed: opts.seed });
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        const why = code === 'ENOENT' ? `no such folder: ${path.dirname(path.resolve(opts.out))}` : fsProblem(e);
        throw new CliError(`cannot write --out ${opts.out}: ${why}`);
      }
      process.stdout.write(`${path.resolve(opts.out)}\n`);
      process.stderr.write(`${bytes} bytes, sha256 ${await fileSha256(opts.out)}\n`);
    });
}
