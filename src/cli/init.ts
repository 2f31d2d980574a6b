import fs from 'node:fs';
import { Command } from 'commander';
import { createKeyFile } from '../identity.ts';
import { dataDirPaths } from '../data-dir.ts';
import { defaultConfigYaml } from '../config.ts';
import { folderProblem, fsProblem } from '../fs-problem.ts';
import { CliError } from './cli-error.ts';
import { writeAllSync, writeFileAtomic } from '../atomic-file.ts';
import { makeFolder } from '../make-folder.ts';

export function initCommand(): Command {
  return new Command('init')
    .summary('create the node key and a default config')
    .description('create the node key (mode 0600) and a default config; prints the provider id')
    .requiredOption('--data <dir>', 'data directory to create or use')
    .action((opts: { data: string }) => {
      const p = dataDirPaths(opts.data);
      try {
        makeFolder(p.dir, 0o700);
      } catch (e) {
        throw new CliError(`--data ${p.dir}: ${folderProblem(e)}`);
      }
      const id = createKeyFile(p.key);
      const kept = fs.existsSync(p.config); // (a config already there is the operator's: kept as it is)
      try {
        // (Whole or not at all: a config cut short by a full disk would fail every start.)
        if (!kept) writeFileAtomic(p.config, (fd) => writeAllSync(fd, defaultConfigYaml()), 0o600);
      } catch (e) {
        // The key was made by this run and nothing used it yet: it goes too, so init can run again.
        fs.rmSync(p.key, { force: true });
        throw new CliError(`${p.config}: ${fsProblem(e)}; the key was not kept either: run init again once there is room`);
      }
      process.stdout.write(`${id.providerId}\n`);
      process.stderr.write(`key: ${p.key}\nconfig: ${p.config}${kept ? ' (already there: kept as it is)' : ''}\n`);
    });
}
