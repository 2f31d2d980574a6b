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
import crypto from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { ServerResponse } from 'node:http';
import { fastify, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { multiaddr, type Multiaddr } from '@multiformats/multiaddr';
import { concatBytes } from '../../attestation/bytes.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';
import { computeCost, formatUsd } from '../../attestation/money.ts';
import type { TicketPayload } from '../../attestation/ticket.ts';
import { ratesFromWire, type WireRates } from '../../attestation/receipt.ts';
import { verifyTicket } from '../../attestation/ticket-verify.ts';
import { createHost, type Host } from '../p2p/host.ts';
import { INFER_PROTOCOL } from '../p2p/infer-protocol.ts';
import { LOG_PROTOCOL } from '../p2p/log-protocol.ts';
import { peerIdFromProviderId } from '../p2p/peer-id.ts';
import { readResponse, request as p2pRequest, type Response as P2pResponse } from '../p2p/request-stream.ts';
import type { JsonObject } from '../p2p/frames.ts';
import { errorBody, GatewayError, invalid, readErrorBody } from './errors.ts';
import { canonicalBodySha256, EstimateStore, ESTIMATE_ENDPOINTS } from './estimates.ts';
import { ContractError, MAX_REQUEST_BODY, parseRequest, type ParsedRequest } from '../serve/contract.ts';
import { MarketClient, type ProviderEntry, type TicketRequest } from './market-client.ts';
import { checkReceipt, type CheckedReceipt, type ReceiptExpectation } from './receipt-check.ts';
import { RequestRecords, type RequestRecord } from './records.ts';
import { parseRoutingHeaders, type RoutingControls } from './routing-headers.ts';
import { quantizationBucket, REPRESENTATIVE_REQUEST_TEXT, representativePrice, worstCaseCost } from '../dispatch/routing.ts';
import { settledWithin } from '../settled-within.ts';

export const GATEWAY_DEFAULT_PORT = 11435;
/** How long a provider may send nothing before the gateway cuts it off (--provider-idle-ms). */
export const PROVIDER_IDLE_DEFAULT_MS = 120_000;
export const PAID_ENDPOINTS = ['chat/completions', 'completions', 'responses', 'embeddings'] as const;
export type PaidEndpoint = (typeof PAID_ENDPOINTS)[number];
export const FREE_ENDPOINTS = ['tokenize', 'count_tokens'] as const;

/** A pino-shaped logger; the gateway logs ids, codes and counts, never prompts or outputs. */
export interface GatewayLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

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
  /** How many request records to keep in memory (default 10,000). */
  maxRecords?: number;
  /** An SQLite file that keeps every request record across restarts (default: memory only). */
  recordsPath?: string;
  /** Per-call timeout towards the marketplace (default 10 s). */
  marketTimeoutMs?: number;
  /**
   * The longest a provider may send nothing: before its HEAD (queueing at the node included, which
   * X-Service-Max-Wait-Ms bounds at 60 s) and between frames (default 120 s). A provider silent
   * for longer is cut off: 504 provider_timeout before the HEAD; after it, a 502 (or an SSE error
   * event) with that code, and what it did is settled from its log.
   */
  providerIdleMs?: number;
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
  /** Resolves when every settlement under way (receipts being verified, fetched or posted) is done. */
  idle(): Promise<void>;
  /**
   * Stops listening, lets running requests finish for up to graceMs (default 10 s), then waits up
   * to graceMs more for settlements under way, stops libp2p and closes the records.
   */
  close(graceMs?: number): Promise<void>;
}

const JSON_TYPE = 'application/json; charset=utf-8';
const REQUEST_ID_RE = /^[A-Za-z0-9._:-]{1,128}$/;

// A relayed stream is cut into whole SSE events (each ends with a blank line) so that its closing
// event (`data: [DONE]`, or the responses protocol's last event: it has no [DONE]) can be held.
/** The largest SSE event held back whole; a larger one is relayed as it arrives. */
const MAX_HELD_EVENT = 4 << 20;

/** Where the last blank line of `bytes` ends (SSE allows LF and CRLF line ends), or 0. */
function blankLineEnd(bytes: Uint8Array): number {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const end = (sep: string): number => {
    const i = b.lastIndexOf(sep);
    return i < 0 ? 0 : i + sep.length;
  };
  return Math.max(end('\n\n'), end('\r\n\r\n'), end('\r\r'));
}

function endsWithBlankLine(b: Uint8Array): boolean {
  const tail = b.subarray(Math.max(0, b.length - 4));
  return tail.length > 0 && blankLineEnd(tail) === tail.length;
}

/**
 * Where the last complete event ends in `next` (just after its blank line), counting a blank line
 * that starts at the end of the previous chunk; 0 when `next` completes no event. Only `next` and
 * a few bytes before it are searched, so a long event costs linear time.
 */
function eventsEndAcross(prev: Uint8Array | undefined, next: Uint8Array): number {
  const inNext = blankLineEnd(next);
  if (inNext > 0 || !prev) return inNext;
  const tail = prev.subarray(Math.max(0, prev.length - 3));
  const joint = blankLineEnd(concatBytes(tail, next.subarray(0, 3)));
  return joint > tail.length ? joint - tail.length : 0;
}

/** Where the last event of complete events starts (trailing extra line ends belong to it). */
function lastEventAt(events: Uint8Array): number {
  let e = events.length;
  while (e > 0 && (events[e - 1] === 10 || events[e - 1] === 13)) e--;
  return blankLineEnd(events.subarray(0, e));
}

/** Whether one whole SSE event closes the stream: `data: [DONE]`, or the responses protocol's last event. */
function isTerminalEvent(event: Uint8Array): boolean {
  let e = event.length;
  while (e > 0 && (event[e - 1] === 10 || event[e - 1] === 13)) e--;
  const head = LATIN1.decode(event.subarray(0, Math.min(e, 64)));
  return (e === DONE_LINE.length && head === DONE_LINE) || RESPONSES_END_EVENT.test(head);
}
const DONE_LINE = 'data: [DONE]';
// The closing markers are ASCII: matching them needs no UTF-8 decoding (and no decoder per event).
const LATIN1 = new TextDecoder('latin1');
const RESPONSES_END_EVENT = /^event: response\.(?:completed|incomplete|failed)\r?\n/;
const noopLogger: GatewayLogger = { info: () => undefined, warn: () => undefined, error: () => undefined };
const isObj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Why a request that ended without a trailer is recorded as it is, when its node has no receipt. */
const NO_RECEIPT = {
  lost_hedge: { code: 'hedge_cancelled', message: "the hedge's other attempt was used; this one was cancelled before it did any work; nothing was charged" },
  abandoned: { code: 'request_abandoned', message: 'the buyer left before the provider did any work; nothing was charged' },
  failed: { code: 'provider_failed', message: 'the provider stopped answering and has no receipt for this request' },
} as const;

/** Not reaching a provider at all: tokenize fails over to the next provider on these. */
class ProviderUnreached extends GatewayError {}

/** The exact body bytes (the content-type parser hands every body over untouched). */
function bodyBytes(req: FastifyRequest): Buffer {
  return Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
}

/** The model a body names: enough to ask for a ticket. The node checks the whole contract. */
function peekModel(body: Uint8Array): string {
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body));
  } catch {
    throw invalid('body', 'expected UTF-8 JSON');
  }
  if (!isObj(value)) throw invalid('body', 'expected a JSON object');
  if (typeof value.model !== 'string' || value.model.length === 0 || value.model.length > 256) throw invalid('model', 'expected a model id');
  return value.model;
}

function idempotencyKey(headers: FastifyRequest['headers']): string | undefined {
  const v = headers['idempotency-key'];
  if (v === undefined) return undefined;
  if (Array.isArray(v) || v.length === 0 || v.length > 256) throw invalid('Idempotency-Key', 'expected 1 to 256 characters');
  return v;
}

/** The provider's multiaddrs, each ending in its PeerId (so Noise authenticates exactly that key). */
export function dialTarget(provider: string, peerId: string, addresses: readonly string[]): Multiaddr[] {
  let expected: string;
  try {
    expected = peerIdFromProviderId(provider).toString();
  } catch {
    throw new GatewayError(502, 'bad_market_response', 'the provider id is not an Ed25519 key');
  }
  if (peerId !== expected) throw new GatewayError(502, 'bad_market_response', `peer id ${peerId.slice(0, 80)} is not provider ${provider}'s`);
  const out: Multiaddr[] = [];
  for (const a of addresses) {
    try {
      const ma = multiaddr(a);
      const p2p = ma.getComponents().filter((c) => c.name === 'p2p');
      if (p2p.length === 0) out.push(ma.encapsulate(`/p2p/${expected}`));
      else if (p2p.at(-1)!.value === expected) out.push(ma);
    } catch {
      // not a multiaddr: skip it
    }
  }
  if (out.length === 0) throw new GatewayError(503, 'provider_unreachable', `provider ${provider} has no usable address`);
  return out;
}

/** Resolves once the response can take more bytes, or has closed. */
function drained(raw: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      raw.off('drain', done);
      raw.off('close', done);
      resolve();
    };
    raw.on('drain', done);
    raw.on('close', done);
  });
}

/** How many times a paid request moves on to another provider that could not start it. */
const MAX_FAILOVERS = 2;

/** A provider could not start the request (nothing done, nothing charged): the next one may. */
class Failover extends Error {
  readonly provider: string;
  readonly error: GatewayError;
  /** Not the provider's fault: the hedge's half cap was too small; run once, unhedged. */
  readonly unhedge: boolean;
  constructor(provider: string, error: GatewayError, unhedge = false) {
    super(error.message);
    this.provider = provider;
    this.error = error;
    this.unhedge = unhedge;
  }
}

/** Aborts a provider request when nothing has arrived for `ms`; every frame (and the HEAD) restarts the clock. */
class IdleWatch {
  timedOut = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly ac: AbortController;
  private readonly ms: number;
  constructor(ac: AbortController, ms: number) {
    this.ac = ac;
    this.ms = ms;
    this.arm();
  }
  private arm(): void {
    this.timer = setTimeout(() => {
      this.timedOut = true;
      this.ac.abort(new Error(`the provider sent nothing for ${this.ms} ms`));
    }, this.ms);
    this.timer.unref();
  }
  kick(): void {
    if (!this.stopped) this.timer?.refresh();
  }
  /** The wait is the buyer's (slow to read): the provider's clock stops until resume(). */
  pause(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
  resume(): void {
    if (!this.stopped && !this.timer) this.arm();
  }
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}


/** The routing controls an estimate is bound to, as one string (the cap and the estimate id aside). */
function routingKey(c: RoutingControls): string {
  const { max_cost_micro_usd: _cap, ...routing } = c.routing;
  return canonicalize({ routing, preferred: c.preferredProviders ?? null });
}

/** A paid request as the buyer sent it: the same for every attempt at it. */
interface PaidAsk {
  endpoint: PaidEndpoint;
  body: Buffer;
  model: string;
  bodySha256: string;
  idem: string | undefined;
  /** The hold when the buyer sets no cap: for embeddings, one that covers the whole batch. */
  uncappedHold: string | undefined;
}

interface Paid {
  endpoint: PaidEndpoint;
  requestId: string;
  body: Buffer;
  bodySha256: string;
  ticket: TicketPayload;
  provider: string;
  target: Multiaddr[];
  idempotent: boolean;
  exp: ReceiptExpectation;
}

export async function createGateway(opts: GatewayOptions): Promise<Gateway> {
  const log = opts.logger ?? noopLogger;
  const market = new MarketClient(opts.market, opts.marketTimeoutMs !== undefined ? { timeoutMs: opts.marketTimeoutMs } : {});
  const records = new RequestRecords(opts.maxRecords, opts.recordsPath, (e, id, op) =>
    log.error({ request_id: id, op, err: e.message }, op === 'write' ? 'request record not written to the records file (kept in memory)' : 'request records file could not be read'),
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
  /** Settlements under way, by request id: GET /v1/requests/{id} waits for one briefly. */
  const settling = new Map<string, Promise<void>>();

  function track(id: string, work: Promise<void>): Promise<void> {
    const p = work.catch((e: unknown) => log.error({ request_id: id, err: (e as Error)?.message }, 'settlement failed'));
    settling.set(id, p);
    void p.finally(() => {
      if (settling.get(id) === p) settling.delete(id);
    });
    return p;
  }

  const app = fastify({
    logger: false,
    bodyLimit: MAX_REQUEST_BODY,
    genReqId: () => `req-${crypto.randomUUID()}`,
    return503OnClosing: true,
  });

  // The exact body bytes for every content type: the ticket binds their SHA-256, so nothing may
  // parse, re-encode or trim them on the way to the provider.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: MAX_REQUEST_BODY }, (_req, body, done) => done(null, body));

  app.addHook('onRequest', async (req, reply) => {
    reply.header('x-request-id', req.id);
  });

  app.setErrorHandler((err: FastifyError | GatewayError, _req, reply) => {
    if (err instanceof GatewayError) return reply.code(err.status).type(JSON_TYPE).send(err.body());
    const status = typeof err.statusCode === 'number' ? err.statusCode : 500;
    if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return reply.code(413).type(JSON_TYPE).send(errorBody('request_too_large', `the body is larger than ${MAX_REQUEST_BODY} bytes`));
    if (status >= 400 && status < 500) return reply.code(status).type(JSON_TYPE).send(errorBody('invalid_request', err.message));
    log.error({ err: err.message }, 'gateway error');
    return reply.code(500).type(JSON_TYPE).send(errorBody('internal_error', 'the gateway failed'));
  });
  app.setNotFoundHandler((req, reply) => reply.code(404).type(JSON_TYPE).send(errorBody('not_found', `no route ${req.method} ${req.url.split('?')[0]!.slice(0, 200)}`)));

  // ---- paid endpoints ------------------------------------------------------------------------

  /** Asks the marketplace for a ticket and checks it is what was asked for. */
  async function takeTicket(endpoint: PaidEndpoint, model: string, bodySha256: string, controls: RoutingControls, requestId: string, hold: string | undefined): Promise<{ ticket: TicketPayload; provider: string; target: Multiaddr[]; envelope: unknown; rates?: WireRates }> {
    const ask: TicketRequest = { endpoint, model, body_sha256: bodySha256, request_id: requestId };
    if (Object.keys(controls.routing).length > 0) ask.routing = controls.routing;
    if (hold !== undefined) ask.max_cost_micro_usd = hold;
    if (controls.preferredProviders) ask.providers = controls.preferredProviders;
    const grant = await market.ticket(ask);
    const key = await market.marketKey();
    const v = verifyTicket(grant.ticket, { marketplaceKeys: [{ publicKey: key.public_key, keyid: key.key_id }], provider: grant.provider, body: bodySha256 });
    if (!v.ok) throw new GatewayError(502, 'bad_market_response', `the marketplace's ticket does not verify: ${v.error.code}: ${v.error.message}`);
    const t = v.value.payload;
    // The market issues the ticket under the request id it was given (docs/market-api.md): one for
    // any other id is another request's, and taking it would put this request's record over that one.
    if (t.endpoint !== endpoint || t.model !== model || t.request_id !== requestId || grant.request_id !== requestId) throw new GatewayError(502, 'bad_market_response', 'the ticket is for another request');
    if (hold !== undefined && BigInt(t.max_cost_micro_usd) > BigInt(hold)) {
      throw new GatewayError(502, 'bad_market_response', `the ticket holds ${t.max_cost_micro_usd} micro-USD, above X-Service-Max-Cost-Usd`);
    }
    // The market applies the set; a ticket for anyone else is still never used.
    if (controls.preferredProviders && !controls.preferredProviders.includes(grant.provider)) {
      throw new GatewayError(503, 'no_provider', `the marketplace chose provider ${grant.provider}, outside X-Service-Prefer-Providers`);
    }
    return { ticket: t, provider: grant.provider, target: dialTarget(grant.provider, grant.peer_id, grant.addresses), envelope: grant.ticket, ...(grant.rates ? { rates: grant.rates } : {}) };
  }

  /** POST /v1/receipts, retried briefly while the market is unreachable; then the record. */
  async function settle(id: string, r: Extract<CheckedReceipt, { ok: true }>, askedAs?: string): Promise<RequestRecord | undefined> {
    let outcome: { ok: true } | { ok: false; code: string; message: string } = { ok: false, code: 'market_unreachable', message: 'not tried' };
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const ack = await market.postReceipt(r.line);
        outcome = ack.ok ? { ok: true } : { ok: false, code: 'settlement_refused', message: 'the marketplace did not accept the receipt' };
        break;
      } catch (e) {
        const g = e instanceof GatewayError ? e : new GatewayError(502, 'market_unreachable', String(e));
        outcome = { ok: false, code: g.code, message: g.message };
        if (g.status < 500) break; // the market refused it: retrying will not change that
        await sleep(200 * (attempt + 1));
      }
    }
    if (!outcome.ok) log.warn({ request_id: id, code: outcome.code, message: outcome.message }, 'receipt not settled with the marketplace');
    if (!records.get(id)) records.begin({ request_id: id, endpoint: r.payload.endpoint, model: r.payload.model, provider: r.payload.provider });
    const rec = records.settle(id, r, outcome);
    if (askedAs !== undefined && askedAs !== id) records.alias(askedAs, id);
    return rec;
  }

  /**
   * The receipt of a request whose stream ended early (the buyer left, or the connection broke),
   * from the node's log, retried until it is there or `receiptFetchMs` has passed.
   */
  async function fetchReceipt(p: Paid): Promise<CheckedReceipt | undefined> {
    const deadline = Date.now() + receiptFetchMs;
    let last: CheckedReceipt | undefined;
    for (let delay = 50; ; delay = Math.min(delay * 2, 400)) {
      try {
        const r = await readResponse(await p2pRequest(host, p.target, LOG_PROTOCOL, { op: 'receipt', request_id: p.requestId }, undefined, { signal: AbortSignal.timeout(3000) }));
        if (r.head.status === 200) {
          const v = JSON.parse(Buffer.from(r.body).toString('utf8')) as { receipts?: unknown };
          for (const line of Array.isArray(v.receipts) ? v.receipts : []) {
            const c = checkReceipt(line, p.exp);
            if (c.ok) return c;
            last = c;
          }
          if (last) return last;
        }
      } catch (e) {
        log.warn({ request_id: p.requestId, err: (e as Error).message }, 'receipt fetch failed');
      }
      if (Date.now() + delay > deadline) return undefined;
      await sleep(delay);
    }
  }

  /** The request ended without a trailer: find its receipt at the node, settle it, record it. */
  function settleFromNode(p: Paid, why: 'abandoned' | 'failed' | 'lost_hedge'): Promise<void> {
    return track(
      p.requestId,
      (async () => {
        const c = await fetchReceipt(p);
        if (c === undefined) {
          records.fail(p.requestId, why === 'failed' ? 'failed' : 'abandoned', NO_RECEIPT[why]);
        } else if (!c.ok) {
          records.fail(p.requestId, 'bad_provider_response', { code: 'bad_provider_response', message: c.message });
        } else {
          await settle(p.requestId, c);
        }
        log.info({ request_id: p.requestId, status: records.get(p.requestId)?.status }, 'request ended early');
      })(),
    );
  }

  /** The Paid record of a granted ticket. */
  function paidOf(endpoint: PaidEndpoint, model: string, body: Buffer, bodySha256: string, granted: Awaited<ReturnType<typeof takeTicket>>, idempotent: boolean): Paid {
    const t = granted.ticket;
    return {
      endpoint,
      requestId: t.request_id,
      body,
      bodySha256,
      ticket: t,
      provider: granted.provider,
      target: granted.target,
      idempotent,
      exp: { provider: granted.provider, requestId: t.request_id, ticketId: t.ticket_id, endpoint, model, bodySha256, holdMicroUsd: t.max_cost_micro_usd, priceVersion: t.price_version, ...(granted.rates ? { rates: granted.rates } : {}) },
    };
  }

  /**
   * The hold for embeddings without a cost cap. The market's default (one context's worth of
   * tokens) is too small for a batch of inputs; no tokenizer counts more tokens than the body has
   * bytes, so the body's length at the highest input rate among the model's providers covers it.
   */
  async function embeddingsHold(model: string, body: Uint8Array): Promise<string | undefined> {
    let rate = 0n;
    for (const p of await market.providers()) {
      const r = p.rates?.[model];
      if (r && BigInt(r.input_per_mtok) > rate) rate = BigInt(r.input_per_mtok);
    }
    return rate === 0n ? undefined : computeCost({ input_tokens: body.length, output_tokens: 0 }, { input_per_mtok: rate, output_per_mtok: 0n }).toString();
  }

  /**
   * Idempotency-Key → the provider its first attempt went to. A node answers a retry from its own
   * record, so the retry must go back there; anywhere else it would run (and be billed) again.
   */
  const idempotentAt = new Map<string, string>();
  const IDEMPOTENT_REMEMBERED = 10_000;
  const idempotentKey = (endpoint: PaidEndpoint, idem: string): string => `${endpoint}\n${idem}`;

  /** Live providers of a model that take requests, in the market's order, but for `except`. */
  async function liveProvidersOf(model: string, except: readonly string[]): Promise<string[]> {
    return (await market.providers()).filter((e) => !except.includes(e.provider) && e.live !== false && e.accepting !== false && e.models.some((m) => m.id === model)).map((e) => e.provider);
  }

  /** The ticket for a request; a retry under an Idempotency-Key goes back to the provider of the first attempt while it can. */
  async function ticketFor(endpoint: PaidEndpoint, model: string, bodySha256: string, controls: RoutingControls, requestId: string, idem: string | undefined, hold?: string) {
    const first = idem === undefined ? undefined : idempotentAt.get(idempotentKey(endpoint, idem));
    let granted: Awaited<ReturnType<typeof takeTicket>> | undefined;
    if (first !== undefined && (!controls.preferredProviders || controls.preferredProviders.includes(first))) {
      try {
        granted = await takeTicket(endpoint, model, bodySha256, { ...controls, preferredProviders: [first] }, requestId, hold);
      } catch (e) {
        // That provider is gone or cannot take it now: the retry runs elsewhere (and is billed there).
        if (!(e instanceof GatewayError) || (e.code !== 'no_provider' && e.status !== 503)) throw e;
      }
    }
    granted ??= await takeTicket(endpoint, model, bodySha256, controls, requestId, hold);
    return granted;
  }

  /** The provider that answered a request under an Idempotency-Key (a hedge's winner, not its first ticket). */
  function rememberIdempotent(endpoint: PaidEndpoint, idem: string, provider: string): void {
    const key = idempotentKey(endpoint, idem);
    idempotentAt.delete(key);
    idempotentAt.set(key, provider);
    if (idempotentAt.size > IDEMPOTENT_REMEMBERED) idempotentAt.delete(idempotentAt.keys().next().value!);
  }

  /**
   * X-Service-Hedge: a second ticket for another live provider of the model, or undefined when
   * there is none (the request then runs once). The two race; the loser is cancelled at its node
   * and settled for the work it did.
   */
  async function hedgeTicket(endpoint: PaidEndpoint, model: string, bodySha256: string, controls: RoutingControls, live: readonly string[], first: string, requestId: string, hold?: string) {
    const others = live.filter((p) => p !== first);
    if (others.length === 0) return undefined;
    try {
      return await takeTicket(endpoint, model, bodySha256, { ...controls, preferredProviders: others }, requestId, hold);
    } catch {
      return undefined; // no second route: run once
    }
  }

  /**
   * A paid request. When its provider cannot start it (unreachable, or no capacity: nothing done,
   * nothing charged) it fails over to the next provider: the next of X-Service-Prefer-Providers in
   * order (never one outside the set), else any other live provider of the model; a few times at
   * most, each attempt under its own request id and ticket. Hedged requests already run twice and
   * do not fail over.
   */
  async function paid(endpoint: PaidEndpoint, req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    let controls = parseRoutingHeaders(req.headers);
    const body = bodyBytes(req);
    const model = peekModel(body);
    // What every attempt sends: worked out once, however many attempts there are.
    const ask: PaidAsk = { endpoint, body, model, bodySha256: sha256Hex(body), idem: idempotencyKey(req.headers), uncappedHold: undefined };
    if (controls.estimateId !== undefined) {
      // The request must be the one estimated, under the same routing controls; its hold is capped
      // at the estimate's maximum, so a higher live maximum is refused (403) before any hold.
      const est = estimates.get(controls.estimateId);
      if (!est) throw invalid('X-Service-Estimate', 'unknown or expired estimate');
      if (est.endpoint !== endpoint || est.model !== model || est.bodySha256 !== canonicalBodySha256(body)) throw invalid('X-Service-Estimate', 'the estimate is for another request');
      if (est.routing !== routingKey(controls)) throw invalid('X-Service-Estimate', 'the estimate was made under other routing controls');
      const asked = controls.routing.max_cost_micro_usd;
      const cap = asked === undefined || BigInt(asked) > est.maxHoldMicroUsd ? est.maxHoldMicroUsd : BigInt(asked);
      controls.routing.max_cost_micro_usd = cap.toString();
    }
    if (endpoint === 'embeddings' && controls.routing.max_cost_micro_usd === undefined) ask.uncappedHold = await embeddingsHold(model, body);
    const tried: string[] = [];
    let lastFailure: GatewayError | undefined;
    for (let n = 0; ; n++) {
      // After the first attempt the buyer's wait is spent: every later one starts at once or refuses.
      let routed = n > 0 ? { ...controls, routing: { ...controls.routing, max_wait_ms: 0 } } : controls;
      if (n > 0 && tried.length > 0) {
        const rest = controls.preferredProviders
          ? controls.preferredProviders.filter((id) => !tried.includes(id))
          : await liveProvidersOf(model, tried);
        if (rest.length === 0) throw lastFailure!;
        // The first provider already had the buyer's whole wait: the next starts now or refuses.
        routed = { ...routed, preferredProviders: rest };
      }
      try {
        return await paidAttempt(ask, reply, routed, n === 0 ? req.id : `${req.id}-f${n}`, n < MAX_FAILOVERS);
      } catch (e) {
        if (!(e instanceof Failover)) throw e;
        lastFailure = e.error;
        if (e.unhedge) {
          // Half the cap could not pay for a hedged attempt: run once, with the whole cap.
          controls = { ...controls, routing: { ...controls.routing, hedge: false } };
          continue;
        }
        // (Only an attempt with failovers left throws a plain Failover: see paidAttempt's mayFailOver.)
        tried.push(e.provider);
      }
    }
  }

  async function paidAttempt(ask: PaidAsk, reply: FastifyReply, controls: RoutingControls, requestId: string, mayFailOver: boolean): Promise<unknown> {
    const { endpoint, body, model, bodySha256, idem, uncappedHold } = ask;
    // A hedge runs twice: under X-Service-Max-Cost-Usd each attempt holds half the cap, so the two
    // together never hold more than the buyer allowed (the cap still judges the request; each node
    // caps its generation at what its hold pays for). Without a second provider it runs once, with
    // the whole cap; if half the cap cannot pay for an attempt, it runs once too (see paid()).
    // A retry going back to the provider that answered it is answered from its record: nothing to race.
    const retry = idem !== undefined && idempotentAt.has(idempotentKey(endpoint, idem));
    const live = controls.routing.hedge === true && endpoint !== 'embeddings' && !retry ? await liveProvidersOf(model, []) : [];
    const hedge = live.length >= 2;
    const cap = controls.routing.max_cost_micro_usd;
    const halved = hedge && cap !== undefined;
    const hold = halved ? (BigInt(cap) / 2n).toString() : cap ?? uncappedHold;
    let granted = await ticketFor(endpoint, model, bodySha256, controls, requestId, idem, hold);
    // (A retry going back to its first provider is never hedged: `retry` turned the hedge off.)
    const hedged = hedge ? await hedgeTicket(endpoint, model, bodySha256, controls, live, granted.provider, `${requestId}-hedge`, hold) : undefined;
    // The second provider was listed but could not be ticketed: one attempt, with the whole cap.
    if (halved && !hedged) granted = await ticketFor(endpoint, model, bodySha256, controls, requestId, idem, cap);
    const attempts = [granted, ...(hedged ? [hedged] : [])].map((g) => {
      const ac = new AbortController();
      return { g, p: paidOf(endpoint, model, body, bodySha256, g, idem !== undefined), ac, idle: new IdleWatch(ac, providerIdleMs) };
    });
    for (const a of attempts) records.begin({ request_id: a.p.requestId, endpoint, model, provider: a.p.provider });

    // A buyer who leaves cancels the request at the node: its stream is reset, generation stops,
    // and the node writes a `cancelled` receipt for what it delivered.
    const raw = reply.raw;
    const gone = new AbortController();
    let finishedStream = false; // the whole SSE answer ([DONE]) was relayed: nothing left to cancel
    const onClose = (): void => {
      if (!raw.writableFinished && !finishedStream) gone.abort(new Error('the buyer left'));
    };
    raw.on('close', onClose);
    if (raw.destroyed) onClose();
    for (const a of attempts) gone.signal.addEventListener('abort', () => a.ac.abort(gone.signal.reason), { once: true });

    // Dispatch every attempt; the first to answer 200 wins, a refusal waits for the other.
    type Outcome = { ok: true; a: (typeof attempts)[number]; res: P2pResponse; head: JsonObject } | { ok: false; a: (typeof attempts)[number]; stage: 'connect' | 'head'; e: Error; res?: P2pResponse };
    const dispatch = async (a: (typeof attempts)[number]): Promise<Outcome> => {
      let res: P2pResponse;
      try {
        res = await p2pRequest(host, a.p.target, INFER_PROTOCOL, { endpoint, ticket: a.g.envelope as JsonObject, ...(idem !== undefined ? { idempotency_key: idem } : {}) }, body, { signal: a.ac.signal });
      } catch (e) {
        return { ok: false, a, stage: 'connect', e: e as Error };
      }
      try {
        const head = await res.head;
        a.idle.kick();
        return { ok: true, a, res, head };
      } catch (e) {
        return { ok: false, a, stage: 'head', e: e as Error, res };
      }
    };
    const running = attempts.map(dispatch);
    let outcome = await Promise.race(running);
    /** Whether the other half of a hedge failed without starting (not reached, or refused before work). */
    let otherNotStarted = false;
    if (attempts.length > 1 && !(outcome.ok && outcome.head.status === 200)) {
      const other = await running[outcome.a === attempts[0] ? 1 : 0]!;
      if (other.ok && other.head.status === 200) outcome = other;
      else otherNotStarted = other.ok ? other.head.status === 403 || other.head.status === 503 : other.stage === 'connect';
    }
    // The loser is cancelled; what it did is settled from its node's log.
    for (const a of attempts) {
      if (a === outcome.a) continue;
      a.idle.stop();
      a.ac.abort(new Error('lost the hedge'));
      // Tracked at once, so close() waits for this settlement before it closes the records.
      void track(
        a.p.requestId,
        running[attempts.indexOf(a)]!.then((r) => {
          r.res?.abort('lost the hedge');
          return settleFromNode(a.p, 'lost_hedge');
        }),
      );
    }
    const p = outcome.a.p;
    reply.header('x-request-id', p.requestId);
    const fail = (status: 'refused' | 'failed' | 'bad_provider_response', e: GatewayError): never => {
      records.fail(p.requestId, status, { code: e.code, message: e.message });
      // Nothing was done and nothing charged: the next provider may start it.
      if (mayFailOver && attempts.length === 1 && !gone.signal.aborted && e.status === 503 && (e.code === 'provider_unreachable' || e.code === 'no_capacity')) {
        raw.off('close', onClose);
        throw new Failover(p.provider, e);
      }
      // A hedged pair under half the cap each, neither started (refused, or no capacity): half the
      // cap may be what stopped them, so the request runs once, with the whole cap.
      if (halved && attempts.length === 2 && otherNotStarted && !gone.signal.aborted && (e.status === 403 || e.status === 503)) {
        raw.off('close', onClose);
        throw new Failover(p.provider, e, true);
      }
      throw e;
    };

    const idle = outcome.a.idle;
    if (!outcome.ok) {
      idle.stop();
      if (gone.signal.aborted) return abandon(p, reply);
      if (outcome.stage === 'connect') return fail('failed', new GatewayError(503, 'provider_unreachable', `could not reach provider ${p.provider}: ${outcome.e.message}`));
      // The stream opened but no head came: the provider may have started; its log knows.
      void settleFromNode(p, 'failed');
      if (idle.timedOut) throw new GatewayError(504, 'provider_timeout', `the provider sent no answer within ${providerIdleMs} ms`);
      throw new GatewayError(502, 'bad_provider_response', `the provider did not answer: ${outcome.e.message}`);
    }
    const { res, head } = outcome;
    const status = typeof head.status === 'number' ? head.status : 0;
    if (status === 200 && idem !== undefined) rememberIdempotent(endpoint, idem, p.provider);
    const headers = isObj(head.headers) ? head.headers : {};
    if (status !== 200) {
      // A refusal before any work: HEAD {status}, TRAILER {error}. Relay both; nothing was charged.
      let trailer: JsonObject = {};
      try {
        trailer = (await readResponse(res)).trailer;
      } catch {
        // fall through: no error envelope
      }
      idle.stop();
      const err = readErrorBody(trailer);
      if (!err || status < 400 || status > 599) return fail('bad_provider_response', new GatewayError(502, 'bad_provider_response', `the provider answered HTTP ${status} without an error`));
      return fail('refused', new GatewayError(status, err.code, err.message));
    }
    const contentType = typeof headers['content-type'] === 'string' ? headers['content-type'] : '';
    if (contentType.startsWith('text/event-stream')) return relayStream(p, res, reply, gone.signal, idle, () => (finishedStream = true));
    return relayBody(p, res, reply, gone.signal, idle);
  }

  /** The buyer left: the node's receipt (if it did any work) is settled in the background. */
  function abandon(p: Paid, reply: FastifyReply): FastifyReply {
    void settleFromNode(p, 'abandoned');
    reply.hijack();
    return reply;
  }

  /** The provider's answer broke off (the buyer still there): its receipt, if any, is settled from the node's log. */
  function brokeOff(p: Paid, e: unknown, idle: IdleWatch, what: 'answer' | 'stream'): GatewayError {
    void settleFromNode(p, 'failed');
    if (idle.timedOut) return new GatewayError(502, 'provider_timeout', `the provider sent nothing for ${providerIdleMs} ms and was cut off`);
    return new GatewayError(502, 'bad_provider_response', `the provider's ${what} broke off: ${(e as Error).message}`);
  }

  /** The TRAILER's receipt checked against the answer relayed; a bad one fails the record. */
  function checkTrailer(p: Paid, trailer: JsonObject | undefined, hash: crypto.Hash): CheckedReceipt {
    const checked = checkReceipt(trailer?.receipt, { ...p.exp, responseSha256: hash.digest('hex') }, p.idempotent);
    if (!checked.ok) records.fail(p.requestId, 'bad_provider_response', { code: 'bad_provider_response', message: checked.message });
    return checked;
  }

  async function relayBody(p: Paid, res: P2pResponse, reply: FastifyReply, gone: AbortSignal, idle: IdleWatch): Promise<unknown> {
    const hash = crypto.createHash('sha256');
    const parts: Uint8Array[] = [];
    let trailer: JsonObject | undefined;
    try {
      for await (const f of res.frames) {
        idle.kick();
        if (f.kind === 'data') {
          hash.update(f.bytes);
          parts.push(f.bytes);
        } else trailer = f.value;
      }
    } catch (e) {
      if (gone.aborted) return abandon(p, reply);
      throw brokeOff(p, e, idle, 'answer');
    } finally {
      idle.stop();
    }
    const checked = checkTrailer(p, trailer, hash);
    if (!checked.ok) throw new GatewayError(502, 'bad_provider_response', checked.message);
    const id = checked.payload.request_id; // an idempotent retry is answered with the first request's receipt
    if (id !== p.requestId) reply.header('x-request-id', id);
    // Settled in the background: the buyer's answer waits for the receipt to verify, never for the
    // market (GET /v1/requests/{id} and close() wait for the settlement).
    if (checked.payload.status !== 'completed') {
      void track(id, settle(id, checked, p.requestId).then(() => undefined));
      return reply.code(502).type(JSON_TYPE).send({ ...errorBody('provider_failed', `the provider's run ended ${checked.payload.status}; its receipt bills only what it delivered`), service: { request_id: id, receipt: checked.envelope } });
    }
    let body: unknown;
    try {
      body = JSON.parse(Buffer.concat(parts).toString('utf8'));
    } catch {
      body = undefined;
    }
    const problem = !isObj(body) ? 'the body is not a JSON object' : usageMismatch(body, checked);
    if (problem) {
      records.fail(p.requestId, 'bad_provider_response', { code: 'bad_provider_response', message: problem });
      throw new GatewayError(502, 'bad_provider_response', problem);
    }
    const out = body as Record<string, unknown>;
    out.service = { ...(isObj(out.service) ? out.service : {}), request_id: id, receipt: checked.envelope };
    void track(id, settle(id, checked, p.requestId).then(() => undefined));
    return reply.code(200).type(JSON_TYPE).send(JSON.stringify(out));
  }

  async function relayStream(p: Paid, res: P2pResponse, reply: FastifyReply, gone: AbortSignal, idle: IdleWatch, markFinished: () => void): Promise<unknown> {
    // Once the buyer has the whole answer ([DONE]) they may ask for the record at once, while the
    // trailer is still on its way: GET /v1/requests/{id} then waits for this relay to settle.
    let relayed!: () => void;
    const whenRelayed = new Promise<void>((r) => (relayed = r));
    let tracking = false;
    const finished = (): void => {
      markFinished();
      if (!tracking) void track(p.requestId, whenRelayed);
      tracking = true;
    };
    try {
      return await relayStreamFrames(p, res, reply, gone, idle, finished);
    } finally {
      idle.stop();
      relayed();
    }
  }

  async function relayStreamFrames(p: Paid, res: P2pResponse, reply: FastifyReply, gone: AbortSignal, idle: IdleWatch, finished: () => void): Promise<unknown> {
    /** Relays what is pending (after anything held), unheld: an event too large to hold, or the stream's unterminated end. */
    const flushPending = async (): Promise<void> => {
      if (held) await write(held);
      held = undefined;
      const chunks = pending;
      pending = [];
      pendingBytes = 0;
      for (const c of chunks) await write(c);
    };
    /** The gateway's own closing error event, on a line of its own even after an unterminated event. */
    const endWithError = (code: string, message: string): void => {
      if (openEvent && !raw.destroyed && !raw.writableEnded) raw.write('\n\n');
      endStream(raw, code, message);
    };
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
      'x-request-id': p.requestId,
      'x-service-stream-mode': 'live',
    });
    raw.flushHeaders();
    const hash = crypto.createHash('sha256');
    let trailer: JsonObject | undefined;
    // The stream's last event ([DONE], or the responses protocol's closing event) is held until the
    // receipt verifies: a client stops reading there, so an answer whose receipt fails must end
    // with the error event instead.
    // Events are relayed whole: bytes after a frame's last blank line wait for the frame that ends
    // their event, so a closing event split across frames is still recognised and held. An event
    // larger than MAX_HELD_EVENT is relayed as it comes instead (never held, never buffered whole).
    let held: Uint8Array | undefined;
    let pending: Uint8Array[] = [];
    let pendingBytes = 0;
    /** The last bytes written end inside an event (no blank line after them). */
    let openEvent = false;
    const write = async (bytes: Uint8Array): Promise<void> => {
      if (!bytes.length) return;
      openEvent = !endsWithBlankLine(bytes);
      if (gone.aborted || raw.destroyed || raw.write(bytes)) return;
      // The buyer is slow to read: that wait is theirs, not the provider's.
      idle.pause();
      try {
        await drained(raw);
      } finally {
        idle.resume();
      }
    };
    try {
      for await (const f of res.frames) {
        idle.kick();
        if (f.kind === 'data') {
          hash.update(f.bytes);
          const end = eventsEndAcross(pending[pending.length - 1], f.bytes);
          if (end === 0) {
            pending.push(f.bytes);
            pendingBytes += f.bytes.length;
            if (pendingBytes > MAX_HELD_EVENT) await flushPending();
            continue;
          }
          const events = pending.length ? concatBytes(...pending, f.bytes.subarray(0, end)) : f.bytes.subarray(0, end);
          pending = end < f.bytes.length ? [f.bytes.subarray(end)] : [];
          pendingBytes = f.bytes.length - end;
          if (held) await write(held); // more after the last event: relayed in order, as sent
          const cut = lastEventAt(events);
          held = isTerminalEvent(events.subarray(cut)) ? events.subarray(cut) : undefined;
          if (held) finished();
          await write(held ? events.subarray(0, cut) : events);
        } else trailer = f.value;
      }
      if (pendingBytes) await flushPending(); // bytes that end no event: relayed as they are
    } catch (e) {
      if (gone.aborted) {
        void settleFromNode(p, 'abandoned');
        return reply;
      }
      // The provider broke off mid-stream: its receipt (if any) bills what it delivered.
      finished();
      const err = brokeOff(p, e, idle, 'stream');
      endWithError(err.code, err.message);
      return reply;
    }
    finished();
    const work = (async () => {
      const checked = checkTrailer(p, trailer, hash);
      if (!checked.ok) {
        endWithError('bad_provider_response', checked.message);
        return;
      }
      if (checked.payload.status !== 'completed') {
        // The run failed or was cut short at the node: its receipt bills only what it delivered.
        const why = isObj(trailer?.error) && typeof trailer.error.message === 'string' ? `: ${trailer.error.message.slice(0, 200)}` : '';
        endWithError('provider_failed', `the provider's run ended ${checked.payload.status}${why}; its receipt bills only what it delivered`);
      } else {
        if (held) await write(held);
        endStream(raw);
      }
      // The stream has ended: the market is told after, never in the buyer's way.
      await settle(checked.payload.request_id, checked, p.requestId);
    })();
    await track(p.requestId, work);
    return reply;
  }

  /** Ends a relayed stream; with an error, as one last SSE event the buyer's client reports. */
  function endStream(raw: ServerResponse, code?: string, message?: string): void {
    if (raw.destroyed || raw.writableEnded) return;
    if (code) raw.write(`data: ${JSON.stringify(errorBody(code, message ?? code))}\n\n`);
    raw.end();
  }

  for (const endpoint of PAID_ENDPOINTS) app.post(`/v1/${endpoint}`, (req, reply) => paid(endpoint, req, reply));

  // ---- free endpoints --------------------------------------------------------------------------

  /** Providers that list the model and meet the routing controls the list can show, preferred first. */
  function candidates(providers: ProviderEntry[], model: string, controls: RoutingControls): { provider: ProviderEntry; context: number | undefined }[] {
    const known = providers.filter((p) => p.models.some((m) => m.id === model));
    if (known.length === 0) throw new GatewayError(404, 'model_not_found', `no provider serves model "${model.slice(0, 256)}"`);
    const serving = known.filter((p) => p.live !== false && p.accepting !== false);
    const r = controls.routing;
    let fit = serving
      .map((p) => ({ provider: p, model: p.models.find((m) => m.id === model)! }))
      .filter(({ provider: p }) => r.min_attestation_tier === undefined || p.attestation_tier === undefined || p.attestation_tier >= r.min_attestation_tier)
      .filter(({ model: m }) => (r.min_context === undefined || (m.context ?? 0) >= r.min_context) && (r.quantization === undefined || (m.quantization !== undefined && quantizationBucket(m.quantization) === r.quantization)) && (r.min_tokens_per_second === undefined || (m.tokens_per_second ?? 0) >= r.min_tokens_per_second));
    const preferred = controls.preferredProviders;
    if (preferred) fit = fit.filter((c) => preferred.includes(c.provider.provider)).sort((a, b) => preferred.indexOf(a.provider.provider) - preferred.indexOf(b.provider.provider));
    if (fit.length === 0) throw new GatewayError(503, 'no_provider', `no live provider of "${model.slice(0, 256)}" meets the routing controls`);
    return fit.map((c) => ({ provider: c.provider, context: c.model.context }));
  }

  /** A provider's own tokenization of a body (its tokenizer and chat template). */
  async function askTokens(c: { provider: ProviderEntry }, endpoint: 'tokenize' | 'count_tokens', body: Uint8Array): Promise<{ count: number; tokens: unknown[] | null }> {
    let r;
    try {
      const target = dialTarget(c.provider.provider, c.provider.peer_id, c.provider.addresses);
      r = await readResponse(await p2pRequest(host, target, INFER_PROTOCOL, { endpoint }, body, { signal: AbortSignal.timeout(30_000) }));
    } catch (e) {
      throw e instanceof GatewayError ? new ProviderUnreached(e.status, e.code, e.message) : new ProviderUnreached(503, 'provider_unreachable', `could not reach provider ${c.provider.provider}: ${(e as Error).message}`);
    }
    const status = typeof r.head.status === 'number' ? r.head.status : 0;
    if (status !== 200) {
      const err = readErrorBody(r.trailer);
      if (!err || status < 400 || status > 599) throw new GatewayError(502, 'bad_provider_response', `the provider answered HTTP ${status} without an error`);
      throw new GatewayError(status, err.code, err.message);
    }
    let v: unknown;
    try {
      v = JSON.parse(Buffer.from(r.body).toString('utf8'));
    } catch {
      v = undefined;
    }
    if (!isObj(v) || typeof v.count !== 'number' || !Number.isSafeInteger(v.count) || v.count < 0 || (v.tokens !== undefined && !Array.isArray(v.tokens))) {
      throw new GatewayError(502, 'bad_provider_response', 'the provider\'s tokenization is malformed');
    }
    return { count: v.count, tokens: Array.isArray(v.tokens) ? v.tokens : null };
  }

  async function tokenize(endpoint: 'tokenize' | 'count_tokens', req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const controls = parseRoutingHeaders(req.headers);
    const body = bodyBytes(req);
    const model = peekModel(body);
    const list = candidates(await market.providers(), model, controls);
    let lastError: GatewayError | undefined;
    for (const c of list) {
      let t;
      try {
        t = await askTokens(c, endpoint, body);
      } catch (e) {
        if (e instanceof ProviderUnreached) {
          lastError = e;
          continue; // failover to the next provider
        }
        throw e;
      }
      return reply
        .code(200)
        .type(JSON_TYPE)
        .send({ object: 'tokenization', model, count: t.count, tokens: t.tokens, max_model_len: c.context ?? null, provider: c.provider.provider });
    }
    throw lastError ?? new GatewayError(503, 'no_provider', 'no provider could be reached');
  }

  for (const endpoint of FREE_ENDPOINTS) app.post(`/v1/${endpoint}`, (req, reply) => tokenize(endpoint, req, reply));


  app.post('/v1/estimates', async (req, reply) => {
    for (const h of ['x-service-max-cost-usd', 'x-service-estimate']) {
      if (req.headers[h] !== undefined) throw invalid(h.replace(/(^|-)x/, 'X').replace(/-(\w)/g, (_, c: string) => `-${c.toUpperCase()}`), 'not accepted on /estimates');
    }
    const controls = parseRoutingHeaders(req.headers);
    let ask: { endpoint?: unknown; body?: unknown };
    try {
      ask = JSON.parse(bodyBytes(req).toString('utf8')) as typeof ask;
    } catch {
      throw invalid('body', 'expected a JSON object {endpoint, body}');
    }
    const endpoint = typeof ask?.endpoint === 'string' ? ESTIMATE_ENDPOINTS[ask.endpoint] : undefined;
    if (!endpoint) throw invalid('endpoint', `expected one of ${Object.keys(ESTIMATE_ENDPOINTS).join(', ')}`);
    if (!isObj(ask.body)) throw invalid('body', 'expected the request body of that endpoint');
    const bytes = Buffer.from(JSON.stringify(ask.body));
    let parsed: ParsedRequest;
    try {
      parsed = parseRequest(endpoint, bytes);
    } catch (e) {
      if (e instanceof ContractError) throw invalid(e.field ? `body.${e.field}` : 'body', e.message.replace(/^[^:]*: /, ''));
      throw e;
    }
    const [c] = candidates(await market.providers(), parsed.model, controls);
    const rates = c!.provider.rates?.[parsed.model];
    if (!rates) throw new GatewayError(503, 'no_provider', 'the provider publishes no price for this model');
    const r = controls.routing;
    if ((r.max_input_price_micro_usd_per_mtok !== undefined && BigInt(rates.input_per_mtok) > BigInt(r.max_input_price_micro_usd_per_mtok)) || (r.max_output_price_micro_usd_per_mtok !== undefined && BigInt(rates.output_per_mtok) > BigInt(r.max_output_price_micro_usd_per_mtok))) {
      throw new GatewayError(403, 'price_ceiling_exceeded', 'the price is above the ceiling');
    }
    if (r.max_request_price_micro_usd !== undefined && representativePrice(ratesFromWire(rates)) > BigInt(r.max_request_price_micro_usd)) {
      throw new GatewayError(403, 'price_ceiling_exceeded', `${REPRESENTATIVE_REQUEST_TEXT} costs more than X-Service-Max-Representative-Request-Price-Usd`);
    }
    let inputTokens = 0;
    if (parsed.endpoint === 'embeddings') {
      for (const text of parsed.input) inputTokens += (await askTokens(c!, 'count_tokens', Buffer.from(JSON.stringify({ model: parsed.model, prompt: text })))).count;
    } else {
      const count = parsed.endpoint === 'completions' ? { prompt: parsed.prompt } : { messages: parsed.messages };
      inputTokens = (await askTokens(c!, 'count_tokens', Buffer.from(JSON.stringify({ model: parsed.model, ...count })))).count;
    }
    const room = Math.max(0, (c!.context ?? 0) - inputTokens);
    const asked = 'maxTokens' in parsed && parsed.maxTokens !== undefined ? parsed.maxTokens : undefined;
    // As the node: max_tokens beyond what the context leaves is refused, never cut.
    if (parsed.endpoint !== 'embeddings' && asked !== undefined && asked > room) throw new GatewayError(400, 'context_length_exceeded', `input (${inputTokens}) plus max_tokens (${asked}) exceed the model's context of ${c!.context ?? 0}`);
    const maxOutput = parsed.endpoint === 'embeddings' ? 0 : (asked ?? room);
    const maxHold = worstCaseCost({ inputTokens, maxOutputTokens: maxOutput }, ratesFromWire(rates));
    const est = estimates.add({
      endpoint,
      model: parsed.model,
      bodySha256: canonicalBodySha256(bytes),
      routing: routingKey(controls),
      provider: c!.provider.provider,
      priceVersion: c!.provider.price_version ?? '',
      inputTokens,
      maxOutputTokens: maxOutput,
      expectedMicroUsd: maxHold,
      maxHoldMicroUsd: maxHold,
    });
    return reply.code(200).type(JSON_TYPE).send({
      object: 'estimate',
      estimate_id: est.estimateId,
      endpoint: ask.endpoint,
      model: est.model,
      price_version: est.priceVersion,
      input_tokens: est.inputTokens,
      max_output_tokens: est.maxOutputTokens,
      expected_cost: formatUsd(est.expectedMicroUsd),
      max_hold: formatUsd(est.maxHoldMicroUsd),
      expires_at: Math.floor(est.expiresAt / 1000),
      can_start: { provider: est.provider, live: c!.provider.live !== false, accepting: c!.provider.accepting !== false },
    });
  });

  // ---- catalog and records ---------------------------------------------------------------------

  async function catalog(): Promise<Record<string, unknown>[]> {
    const byId = new Map<string, { id: string; providers: Set<string>; context: number; quantizations: Set<string>; seen: number }>();
    for (const p of await market.providers()) {
      for (const m of p.models) {
        const e = byId.get(m.id) ?? { id: m.id, providers: new Set<string>(), context: 0, quantizations: new Set<string>(), seen: Number.MAX_SAFE_INTEGER };
        e.providers.add(p.provider);
        e.context = Math.max(e.context, m.context ?? 0);
        if (m.quantization) e.quantizations.add(quantizationBucket(m.quantization));
        if (typeof p.last_seen === 'number') e.seen = Math.min(e.seen, p.last_seen);
        byId.set(m.id, e);
      }
    }
    return [...byId.values()]
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
      .map((e) => ({
        id: e.id,
        object: 'model',
        created: e.seen === Number.MAX_SAFE_INTEGER ? 0 : Math.floor(e.seen / 1000),
        owned_by: e.id.includes('/') ? e.id.split('/')[0] : 'service',
        context_length: e.context,
        quantizations: [...e.quantizations].sort(),
        providers: e.providers.size,
      }));
  }

  async function oneModel(id: unknown, reply: FastifyReply): Promise<unknown> {
    if (typeof id !== 'string' || id.length === 0) throw invalid('id', 'expected a model id');
    const m = (await catalog()).find((e) => e.id === id);
    if (!m) throw new GatewayError(404, 'model_not_found', `unknown model "${id.slice(0, 256)}"`);
    return reply.type(JSON_TYPE).send(m);
  }

  app.get('/v1/models', async (_req, reply) => reply.type(JSON_TYPE).send({ object: 'list', data: await catalog() }));
  app.get('/v1/models/by-id', async (req, reply) => oneModel((req.query as Record<string, unknown>).id, reply));
  app.get('/v1/models/*', async (req, reply) => oneModel(decodeURIComponent((req.params as Record<string, string>)['*'] ?? ''), reply));

  app.get('/v1/requests/:id', async (req, reply) => {
    const id = (req.params as { id: string }).id;
    if (!REQUEST_ID_RE.test(id)) throw invalid('id', 'expected a request id');
    // A request whose answer is out but whose receipt is still being checked, fetched or posted:
    // wait (bounded) for the settled record rather than show it half done.
    const deadline = Date.now() + receiptFetchMs + 5000;
    for (let pending = settling.get(id); pending && Date.now() < deadline; pending = settling.get(id)) {
      await settledWithin(pending, Math.max(0, deadline - Date.now()));
    }
    const rec = records.get(id);
    if (!rec) throw new GatewayError(404, 'request_not_found', `unknown request ${id}`);
    return reply.type(JSON_TYPE).send(rec);
  });

  const listenHost = opts.host ?? '127.0.0.1';
  try {
    await app.listen({ host: listenHost, port: opts.port ?? GATEWAY_DEFAULT_PORT });
  } catch (e) {
    await host.stop();
    records.close();
    throw e;
  }
  const addr = app.server.address() as AddressInfo;
  const urlHost = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  const idle = async (): Promise<void> => {
    while (settling.size > 0) await Promise.allSettled([...settling.values()]);
  };
  return {
    url: `http://${urlHost}:${addr.port}/v1`,
    host: addr.address,
    port: addr.port,
    app,
    libp2p: host,
    market,
    records,
    idle,
    async close(graceMs = 10_000) {
      const force = setTimeout(() => app.server.closeAllConnections(), graceMs);
      try {
        await app.close();
      } finally {
        clearTimeout(force);
      }
      try {
        // Settlements (receipts fetched from nodes, posted to the market) get their own grace too:
        // a shutdown is bounded whatever a node or the market does. One cut short leaves its record
        // in_progress (with a records file it reads `interrupted` after the next start); the
        // receipt itself is in the node's log and reaches the market from there.
        if (!(await settledWithin(idle(), graceMs))) log.warn({ pending: settling.size, grace_ms: graceMs }, 'gateway closed with settlements still running');
        await host.stop();
      } finally {
        records.close();
      }
    },
  };
}

/** Why a completed JSON body disagrees with its receipt (usage and cost), or undefined. */
function usageMismatch(body: Record<string, unknown>, r: Extract<CheckedReceipt, { ok: true }>): string | undefined {
  const u = body.usage;
  if (!isObj(u)) return undefined;
  const p = r.payload;
  if (u.prompt_tokens !== undefined && u.prompt_tokens !== p.usage.input_tokens) return `usage.prompt_tokens is ${String(u.prompt_tokens)}, the receipt says ${p.usage.input_tokens}`;
  if (u.completion_tokens !== undefined && u.completion_tokens !== p.usage.output_tokens) return `usage.completion_tokens is ${String(u.completion_tokens)}, the receipt says ${p.usage.output_tokens}`;
  if (u.input_tokens !== undefined && u.input_tokens !== p.usage.input_tokens) return `usage.input_tokens is ${String(u.input_tokens)}, the receipt says ${p.usage.input_tokens}`;
  if (u.output_tokens !== undefined && u.output_tokens !== p.usage.output_tokens) return `usage.output_tokens is ${String(u.output_tokens)}, the receipt says ${p.usage.output_tokens}`;
  if (u.cost !== undefined && u.cost !== formatUsd(BigInt(p.cost_micro_usd))) return `usage.cost is ${String(u.cost)}, the receipt says ${formatUsd(BigInt(p.cost_micro_usd))}`;
  return undefined;
}
