import fs from 'node:fs';
import { Command } from 'commander';
import { createKeyFile } from '../identity.ts';
import { dataDirPaths } from '../data-dir.ts';
import { defaultConfigYaml } from '../config.ts';
import { fsProblem } from '../fs-problem.ts';
import { CliError } from './cli-error.ts';

export function initCommand(): Command {
  return new Command('init')
    .description('create the node key (mode 0600) and a default config; prints the provider id')
    .requiredOption('--data <dir>', 'data directory to create or use')
    .action((opts: { data: string }) => {
      const p = dataDirPaths(opts.data);
      try {
        fs.mkdirSync(p.dir, { recursive: true, mode: 0o700 });
      } catch (e) {
        throw new CliError(`--data ${p.dir}: ${fsProblem(e)}`);
      }
      const id = createKeyFile(p.key);
      try {
        if (!fs.existsSync(p.config)) fs.writeFileSync(p.config, defaultConfigYaml(), { mode: 0o600 });
      } catch (e) {
        throw new CliError(`${p.config}: ${fsProblem(e)}`);
      }
      process.stdout.write(`${id.providerId}\n`);
      process.stderr.write(`key: ${p.key}\nconfig: ${p.config}\n`);
    });
}
