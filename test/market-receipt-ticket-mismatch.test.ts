// The market refusing a receipt signed by another registered provider than the one the ticket was
// issued to: 400 receipt_ticket_mismatch, "the receipt is signed by <B>, ticket <T> was issued to
// <A>", through the market's real HTTP API. The market finds the ticket (and so the key to verify
// with) by peeking at the unverified payload; a payload in a base64 form the peek does not read
// (unpadded, as DSSE allows) is verified with the key its keyid names instead, and the ticket is
// found only from the verified payload: that is where a receipt by the wrong provider is caught.
// Nothing is counted, the market's log says it (money disputed), and the ticket's own provider can
// still settle it.
import crypto from 'node:crypto';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { fromBase64, fromUtf8, toHex } from '../attestation/bytes.ts';
import { serializeEnvelope } from '../attestation/dsse.ts';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { call, provider, registration, type Provider } from './helpers/market-provider.ts';
import { receiptPayload, signReceipt, testKey, type TestKey } from './helpers/receipts.ts';

const lines: { level: number; msg: string; code?: string; reason?: string }[] = [];
let market: Market;
let url: string;
let a: Provider;
let b: Provider;

beforeAll(async () => {
  const { default: pino } = await import('pino');
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), logger: pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) }) });
  ({ url } = await market.listen());
  a = provider();
  b = provider();
  for (const p of [a, b]) expect((await call(url, 'POST', '/v1/providers/register', registration(p))).status).toBe(200);
});
afterAll(async () => {
  await market?.close();
});

/** A ticket the market issues to provider `p` (named in the preference list). */
async function ticketFor(p: Provider): Promise<Record<string, string>> {
  const body = 'the request body';
  const r = await call(url, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: toHex(crypto.createHash('sha256').update(body).digest()), max_cost_micro_usd: '100000', providers: [p.key.id] });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  expect(r.body.provider).toBe(p.key.id);
  return JSON.parse(fromUtf8(fromBase64(r.body.ticket.payload)!)!) as Record<string, string>;
}

/** A well-formed receipt by `key` for everything `ticket` admitted (its request, model, body, price version, hold). */
function receiptFor(key: TestKey, ticket: Record<string, string>, over: Partial<ReceiptPayload> = {}): ReceiptPayload {
  return receiptPayload(key, 0, {
    request_id: ticket.request_id,
    ticket_id: ticket.ticket_id,
    endpoint: ticket.endpoint,
    model: ticket.model,
    request_sha256: ticket.body_sha256,
    price: { version: ticket.price_version!, rates: { input_per_mtok: '150000', output_per_mtok: '600000' } },
    hold_micro_usd: ticket.max_cost_micro_usd,
    ...over,
  } as Partial<ReceiptPayload>);
}

/** The receipt's envelope line with its payload in unpadded base64 (DSSE allows it; the signature is over the bytes, so it still verifies). */
function unpaddedLine(key: TestKey, payload: ReceiptPayload): string {
  // (A longer runtime.version moves the payload's length: within three, base64 needs padding. A
  // bumped finished_at, as before, keeps its length, and looped for ever once the payload's length
  // was a multiple of 3.)
  for (let extra = 0; extra < 3; extra++) {
    const env = signReceipt(key, { ...payload, runtime: { ...payload.runtime, version: `${payload.runtime.version}${'.0'.repeat(extra)}` } });
    if (env.payload.endsWith('=')) return serializeEnvelope({ ...env, payload: env.payload.replace(/=+$/, '') });
  }
  throw new Error('no padded payload within three lengths');
}

test('a receipt by another registered provider, for a ticket issued to the first, is 400 receipt_ticket_mismatch naming both; nothing counted; the market warns; the ticket\'s provider still settles it', async () => {
  const ticket = await ticketFor(a);
  const before = (await call(url, 'GET', '/v1/totals')).body;
  const r = await call(url, 'POST', '/v1/receipts', { receipt: unpaddedLine(b.key, receiptFor(b.key, ticket)) });
  expect(r).toEqual({ status: 400, body: { error: { code: 'receipt_ticket_mismatch', message: `the receipt is signed by ${b.key.id}, ticket ${ticket.ticket_id} was issued to ${a.key.id}` } } });
  expect((await call(url, 'GET', '/v1/totals')).body).toEqual(before);
  expect((await call(url, 'GET', `/v1/receipts/${ticket.request_id}`)).status).toBe(404);
  expect(lines.filter((l) => l.msg === 'receipt refused')).toContainEqual(expect.objectContaining({ level: 40, code: 'receipt_ticket_mismatch', reason: expect.stringContaining(`the receipt is signed by ${b.key.id}, ticket ${ticket.ticket_id} was issued to `) }));
  // Posted again, the same answer (a refusal settles nothing).
  expect(await call(url, 'POST', '/v1/receipts', { receipt: unpaddedLine(b.key, receiptFor(b.key, ticket)) })).toEqual(r);
  // The provider the ticket was issued to settles it, in either base64 form, once.
  const honest = receiptFor(a.key, ticket);
  const settled = await call(url, 'POST', '/v1/receipts', { receipt: unpaddedLine(a.key, honest) });
  expect(settled).toMatchObject({ status: 200, body: { ok: true, request_id: ticket.request_id } });
  expect((await call(url, 'GET', '/v1/totals')).body.receipts).toBe(before.receipts + 1);
  expect((await call(url, 'GET', `/v1/receipts/${ticket.request_id}`)).body).toMatchObject({ provider: a.key.id, ticket_id: ticket.ticket_id });
  // And the other provider's receipt, after the ticket settled, is still refused for the same reason (not a conflict, not a duplicate).
  expect(await call(url, 'POST', '/v1/receipts', { receipt: unpaddedLine(b.key, receiptFor(b.key, ticket)) })).toEqual(r);
});

test('the same receipt in standard base64 is refused too (verified with the ticket\'s provider\'s key, it is not that provider\'s)', async () => {
  const ticket = await ticketFor(a);
  const before = (await call(url, 'GET', '/v1/totals')).body;
  const r = await call(url, 'POST', '/v1/receipts', { receipt: serializeEnvelope(signReceipt(b.key, receiptFor(b.key, ticket))) });
  // (the ticket's provider's key finds no signature; the other registered provider's does: said as such, as for the unpadded form)
  expect(r).toEqual({ status: 400, body: { error: { code: 'receipt_ticket_mismatch', message: `the receipt is signed by ${b.key.id}, ticket ${ticket.ticket_id} was issued to ${a.key.id}` } } });
  expect((await call(url, 'GET', '/v1/totals')).body).toEqual(before);
});

test('a receipt signed by a provider the market never registered, for a registered provider\'s ticket: refused, not counted', async () => {
  const ticket = await ticketFor(a);
  const stranger = testKey();
  const r = await call(url, 'POST', '/v1/receipts', { receipt: unpaddedLine(stranger, receiptFor(stranger, ticket)) });
  expect(r).toMatchObject({ status: 400, body: { error: { code: 'unknown_ticket', message: 'the receipt names no ticket this market issued, nor a registered provider' } } });
});
