// The seller-node command line: one Command per subcommand, each in its own module.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, CommanderError } from 'commander';
import { initCommand } from './init.ts';
import { logCommand } from './log.ts';
import { auditCommand } from './audit.ts';
import { verifyCommand } from './verify.ts';
import { demoCommand } from './demo.ts';
import { demoReceiptsCommand } from './demo-receipts.ts';
import { devModelCommand } from './dev-model.ts';
import { startCommand } from './start.ts';
import { marketCommand } from './market.ts';
import { gatewayCommand } from './gateway.ts';
import { CliError } from './cli-error.ts';

/** This package's version, from its package.json (found above this file, built or not). */
function ownVersion(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (let up = 0; up < 5; up++, dir = path.dirname(dir)) {
    try {
      const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')) as { name?: unknown; version?: unknown };
      if (pkg.name === 'seller-node' && typeof pkg.version === 'string') return pkg.version;
    } catch {
      // no package.json here: look further up
    }
  }
  return 'unknown';
}

function buildProgram(): Command {
  const program = new Command('seller-node')
    .description('Sell inference into a decentralised marketplace, with signed receipts anyone can verify.')
    .version(ownVersion(), '-V, --version')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s), writeOut: (s) => process.stdout.write(s) });
  for (const make of [initCommand, startCommand, logCommand, auditCommand, verifyCommand, devModelCommand, demoCommand, demoReceiptsCommand, marketCommand, gatewayCommand]) program.addCommand(make());
  return program;
}

/** Runs the CLI; returns the exit code. Errors go to stderr. */
export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) {
    c.exitOverride();
    c.showHelpAfterError('(run with --help for usage)');
  }
  try {
    await program.parseAsync(argv, { from: 'user' });
    return typeof process.exitCode === 'number' ? process.exitCode : 0;
  } catch (e) {
    if (e instanceof CommanderError) {
      // --help and --version end here with 0; every usage error exits 2, as CliError usage errors do.
      return e.exitCode === 0 ? 0 : 2;
    }
    if (e instanceof CliError) {
      process.stderr.write(`seller-node: ${e.message}\n`);
      return e.exitCode;
    }
    process.stderr.write(`seller-node: ${(e as Error)?.message ?? String(e)}\n`);
    return 1;
  }
}
