// The development market's state, in memory within bounds (MarketLimits). With a file (MarketDb:
// `seller-node market --data DIR`) the tickets, receipts and totals are also written through to
// it, durably before the market answers, and read back at start; without one a restarted market
// knows no ticket or receipt. Providers are never kept: nodes find out from a 404 on their next
// heartbeat and register again.
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import type { Rates } from '../../attestation/money.ts';
import type { AttestationTier, ReceiptStatus } from '../../attestation/receipt.ts';
import { MarketError } from './errors.ts';
import type { MarketDb, OthersScope, Tally, TallyRow } from './market-db.ts';
import type { RegisteredModel } from './registration-payload.ts';

export interface ProviderRecord {
  provider: string;
  peer_id: string;
  addresses: string[];
  models: RegisteredModel[];
  price_version: string;
  attestation_tier: AttestationTier;
  /** Model id → rates, from the verified price list (the signed envelope itself is not kept: nothing reads it again). */
  rates: Map<string, Rates>;
  /** issued_at of the registration in force (an older one does not replace it). */
  issued_at: number;
  registered_at: number;
  /** Market time of the last registration or accepted heartbeat. */
  last_seen: number;
  /** What the market routes on from the latest accepted heartbeat (its own `at`), not the whole snapshot. */
  capacity?: HeldCapacity;
  /** Market time of the last ticket issued to this provider (spreads ties). */
  last_ticket_at: number;
  /** The provider's verified request contracts, as it signed them (listed for buyers to verify). */
  request_contracts?: DsseEnvelope[];
}

/** The part of a heartbeat's snapshot the market keeps: free slots and queue of the registered models only. */
export interface HeldCapacity {
  at: number;
  accepting: boolean;
  /** `accepting: false`: the node takes no paid work for that model now (its other models go on). */
  models: { id: string; free_slots: number; queued: number; queue_limit: number; accepting?: false }[];
}

export interface IssuedTicket {
  ticket_id: string;
  request_id: string;
  provider: string;
  endpoint: string;
  model: string;
  price_version: string;
  /** The hash of the request body the ticket admits: the receipt's request_sha256 must be it. */
  body_sha256: string;
  /** The model's rates under that price version, from the provider's verified price list. */
  rates: Rates;
  hold: bigint;
  issued_at: number;
  expires_at: number;
  /** Set once a receipt for it is collected: which one (the record itself may be evicted before the ticket). */
  settled?: { receipt_sha256: string; seq: string };
}

export interface ReceiptRecord {
  request_id: string;
  ticket_id: string;
  provider: string;
  model: string;
  endpoint: string;
  status: ReceiptStatus;
  cost_micro_usd: string;
  seq: string;
  /** The receipt envelope line (its canonical JSON, as the node's log holds it). */
  receipt: string;
  received_at: number;
}


export interface Totals {
  receipts: number;
  cost_micro_usd: string;
  by_provider: Record<string, { receipts: number; cost_micro_usd: string }>;
  by_model: Record<string, { receipts: number; cost_micro_usd: string }>;
  /** Receipts of providers beyond maxTallyKeys (present only when there are some). */
  by_provider_others?: { receipts: number; cost_micro_usd: string };
  /** Receipts of models beyond maxTallyKeys (present only when there are some). */
  by_model_others?: { receipts: number; cost_micro_usd: string };
}

/**
 * Issued tickets are forgotten this long after they expire: a receipt can arrive long after, from a
 * gateway's reconciler (it looks for a receipt at the node for about 28 h: src/gateway/reconcile.ts)
 * or a node that was down. Until session 23 an hour: later receipts were `unknown_ticket`, never paid.
 */
export const TICKET_RETENTION_MS = 30 * 60 * 60_000;

/** The request contract payload characters a provider's record holds. */
function contractChars(p: ProviderRecord | undefined): number {
  return (p?.request_contracts ?? []).reduce((n, e) => n + e.payload.length, 0);
}

/**
 * What the market keeps in memory at most (MarketOptions.limits; docs/market-api.md §Limits).
 * Registering needs only a key of one's own and tickets no credentials, so without bounds anyone
 * could grow the market's memory (and GET /v1/providers) without end.
 */
export interface MarketLimits {
  /** Registered providers (default 1000). A new one beyond it is 503 too_many_providers. */
  maxProviders: number;
  /** Model entries summed over the registered providers (default 10,000): bounds GET /v1/providers. */
  maxProviderModels: number;
  /** Request contract payloads summed over the registered providers, in base64 characters (default 16 MiB): bounds GET /v1/providers. */
  maxContractChars: number;
  /** A provider not seen (registration or accepted heartbeat) for this long is dropped to make room for a new one (default 1 h). */
  staleProviderMs: number;
  /** Tickets issued, not settled and not expired (default 10,000). Beyond it: 503 too_many_tickets. */
  maxOutstandingTickets: number;
  /** Tickets remembered to match receipts, settled and expired ones included (default 100,000; at least maxOutstandingTickets). */
  maxTickets: number;
  /**
   * Keys of the totals' by_provider and by_model, each (default 10,000): a receipt for a provider or
   * a model beyond them is counted in by_provider_others / by_model_others instead (s23 h4: a key
   * registering new model ids and posting its own free receipts grew them, the file and every
   * GET /v1/totals without end).
   */
  maxTallyKeys: number;
  /** Receipt records kept for GET /v1/receipts (default 20,000); the oldest go first. Totals count every receipt. */
  maxReceipts: number;
  /** The same, in bytes of receipt lines (default 64 MiB). */
  maxReceiptBytes: number;
}

export const DEFAULT_MARKET_LIMITS: Readonly<MarketLimits> = Object.freeze({
  maxProviders: 1000,
  maxProviderModels: 10_000,
  maxContractChars: 16 * 1024 * 1024,
  staleProviderMs: 60 * 60_000,
  maxOutstandingTickets: 10_000,
  maxTickets: 100_000,
  maxTallyKeys: 10_000,
  maxReceipts: 20_000,
  maxReceiptBytes: 64 * 1024 * 1024,
});

/** The defaults with `over` applied; throws RangeError naming the limit that is not a positive integer. */
export function marketLimits(over: Partial<MarketLimits> = {}): MarketLimits {
  const limits: MarketLimits = { ...DEFAULT_MARKET_LIMITS };
  for (const [key, value] of Object.entries(over) as [keyof MarketLimits, unknown][]) {
    if (!Object.hasOwn(DEFAULT_MARKET_LIMITS, key)) throw new RangeError(`market: limits.${String(key)} is not a limit (${Object.keys(DEFAULT_MARKET_LIMITS).join(', ')})`);
    if (value === undefined) continue;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) throw new RangeError(`market: limits.${key} must be a positive integer, got ${String(value)}`);
    limits[key] = value;
  }
  if (limits.maxTickets < limits.maxOutstandingTickets) throw new RangeError(`market: limits.maxTickets (${limits.maxTickets}) must be at least limits.maxOutstandingTickets (${limits.maxOutstandingTickets})`);
  return limits;
}

export class MarketStore {
  readonly limits: MarketLimits;
  /** Read freely; change only through putProvider, which keeps the bounds. */
  readonly providers = new Map<string, ProviderRecord>();
  /** Model entries over every registered provider. */
  private providerModels = 0;
  /** Request contract payload characters over every registered provider. */
  private contractChars = 0;
  /** Told when pruning the market's file fails (the ticket was issued; old rows stay until a later prune). */
  onPruneError: ((e: Error) => void) | undefined;
  private readonly tickets = new Map<string, IssuedTicket>();
  /** Tickets not known to be settled or expired, in issue order (expired ones leave lazily). */
  private readonly unsettled = new Set<string>();
  /** Settled tickets still remembered, in settlement order: the first to forget once expired ones are gone. */
  private readonly settledOrder = new Set<string>();
  /** Receipt records by ticket id, in collection order. */
  private readonly receipts = new Map<string, ReceiptRecord>();
  private receiptBytes = 0;
  private readonly byRequest = new Map<string, string[]>();
  private readonly total: Tally = { receipts: 0, cost: 0n };
  private readonly byProvider = new Map<string, Tally>();
  private readonly byModel = new Map<string, Tally>();
  /** Receipts of providers and models beyond limits.maxTallyKeys. */
  private readonly others = new Map<OthersScope, Tally>();
  private lastPrune = 0;
  private readonly db: MarketDb | undefined;

  /** `db`: the market's file, read now (tickets still remembered, the newest receipts, the totals) and written through. */
  constructor(limits: MarketLimits = marketLimits(), db?: MarketDb, now = Date.now()) {
    this.limits = limits;
    this.db = db;
    if (!db) return;
    const state = db.load(now - TICKET_RETENTION_MS, limits.maxReceipts);
    for (const t of state.tickets) {
      this.tickets.set(t.ticket_id, t);
      if (t.settled === undefined && t.expires_at >= now) this.unsettled.add(t.ticket_id);
      if (t.settled !== undefined) this.settledOrder.add(t.ticket_id);
    }
    for (const r of state.receipts) this.remember(r);
    Object.assign(this.total, state.total);
    for (const [k, t] of state.byProvider) this.byProvider.set(k, t);
    for (const [k, t] of state.byModel) this.byModel.set(k, t);
    for (const [k, t] of state.others) this.others.set(k, t);
  }

  /** A write to the market's file; one that fails is 503 (the ticket not issued, the receipt not taken: a retry may succeed). */
  private write(what: string, run: (db: MarketDb) => void): void {
    if (!this.db) return;
    try {
      run(this.db);
    } catch (e) {
      throw new MarketError(503, 'market_storage_failed', `the market could not write ${what} to its file: ${(e as Error).message}`);
    }
  }

  /**
   * Adds a provider or replaces its record. When the new record does not fit the bounds, providers
   * not seen for staleProviderMs are dropped first (a dropped node is told unknown_provider on its
   * next heartbeat and registers again); if it still does not fit, 503 too_many_providers.
   */
  putProvider(record: ProviderRecord, now: number): void {
    const { maxProviders, maxProviderModels, maxContractChars, staleProviderMs } = this.limits;
    const old = this.providers.get(record.provider);
    const models = () => this.providerModels - (old?.models.length ?? 0) + record.models.length;
    const contracts = () => this.contractChars - contractChars(old) + contractChars(record);
    const fits = () => (old !== undefined || this.providers.size < maxProviders) && models() <= maxProviderModels && contracts() <= maxContractChars;
    if (!fits()) {
      for (const p of this.providers.values()) {
        if (p.provider !== record.provider && now - p.last_seen > staleProviderMs) this.dropProvider(p);
      }
    }
    if (!fits()) {
      const why = old === undefined && this.providers.size >= maxProviders
        ? `the market already lists ${this.providers.size} providers, its limit`
        : models() > maxProviderModels
          ? `this registration would bring the registered models to ${models()}, over the market's limit of ${maxProviderModels}`
          : `this registration would bring the request contracts held to ${contracts()} characters, over the market's limit of ${maxContractChars}`;
      throw new MarketError(503, 'too_many_providers', `${why}, and none has been silent for over ${Math.round(staleProviderMs / 60_000)} min to make room: try again later`);
    }
    this.providers.set(record.provider, record);
    this.providerModels = models();
    this.contractChars = contracts();
  }

  private dropProvider(p: ProviderRecord): void {
    this.providers.delete(p.provider);
    this.providerModels -= p.models.length;
    this.contractChars -= contractChars(p);
  }

  /** Tickets issued, not settled, not yet expired. */
  outstandingTickets(now: number): number {
    // Issue order is expiry order (one lifetime for all), so the expired are at the front; settled
    // ones anywhere were removed when their receipt came. (Should the clock step back, a few
    // expired ones may be counted until those before them expire: an over-count, never an under-count.)
    for (const id of this.unsettled) {
      const t = this.tickets.get(id);
      if (t && t.settled === undefined && t.expires_at >= now) break;
      this.unsettled.delete(id);
    }
    return this.unsettled.size;
  }

  /**
   * The buyer's gateway says the ticket never reached its provider (it could not be dialled, or the
   * attempt ended before it was sent): it stops counting as outstanding now rather than at its
   * expiry. A receipt for it is still taken (if the provider did get it after all, its work is
   * paid). Memory only: after a restart it counts again until it expires. Undefined for a ticket
   * this market does not know; false for one settled or expired already.
   */
  release(ticketId: string, now: number): boolean | undefined {
    const t = this.tickets.get(ticketId);
    if (!t) return undefined;
    return this.unsettled.delete(ticketId) && t.settled === undefined && t.expires_at >= now;
  }

  /** Remembers an issued ticket (the caller checked outstandingTickets against the limit first). */
  addTicket(t: IssuedTicket, now: number): void {
    this.write('the ticket', (db) => db.putTicket(t));
    this.tickets.set(t.ticket_id, t);
    this.unsettled.add(t.ticket_id);
    if (now - this.lastPrune > 60_000) {
      this.lastPrune = now;
      // Map iteration is insertion order, so expired tickets come first.
      for (const [id, old] of this.tickets) {
        if (old.expires_at + TICKET_RETENTION_MS >= now) break;
        this.tickets.delete(id);
        this.settledOrder.delete(id);
      }
      // (Best effort: rows left behind are pruned at the next start. A failure is told, at most once a minute.)
      try {
        this.db?.prune(now - TICKET_RETENTION_MS, this.limits.maxReceipts);
      } catch (e) {
        this.onPruneError?.(e as Error);
      }
    }
    this.forgetBeyond(this.limits.maxTickets, now);
  }

  /**
   * Whether one more ticket can be remembered within maxTickets, after forgetting settled and
   * expired ones. Released tickets are neither (a receipt for one is still taken) and count until
   * they expire: issuing and releasing tickets in a loop cannot grow the market past its bound
   * (s29 review: 200 issued and released under maxTickets 3 were all remembered).
   */
  roomForTicket(now: number): boolean {
    this.forgetBeyond(this.limits.maxTickets - 1, now);
    return this.tickets.size < this.limits.maxTickets;
  }

  /**
   * Forgets tickets until at most `keep` are remembered, or none is left to forget: expired ones
   * first (oldest first: issue order is expiry order), then settled ones in the order they settled.
   * Each step forgets one, so the work is what is forgotten, never a walk over tickets kept.
   */
  private forgetBeyond(keep: number, now: number): void {
    const forget = (id: string) => {
      // A receipt for a forgotten ticket is then unknown_ticket, never counted twice.
      this.tickets.delete(id);
      this.settledOrder.delete(id);
      try {
        this.db?.forgetTicket(id);
      } catch {}
    };
    while (this.tickets.size > keep) {
      const [id, oldest] = this.tickets.entries().next().value ?? [];
      if (id === undefined || oldest!.expires_at >= now) break;
      forget(id);
    }
    while (this.tickets.size > keep) {
      const id = this.settledOrder.values().next().value;
      if (id === undefined) break;
      forget(id);
    }
  }

  ticket(id: string): IssuedTicket | undefined {
    return this.tickets.get(id);
  }

  /**
   * Stores a verified receipt (once per ticket, `receiptSha256` the SHA-256 of its line), marks
   * its ticket settled and counts it in the totals. Beyond maxReceipts / maxReceiptBytes the oldest
   * records are dropped from the lists; the totals keep counting them.
   */
  addReceipt(r: ReceiptRecord, receiptSha256: string): void {
    const ticket = this.tickets.get(r.ticket_id);
    const settled = { receipt_sha256: receiptSha256, seq: r.seq };
    const cost = BigInt(r.cost_micro_usd);
    const after = (t: Tally | undefined): Tally => ({ receipts: (t?.receipts ?? 0) + 1, cost: (t?.cost ?? 0n) + cost });
    // A provider or model not tallied yet, with its map full, is counted with the others.
    const row = (scope: 'provider' | 'model', m: Map<string, Tally>, key: string): TallyRow =>
      m.has(key) || m.size < this.limits.maxTallyKeys ? { scope, key, ...after(m.get(key)) } : { scope: `${scope}_others`, key: '', ...after(this.others.get(`${scope}_others`)) };
    const tallies: TallyRow[] = [{ scope: 'total', key: '', ...after(this.total) }, row('provider', this.byProvider, r.provider), row('model', this.byModel, r.model)];
    // The file first: a receipt it did not take is not acknowledged (and nothing here changes).
    this.write('the receipt', (db) => db.addReceipt(r, ticket ? { ...ticket, settled } : undefined, tallies));
    if (ticket) {
      ticket.settled = settled;
      this.settledOrder.add(r.ticket_id);
    }
    this.unsettled.delete(r.ticket_id);
    Object.assign(this.total, { receipts: tallies[0]!.receipts, cost: tallies[0]!.cost });
    for (const t of tallies.slice(1)) {
      const tally = { receipts: t.receipts, cost: t.cost };
      if (t.scope === 'provider') this.byProvider.set(t.key, tally);
      else if (t.scope === 'model') this.byModel.set(t.key, tally);
      else if (t.scope !== 'total') this.others.set(t.scope, tally);
    }
    this.remember(r);
  }

  /** Keeps a receipt record for the lists; beyond the bounds the oldest go (the newest always stays, so a receipt just settled can be read back). */
  private remember(r: ReceiptRecord): void {
    this.receipts.set(r.ticket_id, r);
    this.receiptBytes += r.receipt.length; // canonical JSON with base64 inside: ASCII, a character a byte
    const ids = this.byRequest.get(r.request_id);
    if (ids) ids.push(r.ticket_id);
    else this.byRequest.set(r.request_id, [r.ticket_id]);
    while (this.receipts.size > 1 && (this.receipts.size > this.limits.maxReceipts || this.receiptBytes > this.limits.maxReceiptBytes)) this.evictOldestReceipt();
  }

  /** Closes the market's file. */
  close(): void {
    this.db?.close();
  }

  private evictOldestReceipt(): void {
    const [ticketId, old] = this.receipts.entries().next().value!;
    this.receipts.delete(ticketId);
    this.receiptBytes -= old.receipt.length;
    const ids = this.byRequest.get(old.request_id);
    if (!ids) return;
    const at = ids.indexOf(ticketId);
    if (at >= 0) ids.splice(at, 1);
    if (ids.length === 0) this.byRequest.delete(old.request_id);
  }

  /** The receipts kept, in collection order. */
  allReceipts(): ReceiptRecord[] {
    return [...this.receipts.values()];
  }

  /** The receipts kept for a request id (more than one when a request was hedged), first collected first. */
  receiptsForRequest(requestId: string): ReceiptRecord[] {
    return (this.byRequest.get(requestId) ?? []).map((id) => this.receipts.get(id)!);
  }

  /** Every receipt ever collected, evicted records included: exact BigInt sums. */
  totals(): Totals {
    const out = (m: Map<string, Tally>) => Object.fromEntries([...m].map(([k, t]) => [k, { receipts: t.receipts, cost_micro_usd: t.cost.toString() }]));
    const others = Object.fromEntries([...this.others].map(([scope, t]) => [`by_${scope}`, { receipts: t.receipts, cost_micro_usd: t.cost.toString() }]));
    return { receipts: this.total.receipts, cost_micro_usd: this.total.cost.toString(), by_provider: out(this.byProvider), by_model: out(this.byModel), ...others };
  }
}
