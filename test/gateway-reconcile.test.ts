// The gateway's reconciler on its own (records in memory, the node and the market stubbed): most
// requests end settled on their own path and leave no job; a due job needing no I/O costs none,
// however many there are.
import { describe, expect, test } from 'vitest';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import { Reconciler } from '../src/gateway/reconcile.ts';
import { RequestRecords, type UnsettledJob } from '../src/gateway/records.ts';
import type { Settlements } from '../src/gateway/settlement.ts';
import type { MarketClient } from '../src/gateway/market-client.ts';

const envelope: DsseEnvelope = { payload: 'eyJ9', payloadType: 'application/vnd.test', signatures: [{ keyid: 'k', sig: 'c2ln' }] };
const receipt = (id: string) => ({
  envelope,
  payload: { request_id: id, status: 'completed', provider: 'ab'.repeat(32), usage: { input_tokens: 1, output_tokens: 1 }, cost_micro_usd: '1' } as unknown as ReceiptPayload,
});
const job = (id: string, nextAt = 0): UnsettledJob => ({
  request_id: id,
  provider: 'ab'.repeat(32),
  target: ['/ip4/127.0.0.1/tcp/1'],
  exp: { provider: 'ab'.repeat(32), requestId: id, ticketId: `t-${id}`, endpoint: 'chat/completions', model: 'm', bodySha256: '00'.repeat(32), holdMicroUsd: '9', priceVersion: 'p' },
  created_at: 0,
  next_at: nextAt,
  tries: 0,
});
const quiet = { info: () => {}, warn: () => {}, error: () => {} };

describe('Reconciler', () => {
  test('the watch ends with the request: settled, refused, never reached or answered with a bad receipt leaves no job', async () => {
    const { Settlements } = await import('../src/gateway/settlement.ts');
    const r = new RequestRecords(100);
    const ids = ['ok', 'taken-for-good', 'market-away', 'refused', 'unreached', 'bad', 'failed'];
    for (const id of ids) {
      r.begin({ request_id: id, endpoint: 'chat/completions', model: 'm', provider: null });
      r.watch(job(id, Date.now() + 60_000));
    }
    const answers: Record<string, () => Promise<{ ok: boolean }>> = {
      ok: async () => ({ ok: true }),
      'taken-for-good': async () => ({ ok: false }), // the market refused it: another post changes nothing
      'market-away': async () => {
        throw Object.assign(new Error('down'), { status: 502, code: 'market_unreachable' });
      },
    };
    let posting = '';
    const market = { postReceipt: () => answers[posting]!() } as unknown as MarketClient;
    const s = new Settlements({ log: quiet, market, records: r, host: undefined as never, receiptFetchMs: 0 });
    for (const id of ['ok', 'taken-for-good', 'market-away']) {
      posting = id;
      await s.settle(id, { ok: true, line: 'x', payload: receipt(id).payload, envelope } as never);
    }
    await s.stop();
    r.fail('refused', 'refused', { code: 'no_capacity', message: 'busy' });
    r.fail('unreached', 'failed', { code: 'provider_unreachable', message: 'no route' });
    r.fail('bad', 'bad_provider_response', { code: 'bad_provider_response', message: 'no' });
    r.fail('failed', 'failed', { code: 'provider_failed', message: 'gone' }); // may have a receipt: kept
    expect(ids.filter((id) => r.hasJob(id))).toEqual(['market-away', 'failed']);
    r.close();
  });

  test("a receipt the node's log shows later frees the request's Idempotency-Key when it did not complete, and only then (s30 review)", async () => {
    const { Settlements } = await import('../src/gateway/settlement.ts');
    const r = new RequestRecords(100);
    const forgotten: [string, string][] = [];
    const found: Record<string, string> = { left: 'cancelled', done: 'completed' };
    const market = { postReceipt: async () => ({ ok: true }) } as unknown as MarketClient;
    const s = new Settlements({ log: quiet, market, records: r, host: undefined as never, receiptFetchMs: 0, forgetIdempotent: (key, id) => void forgotten.push([key, id]) });
    // (the node's log, as the reconciler reads it)
    s.fetchReceipt = (async (p: { requestId: string }) => ({ ok: true, line: 'x', envelope, payload: { ...receipt(p.requestId).payload, status: found[p.requestId] } })) as never;
    for (const id of ['left', 'done']) {
      r.begin({ request_id: id, endpoint: 'chat/completions', model: 'm', provider: null });
      r.fail(id, 'abandoned', { code: 'request_abandoned', message: 'the buyer left' });
      r.watch({ ...job(id, 0), idem_key: `chat/completions\nkey-${id}` });
    }
    await new Reconciler({ records: r, settlements: s, market, log: quiet, unitMs: 1000 }).turn();
    expect(forgotten).toEqual([['chat/completions\nkey-left', 'left']]);
    await s.stop();
    r.close();
  });

  test('one turn clears every due job that needs no I/O (thousands), and asks nothing of the node or the market for them', async () => {
    const r = new RequestRecords(10_000);
    const asked: string[] = [];
    const settlements = { fetchReceipt: async () => (asked.push('node'), 'unreached'), settle: async () => void asked.push('market'), track: (_id: string, p: Promise<void>) => p } as unknown as Settlements;
    const market = { providers: async () => (asked.push('listing'), []) } as unknown as MarketClient;
    for (let i = 0; i < 5000; i++) {
      const id = `r${i}`;
      r.begin({ request_id: id, endpoint: 'chat/completions', model: 'm', provider: null });
      if (i % 2) r.settle(id, receipt(id), { ok: true });
      else r.fail(id, 'failed', { code: 'provider_failed', message: 'x' }); // (may have a receipt: asked at the node)
      r.watch(job(id, 0));
    }
    // Half settled (no I/O: dropped), half failed without a receipt (asked at the node, 8 at once, 64 a turn).
    const rec = new Reconciler({ records: r, settlements, market, log: quiet, unitMs: 1000 });
    await rec.turn();
    expect(r.unsettledCount).toBe(2500);
    expect(asked.filter((a) => a === 'node')).toHaveLength(64);
    expect(asked).not.toContain('market');
    // The node that could not be asked is asked again later (1 unit), not in a tight loop.
    asked.length = 0;
    await rec.turn();
    expect(asked.filter((a) => a === 'node')).toHaveLength(64); // the next 64 due; the first 64 wait
    r.close();
  });
});

describe('Settlements.settle and Idempotency-Keys', () => {
  test('forgets the Idempotency-Key of a request whose own receipt did not complete; not for a completed one, another request\'s receipt (a retry answered from the record), or a request without a key', async () => {
    const { Settlements } = await import('../src/gateway/settlement.ts');
    const forgotten: [string, string][] = [];
    const r = new RequestRecords(10);
    const market = { postReceipt: async () => ({ ok: true }) } as unknown as MarketClient;
    const s = new Settlements({ log: quiet, market, records: r, host: undefined as never, receiptFetchMs: 0, forgetIdempotent: (key, id) => void forgotten.push([key, id]) });
    for (const id of ['a', 'b', 'c', 'd', 'e', 'first']) {
      r.begin({ request_id: id, endpoint: 'chat/completions', model: 'm', provider: null });
      r.watch({ ...job(id, Date.now() + 60_000), ...(id === 'e' ? {} : { idem_key: `k-${id}` }) });
    }
    const got = (id: string, status: string) => ({ ok: true, line: 'x', envelope, payload: { ...receipt(id).payload, status } }) as never;
    await s.settle('a', got('a', 'cancelled'));
    await s.settle('b', got('b', 'failed'));
    await s.settle('c', got('c', 'completed'));
    await s.settle('first', got('first', 'cancelled'), 'd'); // d, a retry, answered with the first request's receipt
    await s.settle('e', got('e', 'cancelled'));
    expect(forgotten).toEqual([
      ['k-a', 'a'],
      ['k-b', 'b'],
    ]);
    await s.stop();
    r.close();
  });
});
