// The gateway's side of the development marketplace's HTTP API (docs/market-api.md): the market's
// key, the provider list, tickets and receipt settlement. Failures become GatewayErrors: the
// market's own error envelope and status are relayed; an unreachable market is 502
// market_unreachable and an answer that is not what the API promises is 502 bad_market_response.
import { BodyTooLargeError, readBoundedText } from '../bounded-body.ts';
import { fetchFailure } from '../fetch-failure.ts';
import { normalizeMarketUrl } from '../market-url.ts';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import type { WireRates } from '../../attestation/receipt.ts';
import { isHex } from '../../attestation/bytes.ts';
import { isMicroString } from '../../attestation/money.ts';
import { MAX_REQUEST_CONTRACTS } from '../market/registration-payload.ts';
import type { IssuedTicketResponse, TicketRequest } from '../market/tickets.ts';
import { GatewayError, readErrorBody } from './errors.ts';
import { isObj } from './request-body.ts';

export interface ProviderModel {
  id: string;
  quantization?: string;
  context?: number;
  slots?: number;
  tokens_per_second?: number;
  /** The paid endpoints it is sold for; absent: all of them (modelServes). */
  endpoints?: string[];
}

export interface ProviderEntry {
  provider: string;
  peer_id: string;
  addresses: string[];
  models: ProviderModel[];
  price_version?: string;
  /** Model id → rates (micro-USD per million tokens, decimal strings). */
  rates?: Record<string, { input_per_mtok: string; output_per_mtok: string }>;
  last_seen?: number;
  /** Since when the market lists it (its clock, ms). */
  registered_at?: number;
  attestation_tier?: string;
  /** Seen recently (the market's view); absent means unknown. */
  live?: boolean;
  /** Not stopping (the latest heartbeat); absent means unknown. */
  accepting?: boolean;
  /** The latest heartbeat's free slots and queue, by model. */
  capacity?: Map<string, ModelCapacity>;
  /** The provider's signed request contracts, as listed (verified where they are read). */
  request_contracts?: unknown[];
}

export interface ModelCapacity {
  free_slots: number;
  queued: number;
  queue_limit: number;
  /** False: the node takes no paid work for this model now (its other models go on). */
  accepting?: false;
}

/** Whether a listed provider takes paid work for `model` (unknown counts as yes, as the market counts it). */
export function acceptsModel(p: ProviderEntry, model: string): boolean {
  return p.accepting !== false && p.capacity?.get(model)?.accepting !== false;
}

const count = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

function readCapacity(v: unknown): Map<string, ModelCapacity> | undefined {
  if (!isObj(v) || !Array.isArray(v.models)) return undefined;
  const out = new Map<string, ModelCapacity>();
  for (const m of v.models) {
    if (isObj(m) && typeof m.id === 'string' && count(m.free_slots) && count(m.queued) && count(m.queue_limit) && !out.has(m.id)) {
      out.set(m.id, { free_slots: m.free_slots, queued: m.queued, queue_limit: m.queue_limit, ...(m.accepting === false ? { accepting: false as const } : {}) });
    }
  }
  return out;
}

/** What the market answers to POST /v1/tickets: the gateway reads the market's own response type. */
export type { TicketRequest };
export type TicketGrant = IssuedTicketResponse;

export interface MarketKey {
  public_key: string;
  key_id: string;
}

export interface ReceiptAck {
  ok: boolean;
  request_id?: string;
  cost_micro_usd?: string;
}

export interface MarketClientOptions {
  /** Per-call timeout (default 10 s). */
  timeoutMs?: number;
  fetch?: typeof fetch;
}


/**
 * The most read of one market answer. The provider list is the largest: a few MB usually, ~23 MB
 * with the dev market full (1,000 providers of 10 models and 32 long addresses each).
 */
const MAX_MARKET_ANSWER_BYTES = 64 * 1024 * 1024;
/** The statuses of the market's API that the gateway passes on with the market's error code. */
const RELAYED_STATUSES = new Set([400, 402, 403, 404, 408, 409, 413, 422, 429, 503]);

const bad = (what: string): GatewayError => new GatewayError(502, 'bad_market_response', `the marketplace's ${what} is malformed`);

/** One model's rates as a ticket grant states them; a malformed one is a bad market answer. */
function readWireRates(r: Record<string, unknown>): WireRates {
  if (!isMicroString(r.input_per_mtok) || !isMicroString(r.output_per_mtok)) throw bad('ticket rates');
  const out: WireRates = { input_per_mtok: r.input_per_mtok, output_per_mtok: r.output_per_mtok };
  if (r.per_unit !== undefined) {
    if (!isObj(r.per_unit) || !Object.values(r.per_unit).every(isMicroString)) throw bad('ticket rates');
    out.per_unit = r.per_unit as Record<string, string>;
  }
  return out;
}

/** Model id → rates, keeping only well-formed micro-USD decimal strings. */
function readRates(v: Record<string, unknown>): NonNullable<ProviderEntry['rates']> {
  // (No prototype: a model id from a buyer's body, "constructor" or "__proto__", finds no rates.)
  const out: NonNullable<ProviderEntry['rates']> = Object.create(null) as NonNullable<ProviderEntry['rates']>;
  for (const [id, r] of Object.entries(v)) {
    if (isObj(r) && isMicroString(r.input_per_mtok) && isMicroString(r.output_per_mtok)) {
      out[id] = { input_per_mtok: r.input_per_mtok, output_per_mtok: r.output_per_mtok };
    }
  }
  return out;
}

function readProvider(v: unknown): ProviderEntry | undefined {
  if (!isObj(v) || !isHex(v.provider, 32) || typeof v.peer_id !== 'string' || !Array.isArray(v.addresses) || !Array.isArray(v.models)) return undefined;
  const models: ProviderModel[] = [];
  for (const m of v.models) {
    if (!isObj(m) || typeof m.id !== 'string') continue;
    models.push({
      id: m.id,
      ...(typeof m.quantization === 'string' ? { quantization: m.quantization } : {}),
      ...(typeof m.context === 'number' ? { context: m.context } : {}),
      ...(typeof m.slots === 'number' ? { slots: m.slots } : {}),
      ...(typeof m.tokens_per_second === 'number' ? { tokens_per_second: m.tokens_per_second } : {}),
      ...(Array.isArray(m.endpoints) ? { endpoints: m.endpoints.filter((e): e is string => typeof e === 'string') } : {}),
    });
  }
  const capacity = readCapacity(v.capacity);
  return {
    provider: v.provider,
    peer_id: v.peer_id,
    addresses: v.addresses.filter((a): a is string => typeof a === 'string'),
    models,
    ...(typeof v.price_version === 'string' ? { price_version: v.price_version } : {}),
    ...(isObj(v.rates) ? { rates: readRates(v.rates) } : {}),
    ...(typeof v.last_seen === 'number' ? { last_seen: v.last_seen } : {}),
    ...(typeof v.registered_at === 'number' ? { registered_at: v.registered_at } : {}),
    ...(typeof v.attestation_tier === 'string' ? { attestation_tier: v.attestation_tier } : {}),
    ...(typeof v.live === 'boolean' ? { live: v.live } : {}),
    ...(typeof v.accepting === 'boolean' ? { accepting: v.accepting } : {}),
    ...(capacity ? { capacity } : {}),
    ...(Array.isArray(v.request_contracts) ? { request_contracts: v.request_contracts.slice(0, MAX_REQUEST_CONTRACTS) } : {}),
  };
}

export class MarketClient {
  readonly baseUrl: string;
  private readonly timeoutMs: number;
  private readonly fetchFn: typeof fetch;
  private key: Promise<MarketKey> | undefined;
  /** Aborted by close(): every call under way ends at once, and later ones fail at once. */
  private readonly closer = new AbortController();

  constructor(url: string, opts: MarketClientOptions = {}) {
    this.baseUrl = normalizeMarketUrl(url);
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.fetchFn = opts.fetch ?? fetch;
  }

  /** Ends every call under way (a gateway stopping waits for no market); later calls fail at once. */
  close(): void {
    this.closer.abort();
  }

  /**
   * JSON in, JSON out; a non-2xx answer throws the market's error (status and code relayed). A call
   * ends at its timeout, at close(), or when `signal` aborts.
   */
  private async call(method: 'GET' | 'POST', path: string, body?: unknown, signal?: AbortSignal): Promise<unknown> {
    const stopping = (): boolean => this.closer.signal.aborted || signal?.aborted === true;
    if (stopping()) throw new GatewayError(503, 'market_unreachable', `not asking the marketplace at ${this.baseUrl}: the gateway is stopping`);
    let res: Response;
    try {
      res = await this.fetchFn(`${this.baseUrl}${path}`, {
        method,
        headers: body === undefined ? { accept: 'application/json' } : { accept: 'application/json', 'content-type': 'application/json' },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        redirect: 'manual', // (the market's own answer, from the market's own address)
        signal: AbortSignal.any([this.closer.signal, AbortSignal.timeout(this.timeoutMs), ...(signal ? [signal] : [])]),
      });
    } catch (e) {
      if (stopping()) throw new GatewayError(503, 'market_unreachable', `the marketplace at ${this.baseUrl} had not answered when the gateway stopped`);
      throw new GatewayError(502, 'market_unreachable', `the marketplace at ${this.baseUrl} did not answer (${fetchFailure(e)})`);
    }
    let text = '';
    try {
      text = await readBoundedText(res, MAX_MARKET_ANSWER_BYTES);
    } catch (e) {
      if (stopping()) throw new GatewayError(503, 'market_unreachable', `the marketplace's answer to ${method} ${path} was cut off: the gateway stopped`);
      if (e instanceof BodyTooLargeError) throw new GatewayError(502, 'bad_market_response', `the marketplace's answer to ${method} ${path} is larger than ${e.maxBytes} bytes`);
      throw new GatewayError(502, 'market_unreachable', `the marketplace's answer to ${method} ${path} was cut off (${fetchFailure(e)})`);
    }
    let value: unknown;
    try {
      value = text === '' ? undefined : JSON.parse(text);
    } catch {
      value = undefined;
    }
    if (!res.ok) {
      const err = readErrorBody(value);
      // Relayed to the buyer as the market said it, for the statuses its API answers with; any
      // other (a redirect, a 401 from a proxy, a 399) is the market not answering as itself.
      if (err && RELAYED_STATUSES.has(res.status)) throw new GatewayError(res.status, err.code, err.message);
      throw new GatewayError(502, 'bad_market_response', `the marketplace answered ${method} ${path} with HTTP ${res.status}${err ? ` (${err.code})` : ''}`);
    }
    if (value === undefined) throw bad(`answer to ${method} ${path}`);
    return value;
  }

  /** GET /v1/market, once (the key does not change while the market runs). */
  marketKey(): Promise<MarketKey> {
    this.key ??= (async () => {
      const v = await this.call('GET', '/v1/market');
      if (!isObj(v) || !isHex(v.public_key, 32)) throw bad('key');
      return { public_key: v.public_key, key_id: typeof v.key_id === 'string' ? v.key_id : v.public_key };
    })();
    this.key.catch(() => (this.key = undefined)); // try again next time
    return this.key;
  }

  /** GET /v1/providers; with `requestContracts`, the providers' signed request contracts too (the catalog's). */
  async providers(opts: { requestContracts?: boolean } = {}): Promise<ProviderEntry[]> {
    const v = await this.call('GET', opts.requestContracts ? '/v1/providers?request_contracts=true' : '/v1/providers');
    const list = Array.isArray(v) ? v : isObj(v) && Array.isArray(v.providers) ? v.providers : isObj(v) && Array.isArray(v.data) ? v.data : undefined;
    if (!list) throw bad('provider list');
    return list.map(readProvider).filter((p): p is ProviderEntry => p !== undefined);
  }

  /** POST /v1/tickets. */
  async ticket(req: TicketRequest): Promise<TicketGrant> {
    const v = await this.call('POST', '/v1/tickets', req);
    if (!isObj(v) || !isObj(v.ticket) || typeof v.request_id !== 'string' || !isHex(v.provider, 32) || typeof v.peer_id !== 'string' || !Array.isArray(v.addresses)) throw bad('ticket');
    return {
      ticket: v.ticket as unknown as DsseEnvelope,
      request_id: v.request_id,
      provider: v.provider,
      peer_id: v.peer_id,
      addresses: v.addresses.filter((a): a is string => typeof a === 'string'),
      price_version: typeof v.price_version === 'string' ? v.price_version : '',
      ...(isObj(v.rates) ? { rates: readWireRates(v.rates) } : {}),
    };
  }

  /**
   * POST /v1/tickets/{id}/release: the ticket never reached its provider, so the market stops
   * counting it as outstanding (docs/market-api.md). Whether it was outstanding until now.
   */
  async releaseTicket(ticketId: string): Promise<boolean> {
    const v = await this.call('POST', `/v1/tickets/${encodeURIComponent(ticketId)}/release`);
    if (!isObj(v) || typeof v.released !== 'boolean') throw bad('ticket release');
    return v.released;
  }

  /** POST /v1/receipts: settles one receipt (idempotent per receipt at the market). `signal` ends the call. */
  async postReceipt(line: string, signal?: AbortSignal): Promise<ReceiptAck> {
    const v = await this.call('POST', '/v1/receipts', { receipt: line }, signal);
    if (!isObj(v)) throw bad('receipt acknowledgement');
    return {
      ok: v.ok === true,
      ...(typeof v.request_id === 'string' ? { request_id: v.request_id } : {}),
      ...(typeof v.cost_micro_usd === 'string' ? { cost_micro_usd: v.cost_micro_usd } : {}),
    };
  }
}
