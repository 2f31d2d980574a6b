// Receipt collection: a receipt is verified with the project's verifier against the provider the
// ticket it names was issued to; that ticket must be one this market issued, the receipt must be
// for that ticket's request, and its cost within the ticket's hold. Stored once per ticket.
import { isHex, toBase64 } from '../../attestation/bytes.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { peekShallow } from './peek-payload.ts';
import { envelopeLine, parseEnvelope } from '../../attestation/dsse.ts';
import { verifyReceipt } from '../../attestation/receipt-verify.ts';
import { RECEIPT_PAYLOAD_TYPE, ratesMatch, ratesToWire } from '../../attestation/receipt.ts';
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
  const claimed = peekShallow(env.value) ?? {}; // unverified: only to find the ticket and key
  const found = typeof claimed.ticket_id === 'string' ? store.ticket(claimed.ticket_id) : undefined;
  // The key to verify with: the provider the ticket was issued to; without a known ticket, the
  // registered provider the receipt claims (so a forged receipt still gets the verifier's code).
  const keyid = env.value.signatures[0]?.keyid;
  const provider = found?.provider ?? [claimed.provider, keyid].find((p): p is string => isHex(p, 32) && store.providers.has(p));
  if (provider === undefined) throw new MarketError(400, 'unknown_ticket', 'the receipt names no ticket this market issued, nor a registered provider');
  const v = verifyReceipt(env.value, { provider });
  if (!v.ok) {
    // Not signed by the ticket's provider: if another registered provider did sign it, say so (the
    // same refusal as a receipt whose ticket is found only once its payload is read, below).
    if (found) {
      const signer = [claimed.provider, ...env.value.signatures.map((sig) => sig.keyid)].find((p): p is string => isHex(p, 32) && p !== found.provider && store.providers.has(p) && verifyReceipt(env.value, { provider: p }).ok);
      if (signer) throw new MarketError(400, 'receipt_ticket_mismatch', `the receipt is signed by ${signer}, ticket ${found.ticket_id} was issued to ${found.provider}`);
    }
    throw new MarketError(400, v.error.code, v.error.message);
  }
  const r = v.value.payload;
  // (a payload the unverified peek could not read, in a base64 form DSSE allows, names its ticket now)
  const ticket = found ?? store.ticket(r.ticket_id);
  if (!ticket) throw new MarketError(400, 'unknown_ticket', `ticket ${r.ticket_id} was not issued by this market (or was forgotten: see its limits, or issued before a market without a file restarted)`);
  if (ticket.provider !== provider) throw new MarketError(400, 'receipt_ticket_mismatch', `the receipt is signed by ${provider}, ticket ${ticket.ticket_id} was issued to ${ticket.provider}`);
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

  // Stored (and compared) as the node's log line: only the provider's signature, under its own id
  // as keyid. Extra signatures, or another keyid (it is not signed), can be put on by anyone
  // holding the receipt, and would otherwise make the node's own line look like a second,
  // conflicting receipt (and the market keep a line the node's log does not have).
  // (base64 too: DSSE lets a reader take URL-safe or unpadded forms; the log writes standard ones)
  const canonical = envelopeLine(toBase64(v.value.payloadBytes), RECEIPT_PAYLOAD_TYPE, provider, toBase64(new Uint8Array(Buffer.from(v.value.signature.sig, 'base64'))));
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
