// Signed price lists in test exports: the list synthetic receipts cite, written where `log export`
// puts it, and logs built with it (buildLog's exports carry no price lists of their own).
import fs from 'node:fs';
import path from 'node:path';
import { serializeEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { computeCost } from '../../attestation/money.ts';
import type { PriceListPayload } from '../../attestation/price-list.ts';
import { ratesFromWire, type ReceiptBody, type WireRates } from '../../attestation/receipt.ts';
import { readPriceLists, savePriceList } from '../../src/data-dir.ts';
import { exportLog } from '../../src/store/export.ts';
import { ReceiptLog } from '../../src/store/receipt-log.ts';
import { syntheticPriceList, syntheticReceiptBody } from '../../src/store/synthetic.ts';
import { buildLog, randomSeed, providerIdOf, readReceiptLines, tempDir, type BuiltLog } from './tamper-log.ts';

/** Writes `prices/<name>.json` (name: the list's own version unless given) into an export. */
export function writePriceFile(exportDir: string, list: { payload: PriceListPayload; envelope: DsseEnvelope }, name = list.payload.version): string {
  const file = path.join(exportDir, 'prices', `${name}.json`);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, serializeEnvelope(list.envelope) + '\n');
  return file;
}

/** buildLog, with the signed price list its synthetic receipts cite in the export. */
export async function buildPricedLog(opts: Parameters<typeof buildLog>[0] = {}): Promise<BuiltLog & { priceVersion: string; priceFile: string }> {
  const b = await buildLog(opts);
  const list = syntheticPriceList(b.seed, b.providerId);
  return { ...b, priceVersion: list.payload.version, priceFile: writePriceFile(b.exportDir, list) };
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

export interface PricedExport {
  root: string;
  exportDir: string;
  seed: Uint8Array;
  providerId: string;
  priceVersion: string;
  lines: string[];
}

/**
 * A node's data dir as `log fill` leaves it (the synthetic price list kept in prices/), whose log
 * holds `body(i)` for i < count, signed and chained by the real receipt log, exported with the
 * data dir's price lists as `log export` does.
 */
export async function buildExport(count: number, body: (i: number) => ReceiptBody = syntheticReceiptBody): Promise<PricedExport> {
  const root = tempDir();
  const seed = randomSeed();
  const providerId = providerIdOf(seed);
  const list = syntheticPriceList(seed, providerId);
  savePriceList(root, list);
  const log = ReceiptLog.open({ path: path.join(root, 'receipts.db'), seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 10 });
  const exportDir = path.join(root, 'export');
  try {
    for (let i = 0; i < count; i++) await log.append(body(i));
    await exportLog(log, exportDir, { priceLists: readPriceLists(root) });
  } finally {
    await log.close();
  }
  return { root, exportDir, seed, providerId, priceVersion: list.payload.version, lines: readReceiptLines(exportDir) };
}
