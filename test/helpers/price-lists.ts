// Signed price lists in test exports: a list written where `log export` puts it (to tamper with),
// and receipts re-priced as a node that ignores its list would sign them.
import fs from 'node:fs';
import path from 'node:path';
import { serializeEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { computeCost } from '../../attestation/money.ts';
import type { PriceListPayload } from '../../attestation/price-list.ts';
import { ratesFromWire, type ReceiptBody, type WireRates } from '../../attestation/receipt.ts';

/** Writes `prices/<name>.json` (name: the list's own version unless given) into an export. */
export function writePriceFile(exportDir: string, list: { payload: PriceListPayload; envelope: DsseEnvelope }, name = list.payload.version): string {
  const file = path.join(exportDir, 'prices', `${name}.json`);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, serializeEnvelope(list.envelope) + '\n');
  return file;
}

/**
 * A synthetic receipt re-priced as a node that ignores its price list would sign it: these rates
 * (and this version, if given), the cost computed at them, the hold raised to cover it. Everything
 * else about it verifies.
 */
export function repriced(body: ReceiptBody, rates: WireRates, version = body.price.version): ReceiptBody {
  const cost = computeCost(body.usage, ratesFromWire(rates));
  const hold = BigInt(body.hold_micro_usd) > cost ? BigInt(body.hold_micro_usd) : cost;
  return { ...body, price: { version, rates }, cost_micro_usd: cost.toString(), hold_micro_usd: hold.toString() };
}
