// Receipt collection: a receipt is verified with the project's verifier against the provider the
// ticket it names was issued to; that ticket must be one this market issued, the receipt must be
// for that ticket's request, and its cost within the ticket's hold. Stored once per ticket.
import { isHex } from '../../attestation/bytes.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { peekPayload } from '../../attestation/signed-payload.ts';
import { parseEnvelope, serializeEnvelope } from '../../attestation/dsse.ts';
import { verifyReceipt } from '../../attestation/receipt-verify.ts';
import { ratesMatch, ratesToWire } from '../../attestation/receipt.ts';
import { MarketError } from './errors.ts';
import type { MarketStore, ReceiptRecord } from './store.ts';

export interface CollectedReceipt {
  ok: true;
  request_id: string;
  cost_micro_usd: string;
}

export function collectReceipt(store: MarketStore, line: string, now: number): { result: CollectedReceipt; duplicate: boolean } {
  const env = parseEnvelope(line);
  if (!env.ok) throw new MarketError(400, env.error.code, env.error.message);
  const claimed = peekPayload(env.value) ?? {}; // unverified: only to find the ticket and key
  const ticket = typeof claimed.ticket_id === 'string' ? store.ticket(claimed.ticket_id) : undefined;
  // The key to verify with: the provider the ticket was issued to; without a known ticket, the
  // registered provider the receipt claims (so a forged receipt still gets the verifier's code).
  const keyid = env.value.signatures[0]?.keyid;
  const provider = ticket?.provider ?? [claimed.provider, keyid].find((p): p is string => isHex(p, 32) && store.providers.has(p));
  if (provider === undefined) throw new MarketError(400, 'unknown_ticket', 'the receipt names no ticket this market issued, nor a registered provider');
  const v = verifyReceipt(env.value, { provider });
  if (!v.ok) throw new MarketError(400, v.error.code, v.error.message);
  const r = v.value.payload;
  if (!ticket) throw new MarketError(400, 'unknown_ticket', `ticket ${r.ticket_id} was not issued by this market (or was issued before it restarted)`);
  const mismatch =
    r.request_id !== ticket.request_id ? `request_id is ${r.request_id}, the ticket's is ${ticket.request_id}`
    : r.model !== ticket.model ? `model is ${r.model}, the ticket's is ${ticket.model}`
    : r.endpoint !== ticket.endpoint ? `endpoint is ${r.endpoint}, the ticket's is ${ticket.endpoint}`
    : r.request_sha256 !== ticket.body_sha256 ? `request_sha256 is ${r.request_sha256}, the ticket's body hash is ${ticket.body_sha256}`
    : r.price.version !== ticket.price_version ? `price version is ${r.price.version}, the ticket's is ${ticket.price_version}`
    : !ratesMatch(r.price.rates, ticket.rates) ? `rates ${JSON.stringify(r.price.rates)} are not those of price version ${ticket.price_version} (${JSON.stringify(ratesToWire(ticket.rates))})`
    : r.hold_micro_usd !== ticket.hold.toString() ? `hold_micro_usd is ${r.hold_micro_usd}, the ticket's hold is ${ticket.hold}`
    : undefined;
  if (mismatch) throw new MarketError(400, 'receipt_ticket_mismatch', `the receipt is not for ticket ${ticket.ticket_id}: ${mismatch}`);
  // (cost ≤ hold: verifyReceipt checks it against hold_micro_usd, which equals the ticket's.)

  // Stored (and compared) with only the provider's signature: the node's log line. Extra
  // signatures (anyone holding the receipt can append one) would otherwise make the node's own
  // line look like a second, conflicting receipt.
  const canonical = serializeEnvelope({ ...v.value.envelope, signatures: [v.value.signature] });
  const result: CollectedReceipt = { ok: true, request_id: r.request_id, cost_micro_usd: r.cost_micro_usd };
  // Compared by digest: the ticket remembers which receipt settled it after the record itself is
  // evicted (MarketLimits.maxReceipts), so a late retry is still never counted twice.
  const digest = sha256Hex(canonical);
  const settled = ticket.settled;
  if (settled) {
    // The same receipt again (a retry) is answered as the first time; another receipt for a ticket
    // that already has one means the node signed two receipts for one request.
    if (settled.receipt_sha256 === digest) return { result, duplicate: true };
    throw new MarketError(409, 'receipt_conflict', `ticket ${ticket.ticket_id} already has a different receipt (seq ${settled.seq})`);
  }
  const record: ReceiptRecord = {
    request_id: r.request_id,
    ticket_id: r.ticket_id,
    provider: r.provider,
    model: r.model,
    endpoint: r.endpoint,
    status: r.status,
    cost_micro_usd: r.cost_micro_usd,
    seq: r.seq,
    receipt: canonical,
    received_at: now,
  };
  store.addReceipt(record, digest);
  return { result, duplicate: false };
}
