// The buyer gateway (`seller-node gateway`): the marketplace's OpenAI-compatible API served locally
// (loopback by default) at http://127.0.0.1:11435/v1, sending each request straight to a provider
// over libp2p with a ticket from the marketplace.
//
//   POST /v1/chat/completions, /v1/completions, /v1/responses,
//        /v1/embeddings                                          paid: ticket → provider → receipt
//   POST /v1/tokenize, /v1/count_tokens, /v1/estimates           free: no ticket, hold or receipt
//   GET  /v1/models, /v1/models/by-id?id=…, /v1/models/{id}      the market's live providers' models
//   GET  /v1/requests/{id}                                       the settled record of a request
//
// A paid request: the exact body bytes are hashed, the X-Service-* headers become the ticket's
// routing, the marketplace issues a ticket (verified here against the market's key, the body hash
// and the buyer's cost cap), the provider is dialled by its PeerId (Noise authenticates it), and
// its answer is relayed: a JSON body gets `service.receipt`; a stream is relayed frame by frame as
// it arrives. Every receipt is verified (signature by the ticket's provider, cost arithmetic, and
// that it is this request's: ticket, body and response bytes) before it is settled with the
// marketplace (POST /v1/receipts) and recorded. A buyer who leaves mid-request cancels it at the
// node; the gateway then fetches the node's `cancelled` receipt over /service/log/1.0.0, verifies,
// settles and records it.
//
// This file assembles the parts: paid-routes.ts (with tickets.ts, relay.ts, settlement.ts),
// token-routes.ts, estimate-route.ts and catalog-routes.ts, each a fastify route set with its
// dependencies passed in.
import crypto from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { fastify, type FastifyError, type FastifyInstance } from 'fastify';
import { createHost, type Host } from '../p2p/host.ts';
import { MAX_REQUEST_BODY } from '../serve/contract.ts';
import { closeHttp } from '../http-close.ts';
import { answerBareRefusals, clientErrorHandler, frameworkErrorReply } from '../http-errors.ts';
import { settledWithin } from '../settled-within.ts';
import { stopStep } from '../stop-step.ts';
import { registerCatalogRoutes } from './catalog-routes.ts';
import { errorBody, GatewayError, invalid } from './errors.ts';
import { registerEstimateRoute } from './estimate-route.ts';
import { registerUnservedRoutes } from './unserved-routes.ts';
import { EstimateStore } from './estimates.ts';
import { noopLogger, type GatewayLogger } from './gateway-logger.ts';
import { MarketClient } from './market-client.ts';
import { registerPaidRoutes } from './paid-routes.ts';
import { recordRoutes } from './method-routes.ts';
import { RequestRecords } from './records.ts';
import { recordsFileErrors } from './records-errors.ts';
import { Relay } from './relay.ts';
import { JSON_TYPE } from '../service-error.ts';
import { Settlements } from './settlement.ts';
import { Reconciler } from './reconcile.ts';
import { Ticketing } from './tickets.ts';
import { registerTokenRoutes } from './token-routes.ts';
import { BUYER_IDLE_DEFAULT_MS, GATEWAY_DEFAULT_PORT, PROVIDER_IDLE_DEFAULT_MS } from './defaults.ts';
import { httpGuard } from './http-guard.ts';
import { ApiKeys, keyOf, type ApiKeyClock, type ApiKeySpec } from './api-keys.ts';
import { KeySpend } from './key-spend.ts';
import { LineBudget } from '../ops/line-budget.ts';
import { MAX_CONNECTIONS_DEFAULT, REQUEST_TIMEOUT_DEFAULT_MS, requestDeadlineOptions } from '../http-deadline.ts';

export { GATEWAY_DEFAULT_PORT, PROVIDER_IDLE_DEFAULT_MS };

/** Log lines of refused (or unanswered) requests a second, at most. */
const REFUSED_LINES_PER_SECOND = 50;

export interface GatewayOptions {
  /** The marketplace's base URL (e.g. http://127.0.0.1:11436; a trailing /v1 is allowed). */
  market: string;
  /** Interface to bind (default 127.0.0.1: the gateway has no authentication of its own). */
  host?: string;
  /** Port (default 11435; 0 picks a free one). */
  port?: number;
  /** The gateway's libp2p key seed (32 bytes); default a fresh random key per run. */
  seed?: Uint8Array;
  logger?: GatewayLogger;
  /** How long to keep asking a node for the receipt of a request the buyer left (default 5000 ms). */
  receiptFetchMs?: number;
  /**
   * The unit of the reconciler's back-off (reconcile.ts): a request whose receipt was not settled
   * when it ended is looked at again this long after it started, then 2, 4, 10, … units later
   * (about 28 h in all). Default 30 s.
   */
  reconcileUnitMs?: number;
  /** How many request records to keep in memory (default 10,000). */
  maxRecords?: number;
  /**
   * The buyer account the gateway's tickets are asked for (default: the market's, `dev`). Nodes
   * scope Idempotency-Keys by the ticket's account: gateways of different buyers on one market
   * should each have their own, or one could replay (or take) another's key.
   */
  account?: string;
  /** An SQLite file that keeps every request record across restarts (default: memory only). */
  recordsPath?: string;
  /** How long the records file keeps a record (default 7 days); older ones are deleted. */
  recordsKeepMs?: number;
  /** Per-call timeout towards the marketplace (default 10 s). */
  marketTimeoutMs?: number;
  /**
   * The longest a provider may send nothing: before its HEAD (queueing at the node included, which
   * X-Service-Max-Wait-Ms bounds at 60 s) and between frames (default 120 s). A provider silent
   * for longer is cut off: 504 provider_timeout before the HEAD; after it, a 502 (or an SSE error
   * event) with that code, and what it did is settled from its log.
   */
  providerIdleMs?: number;
  /** How long keepalives alone (a node working, nothing to show) may keep a provider: 15 × providerIdleMs unless given (IdleWatch). */
  providerKeepaliveMaxMs?: number;
  /**
   * The longest a buyer's connection may take nothing of a streamed answer before the gateway takes
   * them for gone: the relay ends and the provider's stream is reset, so its `cancelled` receipt
   * bills what it sent by then, not all it could generate (default 120 s). The kernel reports a
   * slow reader's progress in steps of up to a few MiB, so this must allow one that long.
   */
  buyerIdleMs?: number;
  /** The whole request (headers and body) must arrive within this (default 60 s). */
  requestTimeoutMs?: number;
  /** Bytes of request bodies held at once while they arrive (default 256 MiB); more is 503 gateway_busy. */
  bodyBudgetBytes?: number;
  /**
   * API keys a request must carry (`Authorization: Bearer <key>` or `X-Service-API-Key`), the
   * /models routes excepted, as the spec has it; without them the gateway serves whoever reaches it.
   * A plain string is a key with the spec's defaults (300 requests a minute, every scope and model).
   */
  apiKeys?: readonly (string | ApiKeySpec)[];
  /** The clocks the API keys' expiry and rate windows read (tests). */
  apiKeyClock?: ApiKeyClock;
}

export interface Gateway {
  /** e.g. http://127.0.0.1:11435/v1 */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly app: FastifyInstance;
  readonly libp2p: Host;
  readonly market: MarketClient;
  readonly records: RequestRecords;
  /**
   * Takes this list of API keys instead (a changed keys file): a key no longer listed is refused
   * from the next request on; one kept keeps its rate window and spend. Throws (changing nothing)
   * on a bad list, or when the gateway was started without keys.
   */
  setApiKeys(keys: readonly (string | ApiKeySpec)[]): void;
  /** Resolves when every settlement under way (receipts being verified, fetched or posted) is done. */
  idle(): Promise<void>;
  /**
   * Stops listening, lets running requests finish for up to graceMs (default 10 s), then waits up
   * to graceMs more for settlements under way, stops libp2p and closes the records.
   */
  close(graceMs?: number): Promise<void>;
}

const REQUEST_ID_RE = /^[A-Za-z0-9._:-]{1,128}$/;


export async function createGateway(opts: GatewayOptions): Promise<Gateway> {
  const log = opts.logger ?? noopLogger;
  // (Checked first: a bad key list is refused before anything is opened.)
  const apiKeys = opts.apiKeys !== undefined ? new ApiKeys(opts.apiKeys, opts.apiKeyClock) : undefined;
  const market = new MarketClient(opts.market, opts.marketTimeoutMs !== undefined ? { timeoutMs: opts.marketTimeoutMs } : {});
  const records = new RequestRecords(
    opts.maxRecords,
    opts.recordsPath,
    recordsFileErrors(log),
    opts.recordsKeepMs,
  );
  const estimates = new EstimateStore();
  const receiptFetchMs = opts.receiptFetchMs ?? 5000;
  const providerIdleMs = opts.providerIdleMs ?? PROVIDER_IDLE_DEFAULT_MS;
  const seed = opts.seed ?? new Uint8Array(crypto.randomBytes(32));
  let host: Host;
  try {
    host = await createHost({ seed, listen: [] });
  } catch (e) {
    records.close();
    throw e;
  }
  const ticketing = new Ticketing(market, records, opts.account);
  const settlements = new Settlements({ log, market, records, host, receiptFetchMs, forgetIdempotent: (key, requestId) => ticketing.forget(key, requestId) });
  const reconciler = new Reconciler({ records, settlements, market, log, ...(opts.reconcileUnitMs !== undefined ? { unitMs: opts.reconcileUnitMs } : {}) });

  const listenHost = opts.host ?? '127.0.0.1';
  const requestTimeoutMs = opts.requestTimeoutMs ?? REQUEST_TIMEOUT_DEFAULT_MS;
  const app = fastify({
    logger: false,
    bodyLimit: MAX_REQUEST_BODY,
    // A request (headers and body) must arrive within this: a client that sends part of a body and
    // stalls would otherwise hold its connection, and up to 8 MiB, for ever.
    ...requestDeadlineOptions(requestTimeoutMs),
    genReqId: () => `req-${crypto.randomUUID()}`,
    return503OnClosing: true,
    // The spec's envelope also for requests that reach no route: a URL that does not decode
    // (fastify's frameworkErrors bypass the error handler below) and HTTP that does not parse.
    frameworkErrors: (err, req, reply) => frameworkErrorReply(err, reply.header('x-request-id', req.id), 'invalid_request'),
    clientErrorHandler: clientErrorHandler('invalid_request'),
    // A request id is up to 128 characters (REQUEST_ID_RE); the router's default (100) would answer
    // GET /v1/requests/{id} of a longer one 414 before the route could.
    routerOptions: { maxParamLength: 256 },
  });

  const routeTable = recordRoutes(app); // (before any route: see method-routes.ts)

  // The exact body bytes for every content type: the ticket binds their SHA-256, so nothing may
  // parse, re-encode or trim them on the way to the provider.
  app.removeAllContentTypeParsers();
  // A compressed body is refused by name (it would otherwise read as "not UTF-8 JSON"): the
  // ticket binds the bytes the node parses, and neither side inflates them.
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: MAX_REQUEST_BODY }, (req, body, done) => {
    const coding = req.headers['content-encoding'];
    const c = coding?.trim().toLowerCase();
    if (c && c !== 'identity') return done(invalid('Content-Encoding', `${JSON.stringify(coding!.slice(0, 40))} is not accepted: send the JSON body uncompressed`), undefined);
    done(null, body);
  });

  const refusedLines = new LineBudget(REFUSED_LINES_PER_SECOND, (n) => log.warn({ suppressed: n }, `${n} request lines of refused or unanswered requests not logged (more than ${REFUSED_LINES_PER_SECOND} a second)`));
  refusedLines.start();
  const guard = httpGuard({ listenHost, maxBodyBytes: MAX_REQUEST_BODY, ...(opts.bodyBudgetBytes !== undefined ? { budgetBytes: opts.bodyBudgetBytes } : {}) });
  app.addHook('onRequest', async (req, reply) => {
    reply.header('x-request-id', req.id);
    // One line a request when its response ends (streams too: they are hijacked, so fastify's
    // onResponse never sees them): the route, never the URL's query, body, prompt or output. Timed
    // here (fastify's reply.elapsedTime stays 0 without its own logger); no status when none was
    // sent (the buyer left first), not the 200 a response starts with.
    const started = performance.now();
    reply.raw.once('close', () => {
      const status = reply.raw.headersSent ? reply.raw.statusCode : null;
      // Refused requests cost a client nothing to send: at most REFUSED_LINES_PER_SECOND of them are lines, the rest counted.
      if ((status === null || status >= 400) && !refusedLines.take()) return;
      log.info({ request_id: req.id, method: req.method, route: req.routeOptions.url ?? null, ...(keyOf(req) ? { api_key: keyOf(req)!.label } : {}), status, completed: reply.raw.writableFinished, ms: Math.round(performance.now() - started) }, 'request');
    });
  });
  // (After the request line above is set up, so a refused request is logged like any other.)
  answerBareRefusals(app, 'invalid_request');
  app.addHook('onRequest', guard.onRequest);
  if (apiKeys) app.addHook('onRequest', apiKeys.onRequest);

  app.setErrorHandler((err: FastifyError | GatewayError, _req, reply) => {
    if (err instanceof GatewayError) return reply.code(err.status).type(JSON_TYPE).send(err.body());
    const status = typeof err.statusCode === 'number' ? err.statusCode : 500;
    if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return reply.code(413).type(JSON_TYPE).send(errorBody('request_too_large', `the body is larger than ${MAX_REQUEST_BODY} bytes`));
    if (status >= 400 && status < 500) return reply.code(status).type(JSON_TYPE).send(errorBody('invalid_request', err.message));
    log.error({ err: err.message }, 'gateway error');
    return reply.code(500).type(JSON_TYPE).send(errorBody('internal_error', 'the gateway failed'));
  });
  app.setNotFoundHandler((req, reply) => {
    const path = req.url.split('?')[0]!;
    const allowed = routeTable.allowed(path);
    if (allowed.length > 0) return reply.code(405).header('allow', allowed.join(', ')).type(JSON_TYPE).send(errorBody('method_not_allowed', `${path.slice(0, 200)} takes ${allowed.join(', ')}, not ${req.method}`));
    return reply.code(404).type(JSON_TYPE).send(errorBody('not_found', `no route ${req.method} ${path.slice(0, 200)}`));
  });

  // The API keys' spend limits, kept beside the records (in their file when there is one).
  // (With keys at all: a key given a limit later, in a changed keys file, is held to it at once.)
  let spend: KeySpend | undefined;
  if (apiKeys) {
    const wall = opts.apiKeyClock;
    try {
      spend = new KeySpend({ ...(records.database ? { db: records.database } : {}), ...(wall ? { now: () => wall.wallMs() } : {}), onError: (e) => log.error({ err: e.message }, 'API key spend not written to the records file (kept in memory for this run)') });
    } catch (e) {
      await host.stop();
      records.close();
      throw new Error(`request records: the API keys' spend could not be read: ${(e as Error).message}`);
    }
    records.onMoney = spend;
  }
  const relay = new Relay({ settlements, records, buyerIdleMs: opts.buyerIdleMs ?? BUYER_IDLE_DEFAULT_MS });
  registerPaidRoutes(app, { host, ticketing, relay, settlements, records, estimates, providerIdleMs, providerKeepaliveMaxMs: opts.providerKeepaliveMaxMs, firstLookMs: reconciler.firstLookMs, ...(spend ? { spend } : {}) });
  registerTokenRoutes(app, { host, market });
  registerEstimateRoute(app, { host, market, estimates, ...(spend ? { spend } : {}) });
  registerCatalogRoutes(app, { market });
  registerUnservedRoutes(app);

  app.get('/v1/requests/:id', async (req, reply) => {
    const id = (req.params as { id: string }).id;
    if (!REQUEST_ID_RE.test(id)) throw invalid('id', 'expected a request id');
    // A request whose answer is out but whose receipt is still being checked, fetched or posted:
    // wait (bounded) for the settled record rather than show it half done.
    await settlements.waitFor(id, Date.now() + receiptFetchMs + 5000);
    const rec = records.get(id);
    if (!rec) throw new GatewayError(404, 'request_not_found', `unknown request ${id}`);
    return reply.type(JSON_TYPE).send(rec);
  });

  // More connections than this are closed as they arrive, before the process runs out of file
  // descriptors (which the market, the nodes and the records file need too).
  app.server.maxConnections = MAX_CONNECTIONS_DEFAULT;
  try {
    await app.listen({ host: listenHost, port: opts.port ?? GATEWAY_DEFAULT_PORT });
  } catch (e) {
    refusedLines.stop();
    await host.stop();
    records.close();
    throw e;
  }
  reconciler.start();
  const addr = app.server.address() as AddressInfo;
  const urlHost = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  const idle = (): Promise<void> => settlements.idle();
  return {
    url: `http://${urlHost}:${addr.port}/v1`,
    host: addr.address,
    port: addr.port,
    app,
    libp2p: host,
    market,
    records,
    idle,
    setApiKeys(keys) {
      if (!apiKeys) throw new TypeError('gateway: started without API keys: restart it with them (--api-keys-file)');
      apiKeys.replace(keys);
    },
    async close(graceMs = 10_000) {
      // Named steps (see stopStep): one that fails is logged and the ones after it still run.
      await stopStep(log, 'http', () => closeHttp(app, graceMs));
      // No new looks; jobs left are kept in the records file and looked at again after the next
      // start. Looks under way end with the settlements (bounded below).
      reconciler.stop();
      // Settlements (receipts fetched from nodes, posted to the market) get their own grace too:
      // a shutdown is bounded whatever a node or the market does. One cut short leaves its record
      // in_progress (with a records file it reads `interrupted` after the next start); the
      // receipt itself is in the node's log and reaches the market from there.
      await stopStep(log, 'settlements', async () => {
        if (!(await settledWithin(idle(), graceMs))) log.warn({ pending: settlements.pending, grace_ms: graceMs }, 'settlements still running after the grace period are stopped');
        // Stopped, also when idle (a handler cut off with its connection may start one later): no
        // more retries, waits or fetches, and a POST under way ends (its record: settlement_interrupted).
        if (!(await settledWithin(settlements.stop(), graceMs))) log.warn({ pending: settlements.pending }, 'gateway closed with settlements still running');
      });
      await stopStep(log, 'reconciler', async () => {
        if (!(await settledWithin(reconciler.idle(), graceMs))) log.warn({}, 'the reconciler was still looking at requests when the gateway closed');
        // Without a records file, what is left to settle goes with the process: say so, once.
        const left = records.unsettledCount;
        if (left > 0 && !records.persistent) {
          log.warn({ unsettled: left }, `${left} paid request${left === 1 ? '' : 's'} not yet settled ${left === 1 ? 'is' : 'are'} forgotten (no records file): their receipts stay in the nodes' logs; run the gateway with --records FILE to settle them after a restart`);
        }
      });
      // Whatever still asks the market (the start-up key probe, a look of the reconciler's) ends now.
      market.close();
      refusedLines.stop();
      await stopStep(log, 'libp2p', () => host.stop());
      await stopStep(log, 'records', () => records.close());
    },
  };
}
