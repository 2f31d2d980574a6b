// Tickets for the gateway's paid requests: asked of the marketplace, checked against what was
// asked (market key, body hash, request id, cost cap, preferred providers), and steered: a retry
// under an Idempotency-Key goes back to the provider that answered it, a hedge goes elsewhere.
import type { Multiaddr } from '@multiformats/multiaddr';
import type { WireRates } from '../../attestation/receipt.ts';
import type { TicketPayload, TicketRouting } from '../../attestation/ticket.ts';
import { verifyTicket } from '../../attestation/ticket-verify.ts';
import { quantizationBucket, worstCaseCost } from '../dispatch/routing.ts';
import { PAID_ENDPOINTS, type PaidEndpoint } from '../serve/contract.ts';
import { dialTarget } from './dial-target.ts';
import { GatewayError } from './errors.ts';
import type { MarketClient, ProviderEntry, TicketRequest } from './market-client.ts';
import type { ReceiptExpectation } from './receipt-check.ts';
import type { RoutingControls } from './routing-headers.ts';


/** A ticket the marketplace granted, checked, with where to dial its provider. */
export interface Granted {
  ticket: TicketPayload;
  provider: string;
  target: Multiaddr[];
  envelope: unknown;
  rates?: WireRates;
}

/** One attempt at a paid request: its request id, its provider and what its receipt must say. */
export interface Paid {
  requestId: string;
  provider: string;
  target: Multiaddr[];
  idempotent: boolean;
  /** Its Idempotency-Key as Ticketing keeps it (idempotentKey: endpoint and key), when it has one. */
  idemKey?: string;
  exp: ReceiptExpectation;
  /** A hedged request's other attempt (X-Service-Hedge), which bills its own work in its own record. */
  hedgedWith?: string;
}

/** What a paid request asks tickets for: the same for each of its attempts (first, hedge, failover). */
export interface TicketAsk {
  endpoint: PaidEndpoint;
  model: string;
  bodySha256: string;
  controls: RoutingControls;
  /** Idempotency-Key, when the buyer sent one. */
  idem: string | undefined;
}

/** The Paid record of a granted ticket (checked in `take`: its endpoint, model and body hash are the ones asked for). */
export function paidOf(granted: Granted, idemKey: string | undefined): Paid {
  const t = granted.ticket;
  return {
    requestId: t.request_id,
    provider: granted.provider,
    target: granted.target,
    idempotent: idemKey !== undefined,
    ...(idemKey !== undefined ? { idemKey } : {}),
    exp: { provider: granted.provider, requestId: t.request_id, ticketId: t.ticket_id, endpoint: t.endpoint, model: t.model, bodySha256: t.body_sha256, holdMicroUsd: t.max_cost_micro_usd, priceVersion: t.price_version, ...(granted.rates ? { rates: granted.rates } : {}) },
  };
}

/** How long a gateway keeps the attempt that answered under an Idempotency-Key: as long as nodes keep their records (records.ts keeps its rows as long). */
export const IDEMPOTENT_KEPT_MS = 24 * 60 * 60 * 1000;

/** How many Idempotency-Keys the gateway remembers the answering provider of in memory. */
const IDEMPOTENT_REMEMBERED = 10_000;

/** The attempt that answered under an Idempotency-Key: its provider, and its request id (null: kept by a gateway before it kept them). */
export interface AnsweredAttempt {
  provider: string;
  requestId: string | null;
}

/** Where the answering providers are kept beyond memory (the gateway's records file), so a restart keeps them. */
export interface IdempotentProviderStore {
  idempotentProvider(key: string): AnsweredAttempt | undefined;
  rememberIdempotent(key: string, provider: string, requestId: string): void;
  /** Forgets the key if the attempt kept under it is still request `requestId`. */
  forgetIdempotent(key: string, requestId: string): void;
}

export class Ticketing {
  private readonly market: MarketClient;
  /**
   * Idempotency-Key → the provider its first attempt went to. A node answers a retry from its own
   * record, so the retry must go back there; anywhere else it would run (and be billed) again.
   */
  private readonly idempotentAt = new Map<string, { answered: AnsweredAttempt | null; at: number }>();
  private readonly store: IdempotentProviderStore | undefined;
  /** The account the tickets are asked for (the market's default when undefined): a node scopes Idempotency-Keys by it. */
  private readonly account: string | undefined;

  /** The clock that ages kept keys (tests give their own). */
  private readonly now: () => number;

  constructor(market: MarketClient, store?: IdempotentProviderStore, account?: string, now: () => number = Date.now) {
    this.market = market;
    this.store = store;
    this.account = account;
    this.now = now;
  }

  /**
   * The provider that answered under this key: remembered here, else in the store (then remembered
   * here too, a miss as '': one gateway owns its records file, so the store learns nothing new but
   * what remember() also keeps here, and a request asks once, not once per step).
   */
  private answeredAt(endpoint: PaidEndpoint, idem: string | undefined): string | undefined {
    if (idem === undefined) return undefined;
    // Under this endpoint, else under another: a key reused on another endpoint goes back to the
    // provider that holds its record too, which refuses it (409 idempotency_key_reused) wherever
    // the market would have sent it, rather than run and bill it as a new request elsewhere.
    for (const e of [endpoint, ...PAID_ENDPOINTS.filter((x) => x !== endpoint)]) {
      const key = idempotentKey(e, idem);
      const here = this.kept(key);
      if (here) return here.provider;
    }
    return undefined;
  }

  /**
   * The attempt kept under `key`, from memory or else the store (then kept in memory too, a miss as
   * null). Past IDEMPOTENT_KEPT_MS it is no longer kept, in memory as in the file: nodes keep their
   * records that long, and a provider gone since would refuse the key's retries for good (s30 review).
   */
  private kept(key: string): AnsweredAttempt | null {
    const here = this.idempotentAt.get(key);
    if (here && this.now() - here.at <= IDEMPOTENT_KEPT_MS) return here.answered;
    const answered = this.store?.idempotentProvider(key) ?? null;
    // (one read from the store: its rows age out there on their own)
    this.keep(key, answered);
    return answered;
  }

  /** `answered` null: a known miss. */
  private keep(key: string, answered: AnsweredAttempt | null): void {
    this.idempotentAt.delete(key);
    this.idempotentAt.set(key, { answered, at: this.now() });
    if (this.idempotentAt.size > IDEMPOTENT_REMEMBERED) this.idempotentAt.delete(this.idempotentAt.keys().next().value!);
  }

  /** Asks the marketplace for a ticket and checks it is what was asked for. */
  private async take({ endpoint, model, bodySha256 }: TicketAsk, controls: RoutingControls, requestId: string, hold: string | undefined): Promise<Granted> {
    const ask: TicketRequest = { endpoint, model, body_sha256: bodySha256, request_id: requestId };
    if (this.account !== undefined) ask.account = this.account;
    if (Object.keys(controls.routing).length > 0) ask.routing = controls.routing;
    if (hold !== undefined) ask.max_cost_micro_usd = hold;
    if (controls.preferredProviders) ask.providers = controls.preferredProviders;
    const grant = await this.market.ticket(ask);
    const key = await this.market.marketKey();
    const v = verifyTicket(grant.ticket, { marketplaceKeys: [{ publicKey: key.public_key, keyid: key.key_id }], provider: grant.provider, body: bodySha256 });
    if (!v.ok) throw new GatewayError(502, 'bad_market_response', `the marketplace's ticket does not verify: ${v.error.code}: ${v.error.message}`);
    const t = v.value.payload;
    // The market issues the ticket under the request id it was given (docs/market-api.md): one for
    // any other id is another request's, and taking it would put this request's record over that one.
    if (t.endpoint !== endpoint || t.model !== model || t.request_id !== requestId || grant.request_id !== requestId) throw new GatewayError(502, 'bad_market_response', 'the ticket is for another request');
    // The node enforces the routing the ticket carries, and only that: a ticket that left out (or
    // changed) a control the buyer asked for would have them served above a price ceiling, below a
    // tier, on another quantization. The market passes the routing in as given (the quantization
    // as its bucket).
    // Nodes keep Idempotency-Keys per the ticket's account: a ticket under another account than this gateway's would share them.
    if (this.account !== undefined && t.account !== this.account) throw new GatewayError(502, 'bad_market_response', `the marketplace's ticket is for account ${JSON.stringify(t.account.slice(0, 100))}, not ${JSON.stringify(this.account)}`);
    const lost = routingLost(controls.routing, t.routing ?? {});
    if (lost !== undefined) throw new GatewayError(502, 'bad_market_response', `the marketplace's ticket does not carry the routing asked for (${lost})`);
    if (hold !== undefined && BigInt(t.max_cost_micro_usd) > BigInt(hold)) {
      throw new GatewayError(502, 'bad_market_response', `the ticket holds ${t.max_cost_micro_usd} micro-USD, above X-Service-Max-Cost-Usd`);
    }
    // The market applies the set; a ticket for anyone else is still never used.
    if (controls.preferredProviders && !controls.preferredProviders.includes(grant.provider)) {
      throw new GatewayError(503, 'no_provider', `the marketplace chose provider ${grant.provider}, outside X-Service-Prefer-Providers`);
    }
    return { ticket: t, provider: grant.provider, target: dialTarget(grant.provider, grant.peer_id, grant.addresses), envelope: grant.ticket, ...(grant.rates ? { rates: grant.rates } : {}) };
  }

  /**
   * The ticket for a request; a retry under an Idempotency-Key goes back to the provider whose
   * answer the buyer got (unless X-Service-Prefer-Providers leaves it out): that provider answers it
   * from its record. Anywhere else it would run and be billed again, so when that provider cannot
   * take it now the retry is 503 idempotency_provider_unavailable, not run elsewhere.
   */
  async ticketFor(ask: TicketAsk, requestId: string, hold?: string): Promise<Granted> {
    const { controls, idem } = ask;
    const first = this.answeredAt(ask.endpoint, idem);
    if (first !== undefined && (!controls.preferredProviders || controls.preferredProviders.includes(first))) {
      try {
        return await this.take(ask, { ...controls, preferredProviders: [first] }, requestId, hold);
      } catch (e) {
        if (!(e instanceof GatewayError) || (e.code !== 'no_provider' && e.status !== 503)) throw e;
        throw idempotencyProviderUnavailable(first, e.message);
      }
    }
    return this.take(ask, controls, requestId, hold);
  }

  /**
   * X-Service-Hedge: a second ticket for another live provider of the model, or undefined when
   * there is none (the request then runs once). The two race; the loser is cancelled at its node
   * and settled for the work it did.
   */
  async hedgeTicket(ask: TicketAsk, live: readonly string[], first: string, requestId: string, hold?: string): Promise<Granted | undefined> {
    const others = live.filter((p) => p !== first);
    if (others.length === 0) return undefined;
    try {
      return await this.take(ask, { ...ask.controls, preferredProviders: others }, requestId, hold);
    } catch {
      return undefined; // no second route: run once
    }
  }

  /** The provider that answered a request under this Idempotency-Key (a retry goes back there, and only there), if any. */
  answeredBy(endpoint: PaidEndpoint, idem: string | undefined): string | undefined {
    return this.answeredAt(endpoint, idem);
  }

  /** Whether a request under this Idempotency-Key was answered before (a retry goes back there). */
  isRetry(endpoint: PaidEndpoint, idem: string | undefined): boolean {
    return this.answeredAt(endpoint, idem) !== undefined;
  }

  /** The attempt (its provider and request id) that answered a request under an Idempotency-Key (a hedge's winner, not its first ticket). */
  remember(endpoint: PaidEndpoint, idem: string, provider: string, requestId: string): void {
    const key = idempotentKey(endpoint, idem);
    this.keep(key, { provider, requestId });
    this.store?.rememberIdempotent(key, provider, requestId);
  }

  /**
   * Attempt `requestId` under `key` (idempotentKey) did not complete (its receipt is `cancelled`
   * or `failed`): its node recorded no answer for it (docs/protocol.md, Idempotency), so a retry
   * runs again, anywhere. Kept, the key would send every retry back to that provider alone, and
   * refuse it (idempotency_provider_unavailable) once the provider is gone (s30 review). Only
   * while that attempt is still the one kept: a retry that has answered since (a completed run,
   * its answer recorded at its node) keeps the key, or its next retry would run and bill again.
   */
  forget(key: string, requestId: string): void {
    const kept = this.kept(key);
    if (!kept || kept.requestId !== requestId) return;
    this.keep(key, null);
    this.store?.forgetIdempotent(key, requestId);
  }

  /** The market's listing of providers (a paid request fetches it once, however many attempts it makes). */
  providers(): Promise<ProviderEntry[]> {
    return this.market.providers();
  }
}

/**
 * The hold for embeddings without a cost cap. The market's default (one context's worth of
 * tokens) is too small for a batch of inputs; no tokenizer counts more tokens than the body has
 * bytes, so the body's length at the highest input rate among the model's providers covers it.
 */
export function embeddingsHold(listing: readonly ProviderEntry[], model: string, body: Uint8Array): string | undefined {
  let rate = 0n;
  for (const p of listing) {
    const r = p.rates?.[model];
    if (r && BigInt(r.input_per_mtok) > rate) rate = BigInt(r.input_per_mtok);
  }
  return rate === 0n ? undefined : worstCaseCost({ inputTokens: body.length, maxOutputTokens: 0 }, { input_per_mtok: rate, output_per_mtok: 0n }).toString();
}

/** A retry whose answering provider cannot take it now: never run elsewhere, where it would be billed again. */
export function idempotencyProviderUnavailable(provider: string, why: string): GatewayError {
  return new GatewayError(
    503,
    'idempotency_provider_unavailable',
    `the first request under this Idempotency-Key was answered by provider ${provider}, which cannot take the retry now (${why.slice(0, 300)}); its answer may be in that provider's record: retry later, or send the request under a new Idempotency-Key to run it again (and be billed again)`,
  );
}

export const idempotentKey = (endpoint: PaidEndpoint, idem: string): string => `${endpoint}\n${idem}`;

/** The first routing control asked for that the ticket does not carry as asked (quantization as its bucket), or undefined. */
export function routingLost(asked: TicketRouting, carried: TicketRouting): string | undefined {
  for (const [k, v] of Object.entries(asked) as [keyof TicketRouting, unknown][]) {
    if (v === undefined) continue;
    const want = k === 'quantization' && typeof v === 'string' ? quantizationBucket(v) : v;
    if (carried[k] !== want) return `${k}: asked ${JSON.stringify(want)}, the ticket has ${carried[k] === undefined ? 'none' : JSON.stringify(carried[k])}`;
  }
  return undefined;
}
