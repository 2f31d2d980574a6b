import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { sha256 } from '../attestation/hash.ts';
import { TicketGate } from '../src/dispatch/ticket-gate.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tickets-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const market = testKey();
const provider = testKey();
const body = utf8('{"model":"tiny/llama","messages":[]}');
const expectation = { endpoint: 'chat/completions', model: 'tiny/llama', priceVersion: 'p1', body };
const fresh = (over = {}) => ticketPayload(provider.id, { body_sha256: toHex(sha256(body)), ...over });

function gate(file: string, now?: () => number) {
  const db = new Database(file);
  return { db, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: provider.id, ...(now ? { now } : {}) }) };
}

describe('TicketGate', () => {
  test('admits a good ticket once; a replay is refused, also after a restart', () => {
    const file = path.join(dir, 'a.db');
    const t = signTicket(market, fresh());
    const g1 = gate(file);
    expect(g1.gate.admit(t, expectation)).toMatchObject({ ok: true, ticket: { provider: provider.id } });
    expect(g1.gate.admit(t, expectation)).toMatchObject({ ok: false, status: 409, code: 'ticket_replayed' });
    g1.db.close();
    const g2 = gate(file);
    expect(g2.gate.admit(t, expectation)).toMatchObject({ ok: false, code: 'ticket_replayed' });
    g2.db.close();
  });

  test('the marketplace keys as configured: a key that is not one refuses every ticket; a keyid is only a hint (DSSE), so a market naming its key otherwise is still verified', () => {
    const db = new Database(path.join(dir, 'keys.db'));
    const t = () => signTicket(market, fresh());
    const with_ = (keys: { publicKey: string; keyid?: string }[]) => new TicketGate({ db, marketplaceKeys: keys, providerId: provider.id });
    expect(with_([{ publicKey: 'zz' }]).admit(t(), expectation)).toMatchObject({ ok: false, code: 'ticket_invalid' });
    expect(with_([{ publicKey: market.id.toUpperCase() }]).admit(t(), expectation)).toMatchObject({ ok: false, code: 'ticket_invalid' });
    expect(with_([{ publicKey: market.id, keyid: 'another-name' }]).admit(t(), expectation)).toMatchObject({ ok: true });
    expect(with_([{ publicKey: testKey().id, keyid: market.id }]).admit(t(), expectation)).toMatchObject({ ok: false, code: 'ticket_invalid' });
    expect(with_([{ publicKey: market.id, keyid: market.id }]).admit(t(), expectation)).toMatchObject({ ok: true });
    db.close();
  });

  test('each refusal has its code; a refused ticket is not used up', () => {
    const { db, gate: g } = gate(path.join(dir, 'b.db'));
    const now = Date.now();
    const cases: [unknown, object, string][] = [
      [signTicket(testKey(), fresh()), expectation, 'ticket_invalid'],
      ['{"payload":', expectation, 'ticket_invalid'],
      [signTicket(market, fresh({ issued_at: now - 600_000, expires_at: now - 60_000 })), expectation, 'ticket_expired'],
      [signTicket(market, fresh({ issued_at: now + 600_000, expires_at: now + 700_000 })), expectation, 'ticket_not_yet_valid'],
      [signTicket(market, { ...fresh(), provider: testKey().id }), expectation, 'ticket_wrong_provider'],
      [signTicket(market, fresh()), { ...expectation, body: utf8('{"model":"tiny/llama","messages":[] }') }, 'ticket_body_mismatch'],
      [signTicket(market, fresh()), { ...expectation, endpoint: 'completions' }, 'ticket_endpoint_mismatch'],
      [signTicket(market, fresh()), { ...expectation, model: 'other' }, 'ticket_model_mismatch'],
      [signTicket(market, fresh()), { ...expectation, priceVersion: 'p2' }, 'ticket_price_version_mismatch'],
    ];
    for (const [t, e, code] of cases) {
      const r = g.admit(t as string, e as typeof expectation);
      expect(r.ok ? 'ok' : r.code, code).toBe(code);
    }
    // The ticket refused for a wrong model is still good for its own request.
    const t = signTicket(market, fresh());
    expect(g.admit(t, { ...expectation, model: 'other' }).ok).toBe(false);
    expect(g.admit(t, expectation).ok).toBe(true);
    db.close();
  });

  test('no trusted marketplace key: every ticket is refused', () => {
    const db = new Database(path.join(dir, 'c.db'));
    const g = new TicketGate({ db, marketplaceKeys: [], providerId: provider.id });
    expect(g.admit(signTicket(market, fresh()), expectation)).toMatchObject({ ok: false, status: 401, code: 'ticket_invalid' });
    db.close();
  });

  test('prune forgets only tickets that can no longer pass expiry', () => {
    let clock = Date.now();
    const { db, gate: g } = gate(path.join(dir, 'd.db'), () => clock);
    const short = signTicket(market, fresh({ issued_at: clock - 1000, expires_at: clock + 1000 }));
    const long = signTicket(market, fresh({ issued_at: clock - 1000, expires_at: clock + 3_600_000 }));
    expect(g.admit(short, expectation).ok).toBe(true);
    expect(g.admit(long, expectation).ok).toBe(true);
    clock += 40_000;
    expect(g.prune()).toBe(1);
    expect(g.admit(long, expectation)).toMatchObject({ ok: false, code: 'ticket_replayed' });
    expect(g.admit(short, expectation)).toMatchObject({ ok: false, code: 'ticket_expired' });
    db.close();
  });
});

const pruneMarket = testKey();
const pruneProvider = testKey();

describe('TicketGate.prune keeps every ticket that could still pass the expiry check', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ticket-gate-prune-'));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
  test('a used ticket, expired 10 s ago (within the 30 s skew): prune keeps it; its replay is refused', () => {
    let clock = 1_700_000_000_000;
    const db = new Database(path.join(dir, 'g.db'));
    const gate = new TicketGate({ db, marketplaceKeys: [{ publicKey: pruneMarket.id }], providerId: pruneProvider.id, now: () => clock });
    const body = utf8('{"model":"tiny/llama","messages":[]}');
    const expectation = { endpoint: 'chat/completions', model: 'tiny/llama', priceVersion: 'p1', body };
    const t = signTicket(pruneMarket, ticketPayload(pruneProvider.id, { body_sha256: toHex(sha256(body)), issued_at: clock - 1000, expires_at: clock + 20_000 }));
    expect(gate.admit(t, expectation).ok).toBe(true);
    clock += 30_000; // expires_at was 10 s ago: still within the skew
    expect(gate.prune()).toBe(0);
    expect(gate.admit(t, expectation)).toMatchObject({ ok: false, code: 'ticket_replayed' });
    db.close();
  });
});
