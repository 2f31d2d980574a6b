// `seller-node gateway --market URL [--listen 127.0.0.1:11435] [--records FILE]`: the marketplace's OpenAI-compatible
// API served locally, each request sent straight to a provider over libp2p (src/gateway/).
import { Command } from 'commander';
import { BUYER_IDLE_DEFAULT_MS, GATEWAY_DEFAULT_PORT, PROVIDER_IDLE_DEFAULT_MS } from '../gateway/defaults.ts';
import { isLoopbackHost, listenProblem, type HostPort } from '../host-port.ts';
import { normalizeMarketUrl } from '../market-url.ts';
import { createLogger, LOGGER_LEVELS } from '../ops/logger.ts';
import { CliError, intOption } from './cli-error.ts';
import { readApiKeysFile, type ApiKeySpec } from '../gateway/api-keys.ts';
import { watchApiKeysFile } from '../gateway/api-keys-file-watch.ts';
import { parseHttpListen } from './http-listen.ts';
import { untilSignal } from './until-signal.ts';

/** "127.0.0.1:11435", "[::1]:11435", "localhost" (default port) → host and port; "11435" alone is refused. */
export function parseListen(s: string): HostPort {
  return parseHttpListen(s, `127.0.0.1:${GATEWAY_DEFAULT_PORT}`, GATEWAY_DEFAULT_PORT);
}

/** An account name: 1 to 256 of A-Z a-z 0-9 . _ : @ - (it goes into every ticket). */
function accountOption(v: string): string {
  if (!/^[A-Za-z0-9._:@-]{1,256}$/.test(v)) throw new CliError(`--account must be 1 to 256 of the characters A-Z a-z 0-9 . _ : @ -, got "${v.slice(0, 300)}"`, 2);
  return v;
}

export function gatewayCommand(): Command {
  return new Command('gateway')
    .summary("serve the buyers' OpenAI-compatible API (/v1)")
    .description("serve the marketplace's OpenAI-compatible API locally (/v1), sending requests straight to providers over libp2p")
    .requiredOption('--market <url>', 'the marketplace base URL, e.g. http://127.0.0.1:11436')
    .option('--listen <host:port>', 'where to serve HTTP (loopback by default: without --api-keys-file the gateway has no authentication)', `127.0.0.1:${GATEWAY_DEFAULT_PORT}`)
    .option('--account <name>', "the buyer account to ask tickets for (the market's default: dev); nodes keep Idempotency-Keys per account, so gateways of different buyers on one market each need their own", accountOption)
    .option('--records <file>', 'an SQLite file that keeps request records (GET /v1/requests/{id}) across restarts; default: memory only')
    .option('--records-days <days>', 'with --records: how many days the file keeps a record (older ones are deleted)', intOption('--records-days', 2, 36_500), 7)
    .option('--provider-idle-ms <ms>', 'cut off a provider that sends nothing for this long (before its answer starts and between frames)', intOption('--provider-idle-ms', 5000, 999_999_999), PROVIDER_IDLE_DEFAULT_MS)
    .option('--buyer-idle-ms <ms>', 'take a buyer whose connection takes nothing of a streamed answer this long for gone (the provider is stopped and bills what it sent)', intOption('--buyer-idle-ms', 1000, 999_999_999), BUYER_IDLE_DEFAULT_MS)
    .option('--api-keys-file <file>', 'require an API key (Authorization: Bearer <key>) on every route but /v1/models: the file holds one key a line (# comments; read again within 2 s of a change), each optionally followed by its limits: name=, rate_limit= (a minute, default 300), scopes=, models=, max_cost_usd=, spend_limit_usd= with spend_interval= (daily, weekly, monthly; default lifetime), expires=')
    .option('--log-level <level>', `one of ${LOGGER_LEVELS.join(', ')}`, 'info')
    .action(async (opts: { market: string; listen: string; account?: string; records?: string; recordsDays: number; providerIdleMs: number; buyerIdleMs: number; apiKeysFile?: string; logLevel: string }, cmd: Command) => {
      // Records kept in memory last until the gateway stops, whatever --records-days says: refused, not ignored.
      if (opts.records === undefined && cmd.getOptionValueSource('recordsDays') === 'cli') throw new CliError('--records-days needs --records FILE (records kept in memory go with the process)', 2);
      const { host, port } = parseListen(opts.listen);
      try {
        normalizeMarketUrl(opts.market);
      } catch (e) {
        throw new CliError(`--market: ${(e as Error).message}`, 2);
      }
      if (!(LOGGER_LEVELS as readonly string[]).includes(opts.logLevel)) throw new CliError(`--log-level must be one of ${LOGGER_LEVELS.join(', ')}`, 2);
      const logger = createLogger({ level: opts.logLevel as (typeof LOGGER_LEVELS)[number], destination: 2 });
      let apiKeys: ApiKeySpec[] | undefined;
      if (opts.apiKeysFile !== undefined) {
        try {
          apiKeys = readApiKeysFile(opts.apiKeysFile);
        } catch (e) {
          throw new CliError(`--api-keys-file: ${(e as Error).message}`, 2);
        }
      }
      if (apiKeys?.some((k) => k.spendLimitMicroUsd !== undefined) && !opts.records) process.stderr.write('seller-node: warning: API key spend limits are kept in memory without --records FILE: a restart forgets what was spent\n');
      if (!isLoopbackHost(host) && !apiKeys) process.stderr.write(`seller-node: warning: the gateway listens on ${host}, beyond this machine, and has no authentication (--api-keys-file adds it)\n`);
      let gw;
      try {
        const { createGateway } = await import('../gateway/gateway.ts'); // (loaded when it runs: --help stays fast)
        gw = await createGateway({ market: opts.market, host, port, logger, providerIdleMs: opts.providerIdleMs, buyerIdleMs: opts.buyerIdleMs, ...(apiKeys ? { apiKeys } : {}), ...(opts.account !== undefined ? { account: opts.account } : {}), recordsKeepMs: opts.recordsDays * 24 * 60 * 60 * 1000, ...(opts.records ? { recordsPath: opts.records } : {}) });
      } catch (e) {
        throw new CliError(listenProblem(e, opts.listen, 'pick another with --listen') ?? `gateway: ${(e as Error).message}`);
      }
      // A changed keys file is taken within 2 s (a key removed is refused from then on); one that cannot be used changes nothing.
      const keysWatch = opts.apiKeysFile !== undefined ? watchApiKeysFile(opts.apiKeysFile, (keys) => gw.setApiKeys(keys), logger) : undefined;
      const stopped = untilSignal('seller-node', 'finishing in-flight requests, settling receipts', () => {
        keysWatch?.stop();
        return gw.close();
      }); // (before the line that says it runs)
      process.stdout.write(`seller-node gateway: listening ${gw.url}\n  market ${gw.market.baseUrl}\n  peer ${gw.libp2p.peerId.toString()}\n  account ${opts.account ?? 'dev (the market\'s default)'}\n  records ${opts.records ?? 'in memory'}\n`);
      // Serving starts anyway (the market may come up later); the operator hears of it now, not from a buyer's 502.
      // The check runs beside the signal handling above, so Ctrl-C during it still stops cleanly.
      gw.market.marketKey().catch((e: { status?: number; code?: string; message: string }) =>
        process.stderr.write(`seller-node: warning: ${e.message}; buyers get ${e.status ?? 502} ${e.code ?? 'market_unreachable'} until that changes\n`),
      );
      await stopped;
    });
}
