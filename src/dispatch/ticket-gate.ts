// The ticket gate: a request is served only with a ticket that a configured marketplace key
// signed, for this provider, still valid, never used before (remembered on disk across restarts),
// for exactly the body received, and for the endpoint, model and price version this node sells.
// Anything else is refused before any work, with a code, and nothing is charged.
import type Database from 'better-sqlite3';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import type { TicketPayload } from '../../attestation/ticket.ts';
import { decodeMarketplaceKeys, verifyTicket, type MarketplaceKey } from '../../attestation/ticket-verify.ts';

export type TicketRefusalCode =
  | 'ticket_invalid'
  | 'ticket_expired'
  | 'ticket_not_yet_valid'
  | 'ticket_wrong_provider'
  | 'ticket_body_mismatch'
  | 'ticket_endpoint_mismatch'
  | 'ticket_model_mismatch'
  | 'ticket_price_version_mismatch'
  | 'ticket_replayed';

export interface TicketRefusal {
  ok: false;
  status: 400 | 401 | 409;
  code: TicketRefusalCode;
  message: string;
}

export interface TicketExpectation {
  endpoint: string;
  model: string;
  priceVersion: string;
  /** The exact request body bytes received. */
  body: Uint8Array;
}

const SCHEMA = `CREATE TABLE IF NOT EXISTS used_tickets (ticket_id TEXT PRIMARY KEY, request_id TEXT NOT NULL, used_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID`;

export class TicketGate {
  private readonly keys: readonly MarketplaceKey[];
  private readonly providerId: string;
  private readonly skewMs: number;
  private readonly now: () => number;
  private readonly insert: Database.Statement<[string, string, number, number]>;
  private readonly pruneStmt: Database.Statement<[number]>;

  constructor(opts: { db: Database.Database; marketplaceKeys: readonly MarketplaceKey[]; providerId: string; skewMs?: number; now?: () => number }) {
    // Decoded once here, not on every ticket (keys that are not keys stay as given: verifyTicket refuses every ticket).
    this.keys = decodeMarketplaceKeys(opts.marketplaceKeys) ?? opts.marketplaceKeys;
    this.providerId = opts.providerId;
    this.skewMs = opts.skewMs ?? 30_000;
    this.now = opts.now ?? Date.now;
    opts.db.exec(SCHEMA);
    this.insert = opts.db.prepare('INSERT OR IGNORE INTO used_tickets (ticket_id, request_id, used_at, expires_at) VALUES (?, ?, ?, ?)');
    this.pruneStmt = opts.db.prepare('DELETE FROM used_tickets WHERE expires_at < ?');
  }

  /** Checks the ticket and, if it passes, marks it used (durably) in the same step. */
  admit(envelope: DsseEnvelope | string, expect: TicketExpectation, vouched?: TicketPayload): { ok: true; ticket: TicketPayload } | TicketRefusal {
    const checked = this.check(envelope, expect, vouched);
    return checked.ok ? this.use(checked.ticket) : checked;
  }

  /** Marks a ticket that passed check() as used; refused if it was used before. */
  use(t: TicketPayload): { ok: true; ticket: TicketPayload } | TicketRefusal {
    // The primary key makes "mark used" atomic and durable: a second use finds the row.
    if (this.insert.run(t.ticket_id, t.request_id, this.now(), t.expires_at).changes === 0) {
      return refuse(409, 'ticket_replayed', `ticket ${t.ticket_id} was used before`);
    }
    return { ok: true, ticket: t };
  }

  /** Every check of admit() but the use: for answering an idempotent retry from the record. */
  check(envelope: DsseEnvelope | string, expect: TicketExpectation, vouched?: TicketPayload): { ok: true; ticket: TicketPayload } | TicketRefusal {
    // `vouched`: what vouch() already returned for this envelope and these body bytes (not verified twice).
    const v = vouched ? ({ ok: true, ticket: vouched } as const) : this.vouch(envelope, expect.body);
    if (!v.ok) return v;
    const t = v.ticket;
    if (t.endpoint !== expect.endpoint) return refuse(400, 'ticket_endpoint_mismatch', `ticket is for ${t.endpoint}, the request is ${expect.endpoint}`);
    if (t.model !== expect.model) return refuse(400, 'ticket_model_mismatch', `ticket is for model ${t.model}, the request asks for ${expect.model}`);
    if (t.price_version !== expect.priceVersion) {
      return refuse(409, 'ticket_price_version_mismatch', `ticket holds price version ${t.price_version}; this node sells at ${expect.priceVersion}`);
    }
    return { ok: true, ticket: t };
  }

  /**
   * The checks that need no parsed body: a trusted marketplace signed it, for this provider, it is
   * valid now, and it is for exactly these body bytes (a hash, cheap whatever the body holds).
   */
  vouch(envelope: DsseEnvelope | string, body: Uint8Array): { ok: true; ticket: TicketPayload } | TicketRefusal {
    if (this.keys.length === 0) return refuse(401, 'ticket_invalid', 'this node trusts no marketplace key (marketplace.public_keys is empty)');
    const now = this.now();
    const v = verifyTicket(envelope, { marketplaceKeys: this.keys, provider: this.providerId, now, skewMs: this.skewMs, body });
    if (!v.ok) {
      const e = v.error;
      switch (e.code) {
        case 'ticket_expired':
        case 'ticket_not_yet_valid':
        case 'ticket_wrong_provider':
          return refuse(401, e.code, e.message);
        case 'ticket_body_mismatch':
          return refuse(400, 'ticket_body_mismatch', e.message);
        default:
          return refuse(401, 'ticket_invalid', `${e.code}: ${e.message}`);
      }
    }
    return { ok: true, ticket: v.value.payload };
  }

  /** Forgets tickets that could no longer pass the expiry check anyway. */
  prune(): number {
    return this.pruneStmt.run(this.now() - this.skewMs - 1).changes;
  }
}

function refuse(status: TicketRefusal['status'], code: TicketRefusalCode, message: string): TicketRefusal {
  return { ok: false, status, code, message };
}
