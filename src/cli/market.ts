import fs from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { createKeyFile, IdentityError, loadKeyFile, type NodeIdentity } from '../identity.ts';
import { createLogger } from '../ops/logger.ts';
import { CliError } from './cli-error.ts';
import { folderProblem } from '../fs-problem.ts';
import { parseHttpListen } from './http-listen.ts';
import { untilSignal } from './until-signal.ts';
import { makeFolder } from '../make-folder.ts';
import { listenProblem } from '../host-port.ts';

const DEFAULT_MARKET_LISTEN = '127.0.0.1:11436';

export function marketCommand(): Command {
  return new Command('market')
    .summary('run the development marketplace')
    .description('run the development marketplace: verifies node registrations, issues tickets, collects and checks receipts')
    .requiredOption('--data <dir>', 'directory for the market key (market.key, created on first run) and its file of tickets, receipts and totals (market.db), kept across restarts')
    .option('--listen <host:port>', 'HTTP address to serve on', DEFAULT_MARKET_LISTEN)
    .action(async (opts: { data: string; listen: string }) => {
      const { host, port } = parseHttpListen(opts.listen, DEFAULT_MARKET_LISTEN);
      const dir = path.resolve(opts.data);
      const keyFile = path.join(dir, 'market.key');
      let key: NodeIdentity;
      try {
        makeFolder(dir, 0o700);
        key = fs.existsSync(keyFile) ? loadKeyFile(keyFile) : createKeyFile(keyFile);
      } catch (e) {
        if (e instanceof IdentityError) throw new CliError(e.message);
        throw new CliError(`cannot use --data ${dir}: ${folderProblem(e)}`);
      }
      const { createMarket } = await import('../market/market.ts'); // (loaded when it runs: --help stays fast)
      let market;
      try {
        market = createMarket({ seed: key.seed, host, port, file: path.join(dir, 'market.db'), logger: createLogger({ level: 'info', destination: 2, name: 'market' }) });
      } catch (e) {
        throw new CliError(`cannot open the market's file: ${(e as Error).message}`);
      }
      let url: string;
      try {
        ({ url } = await market.listen());
      } catch (e) {
        await market.close().catch(() => {});
        throw new CliError(listenProblem(e, opts.listen, 'pick another with --listen') ?? `cannot listen on ${opts.listen}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      }
      const stopped = untilSignal('seller-node market', 'stopping', () => market.close()); // (before the line that says it runs)
      process.stdout.write(`seller-node market: ${url}\n  public key ${market.publicKey}\n`);
      process.stderr.write(`key: ${keyFile}\nnodes trust it with: marketplace: { url: ${url}, public_keys: ["${market.publicKey}"] }\n`);
      await stopped;
    });
}
