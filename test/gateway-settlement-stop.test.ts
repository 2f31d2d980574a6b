// Settlements end when the gateway closes: a receipt fetch or a POST retry under way stops at its
// next step instead of running on past close() (and past the records and libp2p it uses).
import crypto from 'node:crypto';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { serializeEnvelope } from '../attestation/dsse.ts';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import { dialTarget } from '../src/gateway/dial-target.ts';
import { noopLogger } from '../src/gateway/gateway-logger.ts';
import { MarketClient } from '../src/gateway/market-client.ts';
import { RequestRecords } from '../src/gateway/records.ts';
import { Settlements } from '../src/gateway/settlement.ts';
import type { Paid } from '../src/gateway/tickets.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { peerIdFromProviderId } from '../src/p2p/peer-id.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

let host: Host;
let closedPort: number;

beforeAll(async () => {
  host = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  // A port nothing listens on: every dial to it is refused at once.
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  closedPort = (srv.address() as net.AddressInfo).port;
  await new Promise((r) => srv.close(r));
});
afterAll(async () => {
  await host?.stop();
});

function paidAt(provider: string, requestId: string): Paid {
  const target = dialTarget(provider, peerIdFromProviderId(provider).toString(), [`/ip4/127.0.0.1/tcp/${closedPort}`]);
  return { requestId, provider, target, idempotent: false, exp: { provider, requestId, ticketId: 'tkt-1', endpoint: 'chat/completions', model: 'tiny/llama', bodySha256: '00'.repeat(32), holdMicroUsd: '5000', priceVersion: 'p1' } };
}

describe('Settlements.stop', () => {
  test('a receipt still being fetched from a node that cannot be reached ends at once; its record stays in_progress', async () => {
    const records = new RequestRecords();
    const market = new MarketClient('http://127.0.0.1:2', { fetch: async () => Promise.reject(new Error('no market in this test')) });
    const s = new Settlements({ log: noopLogger, market, records, host, receiptFetchMs: 600_000 });
    const node = testKey();
    records.begin({ request_id: 'req-fetching', endpoint: 'chat/completions', model: 'tiny/llama', provider: node.id });
    const settling = s.settleFromNode(paidAt(node.id, 'req-fetching'), 'abandoned');
    await new Promise((r) => setTimeout(r, 300)); // a few refused dials and waits
    expect(s.pending).toBe(1);
    // Without stop() this fetch would go on for receiptFetchMs (10 minutes): the test would time out.
    await s.stop();
    await settling;
    expect(s.pending).toBe(0);
    expect(records.get('req-fetching')).toMatchObject({ status: 'in_progress', settled: false, finished_at: null });
  });

  test('a POST to an unreachable market is not retried after stop(): recorded not settled, settlement_interrupted', async () => {
    const records = new RequestRecords();
    let posts = 0;
    let firstPost!: () => void;
    const posted = new Promise<void>((r) => (firstPost = r));
    const market = new MarketClient('http://127.0.0.1:2', {
      fetch: async () => {
        posts++;
        firstPost();
        throw new Error('connection refused');
      },
    });
    const s = new Settlements({ log: noopLogger, market, records, host, receiptFetchMs: 1000 });
    const node = testKey();
    const payload: ReceiptPayload = receiptPayload(node, 0, { request_id: 'req-posting' } as Partial<ReceiptPayload>);
    const envelope = signReceipt(node, payload);
    s.settleLater('req-posting', { ok: true, line: serializeEnvelope(envelope), payload, envelope });
    await posted;
    await s.stop();
    expect(posts).toBe(1); // three tries without stop()
    expect(records.get('req-posting')).toMatchObject({ settled: false, settlement_error: { code: 'settlement_interrupted' } });
  });

  test('a POST the market never answers ends at stop(), not at its own timeout: recorded not settled, settlement_interrupted', async () => {
    const records = new RequestRecords();
    let sent!: () => void;
    const posting = new Promise<void>((r) => (sent = r));
    // A market that takes the POST and never answers: only the call's signal ends it.
    const market = new MarketClient('http://127.0.0.1:2', {
      timeoutMs: 600_000,
      fetch: ((_url: string, init: RequestInit) => {
        sent();
        return new Promise((_resolve, reject) => init.signal!.addEventListener('abort', () => reject(init.signal!.reason), { once: true }));
      }) as unknown as typeof fetch,
    });
    const s = new Settlements({ log: noopLogger, market, records, host, receiptFetchMs: 1000 });
    const node = testKey();
    const payload: ReceiptPayload = receiptPayload(node, 0, { request_id: 'req-hanging' } as Partial<ReceiptPayload>);
    const envelope = signReceipt(node, payload);
    s.settleLater('req-hanging', { ok: true, line: serializeEnvelope(envelope), payload, envelope });
    await posting;
    // Without the signal this stop would wait for the POST's 10-minute timeout: the test would time out.
    await s.stop();
    expect(s.pending).toBe(0);
    expect(records.get('req-hanging')).toMatchObject({ settled: false, settlement_error: { code: 'settlement_interrupted', message: expect.stringMatching(/had not answered when the gateway stopped/) } });
  });

  test('a settlement begun after stop() posts nothing: recorded not settled, settlement_interrupted', async () => {
    const records = new RequestRecords();
    let posts = 0;
    const market = new MarketClient('http://127.0.0.1:2', {
      fetch: async () => {
        posts++;
        throw new Error('not expected');
      },
    });
    const s = new Settlements({ log: noopLogger, market, records, host, receiptFetchMs: 1000 });
    await s.stop();
    const node = testKey();
    const payload: ReceiptPayload = receiptPayload(node, 0, { request_id: 'req-late' } as Partial<ReceiptPayload>);
    const envelope = signReceipt(node, payload);
    await s.settle('req-late', { ok: true, line: serializeEnvelope(envelope), payload, envelope });
    expect(posts).toBe(0);
    expect(records.get('req-late')).toMatchObject({ settled: false, settlement_error: { code: 'settlement_interrupted' } });
  });
});
