// Signed receipts and tickets for tests, made with the project's own signing code.
import crypto from 'node:crypto';
import { toHex, utf8 } from '../../attestation/bytes.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';
import { signEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { ed25519PublicKey } from '../../attestation/ed25519.ts';
import { sha256 } from '../../attestation/hash.ts';
import { GENESIS_PREV, RECEIPT_PAYLOAD_TYPE, type ReceiptPayload } from '../../attestation/receipt.ts';
import { signTicket as signMarketTicket, type TicketPayload } from '../../attestation/ticket.ts';
import { syntheticReceiptBody } from '../../src/store/synthetic.ts';

export interface TestKey {
  seed: Uint8Array;
  publicKey: Uint8Array;
  id: string;
}

export function testKey(seed?: Uint8Array): TestKey {
  const s = seed ?? new Uint8Array(crypto.randomBytes(32));
  const publicKey = ed25519PublicKey(s);
  return { seed: s, publicKey, id: toHex(publicKey) };
}

export function receiptPayload(key: TestKey, i = 0, over: Partial<ReceiptPayload> = {}): ReceiptPayload {
  return { v: 1, provider: key.id, seq: String(i), prev: GENESIS_PREV, ...syntheticReceiptBody(i), ...over } as ReceiptPayload;
}

/** Signs any value as a receipt payload, canonical unless `raw` text is given. */
export function signReceipt(key: TestKey, payload: unknown, raw?: string): DsseEnvelope {
  return signEnvelope(RECEIPT_PAYLOAD_TYPE, utf8(raw ?? canonicalize(payload)), { keyid: key.id, seed: key.seed });
}

export function ticketPayload(provider: string, over: Partial<TicketPayload> = {}): TicketPayload {
  const now = Date.now();
  return {
    v: 1,
    ticket_id: 'tkt-' + crypto.randomUUID(),
    request_id: 'req-' + crypto.randomUUID(),
    provider,
    account: 'acct-1',
    endpoint: 'chat/completions',
    model: 'tiny/llama',
    price_version: 'p1',
    max_cost_micro_usd: '5000',
    body_sha256: toHex(sha256(utf8('{"model":"tiny/llama"}'))),
    routing: { max_wait_ms: 1000 },
    issued_at: now - 1000,
    expires_at: now + 60_000,
    ...over,
  };
}

export function signTicket(market: TestKey, payload: unknown): DsseEnvelope {
  return signMarketTicket(payload as Record<string, unknown>, { keyid: market.id, seed: market.seed });
}
