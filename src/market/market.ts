// The development marketplace (`seller-node market`, docs/market-api.md): a fastify app with its
// own Ed25519 key that verifies registrations, issues tickets and collects receipts. State lives
// in memory, within bounds (MarketLimits: providers, outstanding and remembered tickets, receipt
// records), and with a file (`file`) its tickets, receipts and totals outlive a restart
// (market-db.ts); it is a tool for development and tests, not a production marketplace.
import type { AddressInfo } from 'node:net';
import { fastify, LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import { toHex } from '../../attestation/bytes.ts';
import { ed25519PublicKey } from '../../attestation/ed25519.ts';
import { registerRoutes } from './routes.ts';
import { MarketStore, marketLimits, type MarketLimits } from './store.ts';
import { MarketDb } from './market-db.ts';
import { closeHttp } from '../http-close.ts';
import { answerBareRefusals, clientErrorHandler, frameworkErrorReply } from '../http-errors.ts';
import { MAX_CONNECTIONS_DEFAULT, REQUEST_TIMEOUT_DEFAULT_MS, requestDeadlineOptions } from '../http-deadline.ts';

export { DEFAULT_MARKET_LIMITS, type MarketLimits } from './store.ts';

export const DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000;

export interface MarketOptions {
  /** The market's 32-byte Ed25519 seed: it signs every ticket. */
  seed: Uint8Array;
  /** Interface to bind (default 127.0.0.1). */
  host?: string;
  /** Port to bind (default 0: a free one; see listen()'s url). */
  port?: number;
  /** Clock, ms since the epoch (default Date.now). */
  now?: () => number;
  /** The interval nodes are told to heartbeat at (default 5000 ms); live = seen within 3 of them. Nodes heartbeat at most once a second, so below ~1000 ms they read as gone. */
  heartbeatIntervalMs?: number;
  /** Pino logger; without one the market logs nothing. */
  logger?: FastifyBaseLogger;
  /** Bounds on what the market keeps in memory (providers, tickets, receipts); each defaults as DEFAULT_MARKET_LIMITS says. */
  limits?: Partial<MarketLimits>;
  /** A whole request (headers and body) must arrive within this (default 60 s). */
  requestTimeoutMs?: number;
  /**
   * An SQLite file that keeps the tickets issued, the receipts collected and the totals across
   * restarts (created if missing; one market a file). Default: memory only.
   */
  file?: string;
}

export interface Market {
  readonly app: FastifyInstance;
  /** Hex of the market's Ed25519 public key (also its key id): what nodes put in marketplace.public_keys. */
  readonly publicKey: string;
  readonly store: MarketStore;
  listen(): Promise<{ url: string; host: string; port: number }>;
  /** Stops serving: requests under way get 2 s to finish, then their connections are cut. */
  close(): Promise<void>;
}

const MARKET_CLOSE_GRACE_MS = 2_000;

export function createMarket(opts: MarketOptions): Market {
  if (!(opts.seed instanceof Uint8Array) || opts.seed.length !== 32) throw new TypeError('market: seed must be 32 bytes');
  const host = opts.host ?? '127.0.0.1';
  const port = opts.port ?? 0;
  const requestTimeoutMs = opts.requestTimeoutMs ?? REQUEST_TIMEOUT_DEFAULT_MS;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new RangeError(`market: port must be an integer 0..65535, got ${String(port)}`);
  const heartbeatIntervalMs = opts.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS;
  if (!Number.isSafeInteger(heartbeatIntervalMs) || heartbeatIntervalMs < 1) throw new RangeError('market: heartbeatIntervalMs must be a positive integer');
  const publicKey = toHex(ed25519PublicKey(opts.seed));
  const limits = marketLimits(opts.limits);
  const now = opts.now ?? Date.now;
  const db = opts.file === undefined ? undefined : new MarketDb(opts.file);
  let store: MarketStore;
  try {
    store = new MarketStore(limits, db, now());
  } catch (e) {
    db?.close();
    throw new Error(`${opts.file}: ${(e as Error).message}`);
  }
  const app: FastifyInstance = fastify({
    ...(opts.logger ? { loggerInstance: opts.logger } : { logger: false }),
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: 4 * 1024 * 1024,
    // A request (headers and body) must arrive in time: a stalled body would hold its
    // connection, and up to 4 MiB, for ever.
    ...requestDeadlineOptions(requestTimeoutMs),
    return503OnClosing: true,
    // Bodies are checked as sent: no type coercion, nothing silently removed or defaulted.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, allErrors: false } },
    // docs/market-api.md promises {error: {code, message}} for every error, also for requests that
    // reach no route: a URL that does not decode, HTTP that does not parse.
    frameworkErrors: (err, _req, reply) => frameworkErrorReply(err, reply, 'invalid_request'),
    // A request id is up to 128 characters (the ticket's limit); the router's default (100) would
    // answer a lookup of a longer one 414 before the route could.
    routerOptions: { maxParamLength: 256 },
    clientErrorHandler: clientErrorHandler('invalid_request', () => app.log),
  });
  answerBareRefusals(app, 'invalid_request');
  store.onPruneError = (e) => app.log.warn({ err: e.message.slice(0, 300) }, 'market: pruning old tickets and receipts from its file failed; they stay until a later prune');
  registerRoutes(app, { store, signer: { seed: opts.seed, keyid: publicKey }, publicKey, now, heartbeatIntervalMs });

  return {
    app,
    publicKey,
    store,
    async listen() {
      app.server.maxConnections = MAX_CONNECTIONS_DEFAULT;
      await app.listen({ host, port });
      const a = app.server.address() as AddressInfo;
      const shown = a.address.includes(':') ? `[${a.address}]` : a.address;
      return { url: `http://${shown}:${a.port}`, host: a.address, port: a.port };
    },
    async close() {
      try {
        await closeHttp(app, MARKET_CLOSE_GRACE_MS);
      } finally {
        store.close();
      }
    },
  };
}
