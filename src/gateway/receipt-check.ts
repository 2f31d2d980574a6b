// What the gateway checks of every receipt before it settles one or shows it to a buyer: the
// verifier's checks (signature by the ticket's provider, canonical payload, every field, cost =
// usage × rates, cost ≤ hold), and that it is the receipt of THIS request: the ticket, the exact
// body bytes, the hold, and (when the gateway saw the whole answer) the exact response bytes.
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import { ratesFromWire, ratesMatch, type ReceiptPayload, type WireRates } from '../../attestation/receipt.ts';
import { verifyReceipt } from '../../attestation/receipt-verify.ts';
import type { DisputedRates } from './price-dispute.ts';

export interface ReceiptExpectation {
  provider: string;
  requestId: string;
  ticketId: string;
  endpoint: string;
  model: string;
  bodySha256: string;
  holdMicroUsd: string;
  /** The ticket's price version: the receipt must bill under it. */
  priceVersion: string;
  /** The rates of that price version, as the market stated them with the ticket: the receipt must bill at exactly these. */
  rates?: WireRates;
  /** SHA-256 (hex) of every DATA byte received, when the answer arrived whole. */
  responseSha256?: string;
}

export type CheckedReceipt = { ok: true; line: string; payload: ReceiptPayload; envelope: DsseEnvelope } | { ok: false; message: string; disputedRates?: DisputedRates };

/**
 * With `allowReplay` (the request carried an Idempotency-Key), a receipt of an EARLIER request with
 * the same body is accepted too: the node answers a retry from its record, with the first
 * request's receipt, and never uses the new ticket.
 */
export function checkReceipt(line: unknown, exp: ReceiptExpectation, allowReplay = false): CheckedReceipt {
  if (typeof line !== 'string') return { ok: false, message: 'the answer carries no receipt' };
  const v = verifyReceipt(line, { provider: exp.provider });
  if (!v.ok) return { ok: false, message: `the receipt does not verify: ${v.error.code}: ${v.error.message}` };
  const p = v.value.payload;
  const replay = allowReplay && p.request_id !== exp.requestId;
  const mismatches: [string, string, string][] = [
    ['endpoint', p.endpoint, exp.endpoint],
    ['model', p.model, exp.model],
    ['request_sha256', p.request_sha256, exp.bodySha256],
  ];
  if (!replay) {
    mismatches.push(['request_id', p.request_id, exp.requestId], ['ticket_id', p.ticket_id, exp.ticketId], ['hold_micro_usd', p.hold_micro_usd, exp.holdMicroUsd], ['price.version', p.price.version, exp.priceVersion]);
    // A receipt's cost is usage × ITS rates: rates other than the price list's would bill anything up to the hold.
    if (exp.rates && !ratesMatch(p.price.rates, ratesFromWire(exp.rates))) {
      // (Whose fault: the provider's signed price list decides; see price-dispute.ts.)
      return {
        ok: false,
        message: `the receipt's rates ${JSON.stringify(p.price.rates).slice(0, 200)} are not price version ${exp.priceVersion}'s ${JSON.stringify(exp.rates).slice(0, 200)}`,
        disputedRates: { version: exp.priceVersion, model: exp.model, receipt: p.price.rates, market: exp.rates },
      };
    }
  }
  if (exp.responseSha256 !== undefined) mismatches.push(['response_sha256', p.response_sha256, exp.responseSha256]);
  for (const [field, got, want] of mismatches) {
    if (got !== want) return { ok: false, message: `the receipt's ${field} is ${got.slice(0, 80)}, expected ${want.slice(0, 80)}` };
  }
  return { ok: true, line, payload: p, envelope: v.value.envelope };
}
