// The development market with a file (`seller-node market --data DIR` keeps DIR/market.db): a
// ticket issued before a restart still settles after it, the totals and receipt lists survive,
// a receipt already taken is still a duplicate (never counted twice), one market a file, and a
// write that fails is 503 with nothing issued or counted.
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { TicketGate } from '../src/dispatch/ticket-gate.ts';
import { pino } from 'pino';
import { createMarket, type Market } from '../src/market/market.ts';
import { InferService, type InferResponse } from '../src/serve/infer-service.ts';
import { call, provider, registration, TINY } from './helpers/market-provider.ts';
import { testKey } from './helpers/receipts.ts';
import { startServing, type Serving } from './helpers/serving.ts';

const marketKey = testKey();
const node = testKey();
const nodeProvider = provider({ key: node });
const sha = (b: Uint8Array) => toHex(crypto.createHash('sha256').update(b).digest());

let dir: string;
let file: string;
let serving: Serving;
let service: InferService;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'market-file-'));
  file = path.join(dir, 'market.db');
  serving = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: toHex(new Uint8Array(32)) });
  const gate = new TicketGate({ db: serving.db, marketplaceKeys: [{ publicKey: marketKey.id }], providerId: node.id });
  service = new InferService({ log: serving.log, gate, models: new Map([[serving.model.id, serving.model]]), priceVersion: nodeProvider.prices.payload.version });
});

afterAll(async () => {
  await serving?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

async function openMarket(logLines?: { msg: string; failures_since_last_line?: number }[]): Promise<{ m: Market; base: string }> {
  const logger = logLines ? pino({ level: 'info' }, { write: (line: string) => void logLines.push(JSON.parse(line)) }) : undefined;
  const m = createMarket({ seed: marketKey.seed, file, ...(logger ? { logger } : {}) });
  const { url: base } = await m.listen();
  expect((await call(base, 'POST', '/v1/providers/register', registration(nodeProvider, { models: [{ ...TINY, context: serving.adapter.info.contextLength }] }))).status).toBe(200);
  return { m, base };
}

/** A ticket for a body no node will run: what a write to the market's file is tried with. */
const askTicket = (base: string) => call(base, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: '00'.repeat(32) });

/** A ticket from the market, and the receipt line the node signs for it. */
async function ticketAndReceipt(base: string): Promise<{ line: string; requestId: string }> {
  const bytes = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4, seed: 3 }));
  const t = await call(base, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: sha(bytes), max_cost_micro_usd: '100000' });
  expect(t.status).toBe(200);
  let trailer: Record<string, unknown> = {};
  const res: InferResponse = { head: async () => undefined, data: async () => undefined, trailer: async (x) => void (trailer = x) };
  await service.handle({ head: { endpoint: 'chat/completions', ticket: t.body.ticket as DsseEnvelope }, body: bytes, signal: new AbortController().signal }, res);
  expect(trailer.status).toBe('completed');
  return { line: trailer.receipt as string, requestId: t.body.request_id as string };
}

describe('the market\'s file', () => {
  test('a ticket issued before a restart settles after it; totals, lists and duplicates carry over', async () => {
    let { m, base } = await openMarket();
    const settledBefore = await ticketAndReceipt(base);
    const first = await call(base, 'POST', '/v1/receipts', { receipt: settledBefore.line });
    expect(first.status).toBe(200);
    const pending = await ticketAndReceipt(base); // its receipt reaches the market only after the restart
    const totals = (await call(base, 'GET', '/v1/totals')).body;
    await m.close();

    ({ m, base } = await openMarket());
    try {
      expect((await call(base, 'GET', '/v1/totals')).body).toEqual(totals);
      // The receipt of the ticket issued before the restart is taken (not unknown_ticket) and counted.
      const late = await call(base, 'POST', '/v1/receipts', { receipt: pending.line });
      expect(late.status).toBe(200);
      expect(late.body.request_id).toBe(pending.requestId);
      // The one taken before is a duplicate: answered as before, not counted again.
      expect(await call(base, 'POST', '/v1/receipts', { receipt: settledBefore.line })).toEqual(first);
      const after = (await call(base, 'GET', '/v1/totals')).body as { receipts: number; cost_micro_usd: string };
      expect(after.receipts).toBe(totals.receipts + 1);
      expect(BigInt(after.cost_micro_usd)).toBe(BigInt(totals.cost_micro_usd) + BigInt(late.body.cost_micro_usd));
      expect(((await call(base, 'GET', '/v1/receipts')).body as { request_id: string }[]).map((r) => r.request_id)).toEqual([settledBefore.requestId, pending.requestId]);
      expect((await call(base, 'GET', `/v1/receipts/${settledBefore.requestId}`)).body).toMatchObject({ receipt: settledBefore.line });
    } finally {
      await m.close();
    }
  });

  test('one market a file: a second one on it is refused at once, naming the file', async () => {
    const { m } = await openMarket();
    try {
      expect(() => createMarket({ seed: marketKey.seed, file })).toThrow(`${file}: another market uses this file (its --data folder)`);
    } finally {
      await m.close();
    }
    // Once the first is closed, the file opens again.
    const again = createMarket({ seed: marketKey.seed, file });
    await again.close();
  });

  test('a write that fails is 503 market_storage_failed: no ticket handed out, no receipt counted, the market still up; said at error level once, not once a request', async () => {
    const lines: { msg: string; failures_since_last_line?: number }[] = [];
    const { m, base } = await openMarket(lines);
    try {
      const { line } = await ticketAndReceipt(base);
      const totals = (await call(base, 'GET', '/v1/totals')).body;
      // The file goes away under the market (its connection closed): every write now fails.
      (m.store as unknown as { db: { close(): void } }).db.close();
      const refused = await call(base, 'POST', '/v1/receipts', { receipt: line });
      expect(refused.status).toBe(503);
      expect(refused.body.error.code).toBe('market_storage_failed');
      expect((await call(base, 'GET', '/v1/totals')).body).toEqual(totals);
      const t = await askTicket(base);
      expect(t.status).toBe(503);
      expect(t.body.error.code).toBe('market_storage_failed');
      for (let i = 0; i < 5; i++) expect((await askTicket(base)).status).toBe(503);
      expect(lines.filter((l) => l.msg.startsWith('market: its file refused a write'))).toHaveLength(1);
      expect((await call(base, 'GET', '/v1/market')).status).toBe(200);
    } finally {
      await m.close().catch(() => {});
    }
  });

  test('pruning its file failing is logged; the ticket is issued all the same', async () => {
    const lines: { msg: string; err?: string }[] = [];
    const { m, base } = await openMarket(lines);
    try {
      (m.store as unknown as { db: { prune(): void } }).db.prune = () => {
        throw new Error('disk I/O error');
      };
      const t = await askTicket(base);
      expect(t.status).toBe(200);
      expect(lines.filter((l) => l.msg.startsWith('market: pruning old tickets and receipts from its file failed'))).toEqual([expect.objectContaining({ err: 'disk I/O error' })]);
    } finally {
      await m.close().catch(() => {});
    }
  });

  test('its file deleted while it runs: every write is refused (503 market_storage_failed, saying so) rather than booked into a file the next start will not have', async () => {
    const lines: { msg: string; reason?: string }[] = [];
    const { m, base } = await openMarket(lines);
    try {
      const { line } = await ticketAndReceipt(base);
      const totals = (await call(base, 'GET', '/v1/totals')).body;
      fs.rmSync(file);
      fs.rmSync(`${file}-wal`, { force: true });
      const refused = await call(base, 'POST', '/v1/receipts', { receipt: line });
      expect(refused.status).toBe(503);
      expect(refused.body.error).toMatchObject({ code: 'market_storage_failed', message: expect.stringContaining(`${file} was deleted or replaced while the market used it`) });
      expect((await askTicket(base)).status).toBe(503);
      expect((await call(base, 'GET', '/v1/totals')).body).toEqual(totals);
      expect(lines.filter((l) => l.msg.startsWith('market: its file refused a write'))).toHaveLength(1);
    } finally {
      await m.close().catch(() => {});
      fs.rmSync(file, { force: true });
    }
  });

  // Changed in place by another program (the same inode: the device:inode check sees nothing), its
  // next checkpoint would mix what is left into the file: every write is refused, saying so.
  test.each([
    ['its -wal cut short', () => execFileSync('truncate', ['-s', '0', `${file}-wal`]), () => `${file}-wal`],
    ['an older copy of it copied over it', () => execFileSync('cp', [`${dir}/older.db`, file]), () => file],
  ])('%s while it runs: every write is refused (503 market_storage_failed, saying so)', async (_what, change, changed) => {
    const lines: { msg: string }[] = [];
    const { m, base } = await openMarket(lines);
    try {
      expect((await askTicket(base)).status).toBe(200);
      execFileSync('cp', [file, `${dir}/older.db`]); // (an older copy, as a backup would be; by another process, as this one closing a descriptor of the file would drop SQLite's locks)
      const { line } = await ticketAndReceipt(base); // (written after it: a commit, and the market's own checkpoints, never look like a change)
      const totals = (await call(base, 'GET', '/v1/totals')).body;
      change();
      const refused = await call(base, 'POST', '/v1/receipts', { receipt: line });
      expect(refused.status).toBe(503);
      expect(refused.body.error).toMatchObject({ code: 'market_storage_failed', message: expect.stringContaining(`${changed()} was changed in place while the market used it, by something other than the market`) });
      expect((await askTicket(base)).status).toBe(503);
      expect((await call(base, 'GET', '/v1/totals')).body).toEqual(totals);
    } finally {
      await m.close().catch(() => {});
      for (const f of [file, `${file}-wal`, `${dir}/older.db`]) fs.rmSync(f, { force: true });
    }
  });
});
