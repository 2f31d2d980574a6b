// The development market's state: in memory only. A restarted market knows no provider, ticket or
// receipt; nodes find out from a 404 on their next heartbeat and register again.
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import type { Rates } from '../../attestation/money.ts';
import type { AttestationTier, ReceiptStatus } from '../../attestation/receipt.ts';
import type { CapacitySnapshot } from '../p2p/capacity-protocol.ts';
import type { RegisteredModel } from './registration-payload.ts';

export interface ProviderRecord {
  provider: string;
  peer_id: string;
  addresses: string[];
  models: RegisteredModel[];
  price_version: string;
  attestation_tier: AttestationTier;
  /** Model id → rates, from the verified price list. */
  rates: Map<string, Rates>;
  price_list: DsseEnvelope;
  /** issued_at of the registration in force (an older one does not replace it). */
  issued_at: number;
  registered_at: number;
  /** Market time of the last registration or accepted heartbeat. */
  last_seen: number;
  /** The latest heartbeat's snapshot, and its own `at`. */
  capacity?: CapacitySnapshot;
  /** Market time of the last ticket issued to this provider (spreads ties). */
  last_ticket_at: number;
}

export interface IssuedTicket {
  ticket_id: string;
  request_id: string;
  provider: string;
  endpoint: string;
  model: string;
  price_version: string;
  /** The model's rates under that price version, from the provider's verified price list. */
  rates: Rates;
  hold: bigint;
  issued_at: number;
  expires_at: number;
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

interface Tally {
  receipts: number;
  cost: bigint;
}

export interface Totals {
  receipts: number;
  cost_micro_usd: string;
  by_provider: Record<string, { receipts: number; cost_micro_usd: string }>;
  by_model: Record<string, { receipts: number; cost_micro_usd: string }>;
}

/** Issued tickets are forgotten this long after they expire (a receipt can arrive after expiry). */
export const TICKET_RETENTION_MS = 60 * 60_000;

export class MarketStore {
  readonly providers = new Map<string, ProviderRecord>();
  private readonly tickets = new Map<string, IssuedTicket>();
  private readonly receipts = new Map<string, ReceiptRecord>();
  private readonly byRequest = new Map<string, string[]>();
  private readonly total: Tally = { receipts: 0, cost: 0n };
  private readonly byProvider = new Map<string, Tally>();
  private readonly byModel = new Map<string, Tally>();
  private lastPrune = 0;

  addTicket(t: IssuedTicket, now: number): void {
    this.tickets.set(t.ticket_id, t);
    if (now - this.lastPrune > 60_000) {
      this.lastPrune = now;
      // Map iteration is insertion order, so expired tickets come first.
      for (const [id, old] of this.tickets) {
        if (old.expires_at + TICKET_RETENTION_MS >= now) break;
        this.tickets.delete(id);
      }
    }
  }

  ticket(id: string): IssuedTicket | undefined {
    return this.tickets.get(id);
  }

  receiptForTicket(ticketId: string): ReceiptRecord | undefined {
    return this.receipts.get(ticketId);
  }

  /** Stores a verified receipt (once per ticket) and counts it in the totals. */
  addReceipt(r: ReceiptRecord): void {
    this.receipts.set(r.ticket_id, r);
    const ids = this.byRequest.get(r.request_id);
    if (ids) ids.push(r.ticket_id);
    else this.byRequest.set(r.request_id, [r.ticket_id]);
    const cost = BigInt(r.cost_micro_usd);
    const bump = (m: Map<string, Tally> | undefined, key: string) => {
      const t = m ? (m.get(key) ?? m.set(key, { receipts: 0, cost: 0n }).get(key)!) : this.total;
      t.receipts++;
      t.cost += cost;
    };
    bump(undefined, '');
    bump(this.byProvider, r.provider);
    bump(this.byModel, r.model);
  }

  /** Every collected receipt, in collection order. */
  allReceipts(): ReceiptRecord[] {
    return [...this.receipts.values()];
  }

  /** The receipts for a request id (more than one when a request was hedged), first collected first. */
  receiptsForRequest(requestId: string): ReceiptRecord[] {
    return (this.byRequest.get(requestId) ?? []).map((id) => this.receipts.get(id)!);
  }

  totals(): Totals {
    const out = (m: Map<string, Tally>) => Object.fromEntries([...m].map(([k, t]) => [k, { receipts: t.receipts, cost_micro_usd: t.cost.toString() }]));
    return { receipts: this.total.receipts, cost_micro_usd: this.total.cost.toString(), by_provider: out(this.byProvider), by_model: out(this.byModel) };
  }
}
