// The ticket gate: a request is served only with a ticket that a configured marketplace key
// signed, for this provider, still valid, never used before (remembered on disk across restarts),
// for exactly the body received, and for the endpoint, model and price version this node sells.
// Anything else is refused before any work, with a code, and nothing is charged.
import type Database from 'better-sqlite3';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import type { TicketPayload } from '../../attestation/ticket.ts';
import { decodeMarketplaceKeys, verifyTicket, type MarketplaceKey } from '../../attestation/ticket-verify.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { ed25519VerifyFast, ed25519VerifyNoble } from '../../attestation/ed25519.ts';

export type TicketRefusalCode =
  | 'ticket_invalid'
  | 'ticket_expired'
  | 'ticket_not_yet_valid'
  | 'ticket_wrong_provider'
  | 'ticket_body_mismatch'
  | 'ticket_endpoint_mismatch'
  | 'ticket_model_mismatch'
  | 'ticket_price_version_mismatch'
  | 'ticket_replayed'
  | 'ticket_check_busy';

export interface TicketRefusal {
  ok: false;
  status: 400 | 401 | 409 | 503;
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

/**
 * Signature checks one ticket may cost (or one per trusted key, if more): a marketplace signs a
 * ticket once (twice while it rotates keys), naming its key. A forged envelope carries up to 16
 * signatures, each without a key id tried under every trusted key.
 */
export const TICKET_SIGNATURE_CHECKS = 4;

/**
 * The costly re-check of a signature OpenSSL refused (ed25519VerifyFast: about 1 ms of JavaScript
 * each) at most this many times a second, in bursts of as many: forged tickets, which always need
 * it, cannot take the CPU from paid work; the marketplace's own tickets never need it.
 */
export const DEFAULT_RECHECKS_PER_SECOND = 20;

const SCHEMA = `CREATE TABLE IF NOT EXISTS used_tickets (ticket_id TEXT PRIMARY KEY, request_id TEXT NOT NULL, used_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID`;

export class TicketGate {
  private readonly keys: readonly MarketplaceKey[];
  private readonly providerId: string;
  private readonly skewMs: number;
  private readonly now: () => number;
  private readonly insert: Database.Statement<[string, string, number, number]>;
  private readonly pruneStmt: Database.Statement<[number]>;

  private readonly rechecks: RecheckBudget;
  /** The current vouch()'s signature checks, and whether one went unanswered (its re-check not made). */
  private checks = 0;
  /** TICKET_SIGNATURE_CHECKS, or one per trusted key if there are more (a keyless signature is tried under each). */
  private readonly maxChecks: number;
  private unchecked: 'none' | 'too_many' | 'busy' = 'none';

  constructor(opts: {
    db: Database.Database;
    marketplaceKeys: readonly MarketplaceKey[];
    providerId: string;
    skewMs?: number;
    now?: () => number;
    /** The noble re-checks a second (default DEFAULT_RECHECKS_PER_SECOND). */
    rechecksPerSecond?: number;
  }) {
    this.rechecks = new RecheckBudget(opts.rechecksPerSecond ?? DEFAULT_RECHECKS_PER_SECOND, () => performance.now());
    // Decoded once here, not on every ticket (keys that are not keys stay as given: verifyTicket refuses every ticket).
    const decoded = decodeMarketplaceKeys(opts.marketplaceKeys);
    this.maxChecks = Math.max(TICKET_SIGNATURE_CHECKS, opts.marketplaceKeys.length);
    this.keys = decoded ? decoded.map((k) => ({ ...k, verify: (sig: Uint8Array, msg: Uint8Array, pk: Uint8Array) => this.verify(sig, msg, pk) })) : opts.marketplaceKeys;
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
   * Without a body (a request's HEAD, before its body arrives), all but the last; matchBody() does
   * that once the body is whole.
   */
  vouch(envelope: DsseEnvelope | string, body: Uint8Array | undefined): { ok: true; ticket: TicketPayload } | TicketRefusal {
    if (this.keys.length === 0) return refuse(401, 'ticket_invalid', 'this node trusts no marketplace key (marketplace.public_keys is empty)');
    const now = this.now();
    this.checks = 0;
    this.unchecked = 'none';
    const v = verifyTicket(envelope, { marketplaceKeys: this.keys, provider: this.providerId, now, skewMs: this.skewMs, ...(body ? { body } : {}) });
    if (!v.ok) {
      const e = v.error;
      const unchecked = this.unchecked as 'none' | 'too_many' | 'busy'; // (set by verify(), called in there)
      // A "no" that rests on a check not made says so (it may be only that: see verify()).
      if (unchecked === 'busy' && (e.code === 'signature_invalid' || e.code === 'unknown_key')) {
        return refuse(503, 'ticket_check_busy', 'the ticket signature does not pass the fast check, and the node makes no more of the slow re-check now (forged tickets need it, a marketplace\'s never do); retry shortly');
      }
      if (unchecked === 'too_many' && (e.code === 'signature_invalid' || e.code === 'unknown_key')) {
        return refuse(401, 'ticket_invalid', `${e.code}: no signature verifies under a marketplace key in the first ${this.maxChecks} checks (the most a ticket is given) under a marketplace key`);
      }
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

  /** vouch()'s last check, for a ticket it vouched for without the body. */
  matchBody(ticket: TicketPayload, body: Uint8Array): { ok: true; ticket: TicketPayload } | TicketRefusal {
    // (the body took a while to arrive: the window is checked again, as vouch() would now)
    const now = this.now();
    if (now - this.skewMs >= ticket.expires_at) return refuse(401, 'ticket_expired', `ticket expired at ${ticket.expires_at}, now is ${now}`);
    if (sha256Hex(body) !== ticket.body_sha256) return refuse(400, 'ticket_body_mismatch', 'the request body is not the one the ticket was issued for');
    return { ok: true, ticket };
  }

  /**
   * ed25519Verify's answer, at a bounded cost: at most TICKET_SIGNATURE_CHECKS checks a ticket,
   * and the slow re-check only while the budget allows. A check not made answers no, and vouch()
   * says why: never a yes that ed25519Verify would not give.
   */
  private verify(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean {
    if (++this.checks > this.maxChecks) {
      this.unchecked = 'too_many';
      return false;
    }
    const fast = ed25519VerifyFast(signature, message, publicKey);
    if (fast !== undefined) return fast;
    if (!this.rechecks.take()) {
      this.unchecked = 'busy';
      return false;
    }
    return ed25519VerifyNoble(signature, message, publicKey);
  }

  /** Forgets tickets that could no longer pass the expiry check anyway. */
  prune(): number {
    return this.pruneStmt.run(this.now() - this.skewMs - 1).changes;
  }
}

function refuse(status: TicketRefusal['status'], code: TicketRefusalCode, message: string): TicketRefusal {
  return { ok: false, status, code, message };
}

/** A token bucket: `perSecond` tokens a second, holding at most as many. */
class RecheckBudget {
  private tokens: number;
  private last: number;
  private readonly perSecond: number;
  private readonly clock: () => number;
  constructor(perSecond: number, clock: () => number) {
    this.perSecond = perSecond;
    this.clock = clock;
    this.tokens = perSecond;
    this.last = clock();
  }
  take(): boolean {
    const now = this.clock();
    this.tokens = Math.min(this.perSecond, this.tokens + ((now - this.last) * this.perSecond) / 1000);
    this.last = now;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}
