// Synthetic but well-formed receipt bodies, for `seller-node log fill`, tests and benchmarks.
// Deterministic for a given index, so two fills of the same log produce the same bytes. They cite
// the price version of SYNTHETIC_PRICE_LIST, whose signed list (syntheticPriceList) a data dir
// must keep for its export to audit clean. isSyntheticReceiptLine tells such a receipt from a real one.
import { fromBase64, fromUtf8, toHex } from '../../attestation/bytes.ts';
import { sha256Hex, sha256Text } from '../../attestation/hash.ts';
import { computeCost } from '../../attestation/money.ts';
import { priceVersion, signPriceList, type PriceListEntry } from '../../attestation/price-list.ts';
import { buildReceiptPayload, receiptPayloadJson, type ReceiptBody, type ReceiptStatus } from '../../attestation/receipt.ts';

const MODEL = 'synthetic/tiny-llama';
export const SYNTHETIC_PRICE_LIST: readonly PriceListEntry[] = [{ model: MODEL, input_per_mtok: '150000', output_per_mtok: '600000' }];
const SYNTHETIC_PRICE = { version: priceVersion(SYNTHETIC_PRICE_LIST), rates: { input_per_mtok: '150000', output_per_mtok: '600000' } };
/** Fixed, so that the list is signed to the same bytes every time (Ed25519 is deterministic). */
const SYNTHETIC_ISSUED_AT = 1_767_225_600_000;

/** The signed price list synthetic receipts cite, by the key that signs them. */
export function syntheticPriceList(seed: Uint8Array, provider: string): ReturnType<typeof signPriceList> {
  return signPriceList(seed, provider, SYNTHETIC_PRICE_LIST, SYNTHETIC_ISSUED_AT);
}

const MODEL_SHA = sha256Hex('synthetic model');
const STATUSES: ReceiptStatus[] = ['completed', 'completed', 'completed', 'completed', 'completed', 'completed', 'cancelled', 'failed'];

export function syntheticReceiptBody(i: number, now = 1_767_225_600_000 + i * 250): ReceiptBody {
  const h = sha256Text(`synthetic ${i}`);
  const input = 16 + (h[0]! << 2);
  const status = STATUSES[h[1]! & 7]!;
  const output = status === 'failed' ? 0 : 1 + (h[2]! << 1);
  const usage = { input_tokens: input, output_tokens: output };
  const rates = { input_per_mtok: 150_000n, output_per_mtok: 600_000n };
  const cost = computeCost(usage, rates);
  const hold = cost + BigInt(h[3]! * 10);
  return {
    request_id: `req-${toHex(h.subarray(4, 16))}`,
    ticket_id: `tkt-${toHex(h.subarray(16, 28))}`,
    endpoint: 'chat/completions',
    model: MODEL,
    model_sha256: MODEL_SHA,
    runtime: { adapter: 'synthetic', version: '1' },
    quantization: 'f32',
    status,
    started_at: now,
    first_token_at: output > 0 ? now + 5 : null,
    finished_at: now + 5 + output,
    usage,
    usage_runtime: { prompt_tokens: input, completion_tokens: output },
    price: SYNTHETIC_PRICE,
    cost_micro_usd: cost.toString(),
    hold_micro_usd: hold.toString(),
    request_sha256: sha256Hex(`request ${i}`),
    response_sha256: sha256Hex(`response ${i}`),
    attestation: { tier: 'T1', evidence_sha256: null },
  };
}

/**
 * Whether a logged receipt (its envelope line) is exactly what `seller-node log fill` writes at its
 * seq: the payload, byte for byte, of syntheticReceiptBody(seq) chained at that seq. A real receipt
 * never matches (its request id, hashes and times are not these), whatever its model is called.
 */
export function isSyntheticReceiptLine(line: string): boolean {
  try {
    const env = JSON.parse(line) as { payload?: unknown };
    const bytes = typeof env?.payload === 'string' ? fromBase64(env.payload) : undefined;
    const json = bytes && fromUtf8(bytes);
    if (json === undefined) return false;
    const p = JSON.parse(json) as { provider?: unknown; seq?: unknown; prev?: unknown };
    if (typeof p.provider !== 'string' || typeof p.prev !== 'string' || typeof p.seq !== 'string' || !/^(0|[1-9][0-9]{0,14})$/.test(p.seq)) return false;
    return receiptPayloadJson(buildReceiptPayload(p.provider, p.seq, p.prev, syntheticReceiptBody(Number(p.seq)))) === json;
  } catch {
    return false;
  }
}
