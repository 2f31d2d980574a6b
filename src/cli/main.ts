// The seller-node command line: one Command per subcommand, each in its own module.
import { createRequire } from 'node:module';
import { Command, CommanderError } from 'commander';
import { initCommand } from './init.ts';
import { logCommand } from './log.ts';
import { auditCommand } from './audit.ts';
import { verifyCommand } from './verify.ts';
import { demoCommand } from './demo.ts';
import { demoReceiptsCommand } from './demo-receipts.ts';
import { devModelCommand } from './dev-model.ts';
import { checkModelCommand } from './check-model.ts';
import { startCommand } from './start.ts';
import { marketCommand } from './market.ts';
import { gatewayCommand } from './gateway.ts';
import { CliError } from './cli-error.ts';

/** This package's version: its own package.json, found by the package's name (exported for this). */
const VERSION = (createRequire(import.meta.url)('seller-node/package.json') as { version: string }).version;

function buildProgram(): Command {
  const program = new Command('seller-node')
    .description('Sell inference into a decentralised marketplace, with signed receipts anyone can verify.')
    .version(VERSION, '-V, --version')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s), writeOut: (s) => process.stdout.write(s) });
  for (const make of [initCommand, startCommand, logCommand, auditCommand, verifyCommand, devModelCommand, checkModelCommand, demoCommand, demoReceiptsCommand, marketCommand, gatewayCommand]) program.addCommand(make());
  return program;
}

/** Runs the CLI; returns the exit code. Errors go to stderr. */
export async function main(argv: string[]): Promise<number> {
  // A file size limit (ulimit -f, LimitFSIZE=) reached: the write fails EFBIG, said in words where
  // it happens (a receipt log that cannot write stops, a market answers 503), never the process
  // killed without a word. A listener of our own also keeps a dependency's exit hook (signal-exit,
  // loaded with node-llama-cpp) from raising the signal again with its deadly default.
  process.on('SIGXFSZ', () => {});
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
