// API keys' spend limits (key-spend.ts): UTC calendar windows, settled charges plus open holds,
// reservations that keep two requests at once from spending one remainder, each receipt charged
// once, and the spend kept in the records file across a restart.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, test } from 'vitest';
import { GatewayError } from '../src/gateway/errors.ts';
import { KeySpend, LINGER_MS, spendWindow, type SpendLimit } from '../src/gateway/key-spend.ts';

const at = (iso: string): number => Date.parse(iso);

function refusal(run: () => unknown): { status: number; code: string; message: string } {
  try {
    run();
  } catch (e) {
    if (e instanceof GatewayError) return { status: e.status, code: e.code, message: e.message };
    throw e;
  }
  throw new Error('accepted');
}

describe('spend windows (UTC calendar)', () => {
  test('a day, an ISO week from Monday, a month; lifetime never ends', () => {
    expect(spendWindow('daily', at('2026-11-27T23:59:59.999Z'))).toEqual({ id: 'd:2026-11-27', endsAt: at('2026-11-28T00:00:00Z') });
    expect(spendWindow('daily', at('2026-11-28T00:00:00Z')).id).toBe('d:2026-11-28');
    // Sunday 29 November 2026 is in the week of Monday the 23rd; Monday the 30th starts the next.
    expect(spendWindow('weekly', at('2026-11-29T23:59:59Z'))).toEqual({ id: 'w:2026-11-23', endsAt: at('2026-11-30T00:00:00Z') });
    expect(spendWindow('weekly', at('2026-11-30T00:00:00Z')).id).toBe('w:2026-11-30');
    expect(spendWindow('weekly', at('2027-01-01T12:00:00Z')).id).toBe('w:2026-12-28');
    expect(spendWindow('monthly', at('2028-02-29T12:00:00Z'))).toEqual({ id: 'm:2028-02', endsAt: at('2028-03-01T00:00:00Z') });
    expect(spendWindow('monthly', at('2026-12-31T23:59:59Z'))).toEqual({ id: 'm:2026-12', endsAt: at('2027-01-01T00:00:00Z') });
    expect(spendWindow('lifetime', at('2026-11-27T00:00:00Z'))).toEqual({ id: 'lifetime', endsAt: undefined });
  });
});

describe('KeySpend', () => {
  const daily: SpendLimit = { id: 'k1', label: 'k1', limitMicroUsd: 100n, interval: 'daily' };
  const clock = { t: at('2026-11-27T12:00:00Z') };

  /** Runs `run` with a records file in a new folder (removed after), the clock at 2026-11-27 12:00 UTC. */
  function withRecordsFile(run: (file: string) => void): void {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'key-spend-'));
    try {
      clock.t = at('2026-11-27T12:00:00Z');
      run(path.join(dir, 'records.db'));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
  const fresh = (db?: Database.Database): KeySpend => new KeySpend({ now: () => clock.t, ...(db ? { db } : {}) });

  test('a reservation is the budget left (or a lower cap) and counts at once: a second request at the same time gets only the rest', () => {
    const s = fresh();
    const a = s.reserve(daily, undefined);
    expect([a.amount, a.budgetBound]).toEqual([100n, true]);
    expect(s.used(daily)).toBe(100n);
    expect(refusal(() => s.reserve(daily, 1n))).toEqual({ status: 403, code: 'key_spend_limit_exceeded', message: 'this API key has used 0.000100 of its daily spend limit of 0.000100 USD (0.000000 charged, 0.000100 held by requests still open (for at most 10 min after each ends without a receipt)); the charges reset at 2026-11-28T00:00:00.000Z' });
    a.end();
    expect(s.used(daily)).toBe(0n);
    const capped = s.reserve(daily, 30n);
    expect([capped.amount, capped.budgetBound]).toEqual([30n, false]);
    const rest = s.reserve(daily, 500n);
    expect([rest.amount, rest.budgetBound]).toEqual([70n, true]);
    capped.end();
    rest.end();
    expect(s.used(daily)).toBe(0n);
  });

  test('attempt holds count under their reservation, then on their own until settled or given up; a receipt is charged once', () => {
    const s = fresh();
    const r = s.reserve(daily, 60n);
    r.hold('a', 30n); // a hedge: two halves
    r.hold('b', 30n);
    expect(s.used(daily)).toBe(60n); // not 120: the holds are within the reservation
    s.settled('a', 12n, true);
    expect(s.used(daily)).toBe(60n); // 12 charged + 48 still reserved
    r.end();
    expect(s.used(daily)).toBe(12n + 30n); // b's hold is open until its receipt settles
    s.settled('b', 7n, false); // a receipt the market has not taken yet: it holds its own cost
    expect(s.used(daily)).toBe(12n + 7n);
    s.settled('b', 7n, true);
    expect(s.used(daily)).toBe(19n);
    s.settled('b', 7n, true); // the same receipt again (a retry answered from the record): not charged twice
    s.settled('a', 12n, true);
    expect(s.used(daily)).toBe(19n);
    s.dropped('b'); // (after its charge: nothing changes)
    expect(s.used(daily)).toBe(19n);
  });

  test('a request given up releases its hold; a receipt found after that is still charged; unknown requests are ignored', () => {
    const s = fresh();
    const r = s.reserve(daily, undefined);
    r.hold('c', 40n);
    r.end();
    expect(s.used(daily)).toBe(40n);
    s.dropped('c');
    expect(s.used(daily)).toBe(0n);
    s.settled('c', 9n, true);
    expect(s.used(daily)).toBe(9n);
    s.settled('not-a-limited-key', 50n, true);
    s.dropped('not-a-limited-key');
    expect(s.used(daily)).toBe(9n);
    // A hold given up while its reservation still runs: counted by neither afterwards.
    const r2 = s.reserve(daily, 20n);
    r2.hold('d', 20n);
    s.dropped('d');
    r2.end();
    expect(s.used(daily)).toBe(9n);
  });

  test('charges fall in the window of their settlement: the next day starts at 0, open holds carry over', () => {
    clock.t = at('2026-11-27T23:58:00Z');
    const s = fresh();
    const r = s.reserve(daily, undefined);
    r.hold('e', 50n);
    r.hold('f', 20n);
    s.settled('e', 50n, true);
    r.end();
    expect(s.used(daily)).toBe(70n);
    clock.t = at('2026-11-28T00:01:00Z');
    expect(s.used(daily)).toBe(20n);
    s.settled('f', 20n, true);
    expect(s.used(daily)).toBe(20n);
    const lifetime: SpendLimit = { id: 'k2', label: 'ci', limitMicroUsd: 5n, interval: 'lifetime' };
    const l = s.reserve(lifetime, undefined);
    l.hold('g', 5n);
    s.settled('g', 5n, true);
    l.end();
    expect(refusal(() => s.reserve(lifetime, undefined)).message).toBe('this API key has used 0.000005 of its lifetime spend limit of 0.000005 USD (0.000005 charged); it does not reset');
    clock.t = at('2027-06-01T00:00:00Z');
    expect(s.used(lifetime)).toBe(5n);
    expect(s.used(daily)).toBe(0n);
  });

  test('a hold without a receipt counts for 10 min after its request ended, then no more (a receipt found later is still charged); one under a receipt counts until settled or given up', () => {
    clock.t = at('2026-11-27T12:00:00Z');
    const s = fresh();
    const r = s.reserve(daily, undefined); // no cap: the whole budget is its cap, and its ticket's hold
    r.hold('k', 100n);
    clock.t += 60_000; // (a minute later, a provider breaks off: the handler ends, no receipt yet)
    r.end();
    expect(s.used(daily)).toBe(100n);
    expect(refusal(() => s.reserve(daily, undefined)).message).toBe('this API key has used 0.000100 of its daily spend limit of 0.000100 USD (0.000000 charged, 0.000100 held by requests still open (for at most 10 min after each ends without a receipt)); the charges reset at 2026-11-28T00:00:00.000Z');
    clock.t += LINGER_MS - 1;
    expect(s.used(daily)).toBe(100n);
    clock.t += 1;
    expect(s.used(daily)).toBe(0n);
    s.settled('k', 3n, true); // its receipt, found by a later look: charged all the same
    expect(s.used(daily)).toBe(3n);
    // A receipt the market has not taken yet holds its cost, with no time limit.
    const r2 = s.reserve(daily, undefined);
    r2.hold('l', 97n);
    r2.end();
    s.settled('l', 4n, false);
    clock.t += 2 * LINGER_MS;
    expect(s.used(daily)).toBe(7n);
    s.dropped('l'); // (given up: the market refused it for good)
    expect(s.used(daily)).toBe(3n);
  });

  test('a hold kept in the records file by a run that stopped lingers from the next start, then goes: no key is held for ever', () =>
    withRecordsFile((file) => {
      let db = new Database(file);
      const r = fresh(db).reserve(daily, undefined);
      r.hold('m', 100n); // (the gateway is killed while it runs: the reservation never ends)
      db.close();
      clock.t += 3 * 24 * 60 * 60_000; // (started again days later)
      db = new Database(file);
      const s = fresh(db);
      expect(s.used(daily)).toBe(100n);
      clock.t += LINGER_MS;
      expect(s.used(daily)).toBe(0n);
      db.close();
      db = new Database(file);
      expect(fresh(db).used(daily)).toBe(0n); // (the release was written)
      db.close();
    }));

  test('with a records file: the window\'s charges and the open holds survive a restart, and a late receipt is charged once', () =>
    withRecordsFile((file) => {
      let db = new Database(file);
      let s = fresh(db);
      const r = s.reserve(daily, undefined);
      r.hold('h', 30n);
      r.hold('i', 25n);
      s.settled('h', 30n, true);
      r.end();
      expect(s.used(daily)).toBe(55n);
      db.close();
      db = new Database(file);
      s = fresh(db);
      expect(s.used(daily)).toBe(55n);
      s.settled('h', 30n, true); // charged before the restart: not again
      expect(s.used(daily)).toBe(55n);
      s.settled('i', 25n, true);
      expect(s.used(daily)).toBe(55n);
      db.close();
      db = new Database(file);
      expect(fresh(db).used(daily)).toBe(55n);
      db.close();
    }));

  test('a write that fails is reported and the spend stays right in memory', () => {
    const db = new Database(':memory:');
    const errors: string[] = [];
    const s = new KeySpend({ db, now: () => clock.t, onError: (e) => errors.push(e.message) });
    db.exec('DROP TABLE key_spend; DROP TABLE key_requests');
    const r = s.reserve(daily, undefined);
    r.hold('j', 10n);
    s.settled('j', 10n, true);
    r.end();
    expect(s.used(daily)).toBe(10n);
    expect(errors.length).toBeGreaterThan(0);
    expect(errors[0]).toMatch(/no such table/);
  });
});
