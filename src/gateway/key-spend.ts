// API keys' spend limits (marketplace-api.md, Authentication: "optional USD budget per interval
// daily, weekly or monthly, or lifetime when the interval is omitted. Settled charges plus active
// holds count. When reached, requests fail with 403 key_spend_limit_exceeded until the window
// resets"). What a key has used in its window is:
//   - the receipts the marketplace settled in that window (each request id charged once: an
//     idempotent retry answered with the first request's receipt is not charged again);
//   - plus the holds of its requests still open: a request that runs holds what its buyer allowed
//     (its reservation, below), and once its handler ends, each attempt's ticket hold until its
//     receipt settles or the gateway gives it up, but no longer than LINGER_MS (10 min) after: a
//     provider that broke off and cannot be reached would otherwise keep the whole budget held for
//     the ~28 h the gateway goes on looking for its receipt, across window resets (its ticket
//     expired within a minute; a receipt found later is still charged, in the window it settles
//     in). A verified receipt the market has not yet taken holds its own cost until it is settled
//     or given up.
// A paid request reserves, before any ticket, at most what is left of the budget: that is its cost
// cap (with the key's cap and X-Service-Max-Cost-Usd, or without either what it can cost at any
// listed provider: paid-routes.ts uncappedWorstCase), so a request whose worst case the budget
// cannot pay for is refused by the node before anything is spent, and two requests at once never
// both spend the same remainder. Money is BigInt micro-USD throughout.
//
// Windows are UTC calendar periods: a day, an ISO week (from Monday 00:00), a month. With a records
// file the spend and open holds are kept in it, so a restart neither forgets the day's charges nor
// the requests still to settle; without one they last as long as the process.
import type Database from 'better-sqlite3';
import { formatUsd } from '../../attestation/money.ts';
import { GatewayError } from './errors.ts';

export const SPEND_INTERVALS = ['daily', 'weekly', 'monthly'] as const;
export type SpendInterval = (typeof SPEND_INTERVALS)[number] | 'lifetime';

const DAY_MS = 86_400_000;
/** How long a settled or released request's row is kept (to charge a late receipt once): past the reconciler's ~28 h. */
const ROW_KEPT_MS = 8 * DAY_MS;
/** How long an attempt's ticket hold counts after its request's handler ended, without a receipt. */
export const LINGER_MS = 10 * 60_000;

/** The window `at` (ms) falls in: its id, and when the next one starts (undefined: lifetime). */
export function spendWindow(interval: SpendInterval, at: number): { id: string; endsAt: number | undefined } {
  const d = new Date(at);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const day = Date.UTC(y, m, d.getUTCDate());
  switch (interval) {
    case 'daily':
      return { id: `d:${new Date(day).toISOString().slice(0, 10)}`, endsAt: day + DAY_MS };
    case 'weekly': {
      const monday = day - ((d.getUTCDay() + 6) % 7) * DAY_MS;
      return { id: `w:${new Date(monday).toISOString().slice(0, 10)}`, endsAt: monday + 7 * DAY_MS };
    }
    case 'monthly':
      return { id: `m:${new Date(Date.UTC(y, m, 1)).toISOString().slice(0, 7)}`, endsAt: Date.UTC(y, m + 1, 1) };
    case 'lifetime':
      return { id: 'lifetime', endsAt: undefined };
  }
}

/** A key's budget, as its policy has it. */
export interface SpendLimit {
  /** A stable id of the key (never the key itself). */
  readonly id: string;
  readonly label: string;
  readonly limitMicroUsd: bigint;
  readonly interval: SpendInterval;
}

interface Reservation {
  readonly keyId: string;
  readonly amount: bigint;
  /** Charged to the key under it so far (its share of what it counts goes down as much). */
  charged: bigint;
  live: boolean;
  readonly rows: Row[];
}

interface Row {
  readonly requestId: string;
  readonly keyId: string;
  /** The key's window kind: a charge is booked in the window of its settlement. */
  readonly interval: SpendInterval;
  /** What it holds while open: its ticket's hold, or its receipt's cost once the receipt exists. */
  hold: bigint;
  state: 'held' | 'charged' | 'released';
  at: number;
  /** Held without a receipt, outside a reservation: counted until then (wall ms). */
  until: number | undefined;
  /** Its hold is a verified receipt's cost (the market has not taken it yet): no `until`. */
  receipt: boolean;
  /** The reservation it runs under, while that counts for it. */
  res: Reservation | undefined;
}

/** A paid request's reservation: its cost cap, and end() once its handler is done. */
export interface SpendReservation {
  readonly amount: bigint;
  /** Whether the budget left (not a cap the buyer or the key set) is what bounds the request. */
  readonly budgetBound: boolean;
  /** An attempt's ticket: its hold counts under the reservation while it lasts, then on its own. */
  hold(requestId: string, hold: bigint): void;
  end(): void;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS key_spend (key_id TEXT NOT NULL, win TEXT NOT NULL, micro_usd TEXT NOT NULL, PRIMARY KEY (key_id, win)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS key_requests (request_id TEXT PRIMARY KEY, key_id TEXT NOT NULL, interval TEXT NOT NULL, hold TEXT NOT NULL, state TEXT NOT NULL, at INTEGER NOT NULL, until INTEGER, receipt INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
`;

export class KeySpend {
  private readonly now: () => number;
  private readonly onError: (e: Error) => void;
  /** `${keyId} ${window id}` → micro-USD settled in that window. */
  private readonly spent = new Map<string, bigint>();
  private readonly rows = new Map<string, Row>();
  /** Per key: the holds of open rows not under a live reservation. */
  private readonly held = new Map<string, bigint>();
  /** Per key: what its live reservations count (amount − charged under them, at least 0). */
  private readonly reserved = new Map<string, bigint>();
  /** Held rows with an `until`, in its order: released as their time comes. */
  private lingering: Row[] = [];
  private readonly put: { spend: Database.Statement<[string, string, string]>; row: Database.Statement<[string, string, string, string, string, number, number | null, number]>; prune: Database.Statement<[number]> } | undefined;
  private writes = 0;

  constructor(opts: { db?: Database.Database; now?: () => number; onError?: (e: Error) => void } = {}) {
    this.now = opts.now ?? Date.now;
    this.onError = opts.onError ?? (() => {});
    const db = opts.db;
    if (!db) return;
    db.exec(SCHEMA);
    for (const r of db.prepare<[], { key_id: string; win: string; micro_usd: string }>('SELECT key_id, win, micro_usd FROM key_spend').all()) this.spent.set(`${r.key_id} ${r.win}`, BigInt(r.micro_usd));
    db.prepare('DELETE FROM key_requests WHERE state != ? AND at < ?').run('held', this.now() - ROW_KEPT_MS);
    for (const r of db.prepare<[], { request_id: string; key_id: string; interval: SpendInterval; hold: string; state: Row['state']; at: number; until: number | null; receipt: number }>('SELECT request_id, key_id, interval, hold, state, at, until, receipt FROM key_requests ORDER BY until').all()) {
      const row: Row = { requestId: r.request_id, keyId: r.key_id, interval: r.interval, hold: BigInt(r.hold), state: r.state, at: r.at, until: r.until ?? undefined, receipt: r.receipt === 1, res: undefined };
      this.rows.set(r.request_id, row);
      if (row.state !== 'held') continue;
      this.add(this.held, r.key_id, row.hold);
      // (A hold from a run that stopped while its request ran lingers from now.)
      if (!row.receipt) {
        row.until ??= this.now() + LINGER_MS;
        this.lingering.push(row);
      }
    }
    this.lingering.sort((a, b) => a.until! - b.until!);
    this.put = {
      spend: db.prepare('INSERT OR REPLACE INTO key_spend (key_id, win, micro_usd) VALUES (?, ?, ?)'),
      row: db.prepare('INSERT OR REPLACE INTO key_requests (request_id, key_id, interval, hold, state, at, until, receipt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)'),
      prune: db.prepare(`DELETE FROM key_requests WHERE state != 'held' AND at < ?`),
    };
  }

  /** Settled charges in the current window plus open holds and reservations. */
  used(key: SpendLimit): bigint {
    const u = this.usage(key);
    return u.spent + u.open;
  }

  /** What `key` has spent in the current window, and what its open holds and reservations hold. */
  private usage(key: SpendLimit): { spent: bigint; open: bigint } {
    this.releaseLingering();
    return { spent: this.spent.get(`${key.id} ${spendWindow(key.interval, this.now()).id}`) ?? 0n, open: (this.held.get(key.id) ?? 0n) + (this.reserved.get(key.id) ?? 0n) };
  }

  /** Holds whose LINGER_MS are over, without a receipt: released (a receipt found later is still charged). */
  private releaseLingering(): void {
    const now = this.now();
    let n = 0;
    for (const row of this.lingering) {
      if (row.until! > now) break;
      n++;
      // (one charged, given up or under a receipt meanwhile has left `held` already)
      if (row.state === 'held' && !row.receipt && !row.res && row.until !== undefined && row.until <= now) {
        this.add(this.held, row.keyId, -row.hold);
        row.state = 'released';
        row.at = now;
        this.save(row);
      }
    }
    if (n > 0) this.lingering = this.lingering.slice(n);
  }

  /** A held row now outside any reservation, without a receipt: it counts for LINGER_MS more. */
  private linger(row: Row): void {
    row.until = this.now() + LINGER_MS;
    this.lingering.push(row);
  }

  /** 403 key_spend_limit_exceeded when what is left of `key`'s budget cannot pay a worst case of `worst` (an estimate's judgement: nothing reserved). */
  assertRoomFor(key: SpendLimit, worst: bigint): void {
    const left = this.room(key);
    if (worst > left) throw budgetTooSmall(key, left);
  }

  /** What is left of `key`'s budget; 403 key_spend_limit_exceeded when nothing is, unless `orNone` (then 0). */
  private room(key: SpendLimit, orNone = false): bigint {
    const u = this.usage(key);
    const left = key.limitMicroUsd - u.spent - u.open;
    if (left > 0n) return left;
    if (orNone) return 0n;
    throw spendRefusal(key, u, this.now());
  }

  /**
   * Reserves what is left of `key`'s budget, or less when `cap` (micro-USD) is lower. 403
   * key_spend_limit_exceeded when nothing is left, except for a `retry` (an Idempotency-Key
   * already answered: the node answers it from its record, free), which then reserves 0.
   */
  reserve(key: SpendLimit, cap: bigint | undefined, opts: { retry?: boolean } = {}): SpendReservation {
    const left = this.room(key, opts.retry);
    const amount = cap !== undefined && cap < left ? cap : left;
    const res: Reservation = { keyId: key.id, amount, charged: 0n, live: true, rows: [] };
    this.add(this.reserved, key.id, amount);
    return {
      amount,
      budgetBound: amount === left && (cap === undefined || cap > left),
      hold: (requestId, hold) => {
        const row: Row = { requestId, keyId: key.id, interval: key.interval, hold, state: 'held', at: this.now(), until: undefined, receipt: false, res: res.live ? res : undefined };
        this.rows.set(requestId, row);
        if (row.res) res.rows.push(row);
        else {
          this.add(this.held, key.id, hold);
          this.linger(row);
        }
        this.save(row);
      },
      end: () => {
        if (!res.live) return;
        res.live = false;
        this.add(this.reserved, key.id, -this.counted(res));
        for (const row of res.rows) {
          row.res = undefined;
          if (row.state !== 'held') continue;
          this.add(this.held, key.id, row.hold);
          if (!row.receipt) this.linger(row);
          this.save(row);
        }
      },
    };
  }

  /** A receipt for `requestId` was verified: charged when the market took it, else it holds its cost. */
  settled(requestId: string, cost: bigint, ok: boolean): void {
    const row = this.rows.get(requestId);
    if (!row || row.state === 'charged') return; // (not a limited key's, or charged already)
    if (!ok) {
      // The market has not taken it (yet): it may still be charged, for its own cost.
      if (!row.res) this.add(this.held, row.keyId, cost - (row.state === 'held' ? row.hold : 0n));
      row.hold = cost;
      row.state = 'held';
      row.receipt = true;
      row.until = undefined;
      this.save(row);
      return;
    }
    if (row.state === 'held') {
      if (row.res) {
        const before = this.counted(row.res);
        row.res.charged += cost;
        this.add(this.reserved, row.keyId, this.counted(row.res) - before);
      } else this.add(this.held, row.keyId, -row.hold);
    }
    row.state = 'charged';
    row.at = this.now();
    const win = spendWindow(row.interval, row.at).id;
    const total = (this.spent.get(`${row.keyId} ${win}`) ?? 0n) + cost;
    this.spent.set(`${row.keyId} ${win}`, total);
    this.guard(() => this.put?.spend.run(row.keyId, win, total.toString()));
    this.save(row);
  }

  /** Nothing more will be settled for `requestId` (the gateway gave it up): its hold goes. */
  dropped(requestId: string): void {
    const row = this.rows.get(requestId);
    if (!row || row.state !== 'held') return;
    if (!row.res) this.add(this.held, row.keyId, -row.hold);
    row.state = 'released';
    row.at = this.now();
    this.save(row);
  }

  private counted(res: Reservation): bigint {
    const c = res.amount - res.charged;
    return c > 0n ? c : 0n;
  }

  private add(m: Map<string, bigint>, keyId: string, delta: bigint): void {
    m.set(keyId, (m.get(keyId) ?? 0n) + delta);
  }

  private save(row: Row): void {
    this.guard(() => this.put?.row.run(row.requestId, row.keyId, row.interval, row.hold.toString(), row.state, row.at, row.until ?? null, row.receipt ? 1 : 0));
    if (++this.writes % 1000 === 0) {
      const edge = this.now() - ROW_KEPT_MS;
      for (const [id, r] of this.rows) if (r.state !== 'held' && r.at < edge) this.rows.delete(id);
      this.guard(() => this.put?.prune.run(edge));
    }
  }

  private guard(run: () => unknown): void {
    try {
      run();
    } catch (e) {
      this.onError(e as Error); // (the spend stays right in memory for this run)
    }
  }
}

function spendRefusal(key: SpendLimit, u: { spent: bigint; open: bigint }, now: number): GatewayError {
  const w = spendWindow(key.interval, now);
  const what = key.interval === 'lifetime' ? 'lifetime' : key.interval;
  const resets = w.endsAt === undefined ? 'it does not reset' : `the charges reset at ${new Date(w.endsAt).toISOString()}`;
  const open = u.open > 0n ? `, ${formatUsd(u.open)} held by requests still open (for at most ${LINGER_MS / 60_000} min after each ends without a receipt)` : '';
  return new GatewayError(403, 'key_spend_limit_exceeded', `this API key has used ${formatUsd(u.spent + u.open)} of its ${what} spend limit of ${formatUsd(key.limitMicroUsd)} USD (${formatUsd(u.spent)} charged${open}); ${resets}`);
}

/** The refusal for a request the budget left could not pay for (the node's request_cost_limit_exceeded, when the budget was the cap). */
export function budgetTooSmall(key: SpendLimit, reserved: bigint): GatewayError {
  return new GatewayError(403, 'key_spend_limit_exceeded', `this API key's spend limit leaves ${formatUsd(reserved)} USD, less than this request's worst case`);
}
