// checkReceipt (the gateway's check of a relayed or fetched receipt) must refuse a receipt for this ticket that names another endpoint or model.
import { describe, expect, test } from 'vitest';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { checkReceipt } from '../src/gateway/receipt-check.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

const node = testKey();
const p = receiptPayload(node, 0);
const exp = { provider: node.id, requestId: p.request_id, ticketId: p.ticket_id, endpoint: p.endpoint, model: p.model, bodySha256: p.request_sha256, holdMicroUsd: p.hold_micro_usd, priceVersion: p.price.version };
const line = (over: object) => serializeEnvelope(signReceipt(node, { ...p, ...over }));

describe('checkReceipt: the receipt of THIS request', () => {
  test('control: the matching receipt passes', () => expect(checkReceipt(line({}), exp).ok).toBe(true));
  test('another endpoint is refused', () => expect(checkReceipt(line({ endpoint: 'completions' }), exp)).toMatchObject({ ok: false, message: expect.stringMatching(/endpoint/) }));
  test('another model is refused', () => expect(checkReceipt(line({ model: 'other/model' }), exp)).toMatchObject({ ok: false, message: expect.stringMatching(/model/) }));
  test('an idempotent replay (other request id) still needs the same endpoint', () => expect(checkReceipt(line({ request_id: 'req-earlier', endpoint: 'completions' }), exp, true).ok).toBe(false));
});
