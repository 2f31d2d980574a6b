import fs from 'node:fs';
import { Command } from 'commander';
import { createKeyFile } from '../identity.ts';
import { dataDirPaths } from '../data-dir.ts';
import { defaultConfigYaml } from '../config.ts';

export function initCommand(): Command {
  return new Command('init')
    .description('create the node key (mode 0600) and a default config; prints the provider id')
    .requiredOption('--data <dir>', 'data directory to create or use')
    .action((opts: { data: string }) => {
      const p = dataDirPaths(opts.data);
      fs.mkdirSync(p.dir, { recursive: true, mode: 0o700 });
      const id = createKeyFile(p.key);
      if (!fs.existsSync(p.config)) fs.writeFileSync(p.config, defaultConfigYaml(), { mode: 0o600 });
      process.stdout.write(`${id.providerId}\n`);
      process.stderr.write(`key: ${p.key}\nconfig: ${p.config}\n`);
    });
}
