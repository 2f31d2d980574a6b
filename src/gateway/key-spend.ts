// API keys' spend limits (marketplace-api.md, Authentication: "optional USD budget per interval
// daily, weekly or monthly, or lifetime when the interval is omitted. Settled charges plus active
// holds count. When reached, requests fail with 403 key_spend_limit_exceeded until the window
// resets"). What a key has used in its window is:
//   - the receipts the marketplace settled in that window (each request id charged once: an
//     idempotent retry answered with the first request's receipt is not charged again);
//   - plus the holds of its requests still open: a request that runs holds what its buyer allowed
//     (its reservation, below), and once its handler ends, each attempt's ticket hold until its
//     receipt settles or the gateway gives it up (a receipt the market has not yet taken holds its
//     own cost instead).
// A paid request reserves, before any ticket, at most what is left of the budget: that is its cost
// cap (with the key's cap and X-Service-Max-Cost-Usd), so a request whose worst case the budget
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
CREATE TABLE IF NOT EXISTS key_requests (request_id TEXT PRIMARY KEY, key_id TEXT NOT NULL, interval TEXT NOT NULL, hold TEXT NOT NULL, state TEXT NOT NULL, at INTEGER NOT NULL) WITHOUT ROWID;
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
  private readonly put: { spend: Database.Statement<[string, string, string]>; row: Database.Statement<[string, string, string, string, string, number]>; prune: Database.Statement<[number]> } | undefined;
  private writes = 0;

  constructor(opts: { db?: Database.Database; now?: () => number; onError?: (e: Error) => void } = {}) {
    this.now = opts.now ?? Date.now;
    this.onError = opts.onError ?? (() => {});
    const db = opts.db;
    if (!db) return;
    db.exec(SCHEMA);
    for (const r of db.prepare<[], { key_id: string; win: string; micro_usd: string }>('SELECT key_id, win, micro_usd FROM key_spend').all()) this.spent.set(`${r.key_id} ${r.win}`, BigInt(r.micro_usd));
    db.prepare('DELETE FROM key_requests WHERE state != ? AND at < ?').run('held', this.now() - ROW_KEPT_MS);
    for (const r of db.prepare<[], { request_id: string; key_id: string; interval: SpendInterval; hold: string; state: Row['state']; at: number }>('SELECT request_id, key_id, interval, hold, state, at FROM key_requests').all()) {
      this.rows.set(r.request_id, { requestId: r.request_id, keyId: r.key_id, interval: r.interval, hold: BigInt(r.hold), state: r.state, at: r.at, res: undefined });
      if (r.state === 'held') this.add(this.held, r.key_id, BigInt(r.hold));
    }
    this.put = {
      spend: db.prepare('INSERT OR REPLACE INTO key_spend (key_id, win, micro_usd) VALUES (?, ?, ?)'),
      row: db.prepare('INSERT OR REPLACE INTO key_requests (request_id, key_id, interval, hold, state, at) VALUES (?, ?, ?, ?, ?, ?)'),
      prune: db.prepare(`DELETE FROM key_requests WHERE state != 'held' AND at < ?`),
    };
  }

  /** Settled charges in the current window plus open holds and reservations. */
  used(key: SpendLimit): bigint {
    return (this.spent.get(`${key.id} ${spendWindow(key.interval, this.now()).id}`) ?? 0n) + (this.held.get(key.id) ?? 0n) + (this.reserved.get(key.id) ?? 0n);
  }

  /**
   * Reserves what is left of `key`'s budget, or less when `cap` (micro-USD) is lower. 403
   * key_spend_limit_exceeded when nothing is left.
   */
  reserve(key: SpendLimit, cap: bigint | undefined): SpendReservation {
    const used = this.used(key);
    const left = key.limitMicroUsd - used;
    if (left <= 0n) throw spendRefusal(key, used, this.now());
    const amount = cap !== undefined && cap < left ? cap : left;
    const res: Reservation = { keyId: key.id, amount, charged: 0n, live: true, rows: [] };
    this.add(this.reserved, key.id, amount);
    return {
      amount,
      budgetBound: amount === left && (cap === undefined || cap > left),
      hold: (requestId, hold) => {
        const row: Row = { requestId, keyId: key.id, interval: key.interval, hold, state: 'held', at: this.now(), res: res.live ? res : undefined };
        this.rows.set(requestId, row);
        if (row.res) res.rows.push(row);
        else this.add(this.held, key.id, hold);
        this.save(row);
      },
      end: () => {
        if (!res.live) return;
        res.live = false;
        this.add(this.reserved, key.id, -this.counted(res));
        for (const row of res.rows) {
          row.res = undefined;
          if (row.state === 'held') this.add(this.held, key.id, row.hold);
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
    this.guard(() => this.put?.row.run(row.requestId, row.keyId, row.interval, row.hold.toString(), row.state, row.at));
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

function spendRefusal(key: SpendLimit, used: bigint, now: number): GatewayError {
  const w = spendWindow(key.interval, now);
  const what = key.interval === 'lifetime' ? 'lifetime' : key.interval;
  const resets = w.endsAt === undefined ? 'it does not reset' : `it resets at ${new Date(w.endsAt).toISOString()}`;
  return new GatewayError(403, 'key_spend_limit_exceeded', `this API key has used ${formatUsd(used)} of its ${what} spend limit of ${formatUsd(key.limitMicroUsd)} USD (settled charges and open holds); ${resets}`);
}

/** The refusal for a request the budget left could not pay for (the node's request_cost_limit_exceeded, when the budget was the cap). */
export function budgetTooSmall(key: SpendLimit, reserved: bigint): GatewayError {
  return new GatewayError(403, 'key_spend_limit_exceeded', `this API key's spend limit leaves ${formatUsd(reserved)} USD, less than this request's worst case`);
}
