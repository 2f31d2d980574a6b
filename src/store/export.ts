// Log export for auditors (design.md §Transparency log): a folder anyone can check offline.
//   receipts.jsonl     one canonical envelope a line, in seq order
//   checkpoint         the latest signed checkpoint (C2SP signed note)
//   checkpoints/<size> every checkpoint, the latest included
//   provider.pub       the provider's Ed25519 public key, hex (= provider id)
//   prices/<version>.json  the provider's signed price lists (from the data dir), which the audit
//                      checks every receipt's price against
import fs from 'node:fs';
import { writeAllSync, writeFileAtomic } from '../atomic-file.ts';
import path from 'node:path';
import type { StoredPriceList } from '../data-dir.ts';
import type { ReceiptLog } from './receipt-log.ts';
import { peekLine } from '../../attestation/signed-payload.ts';
import { makeFolder } from '../make-folder.ts';

export interface ExportSummary {
  receipts: number;
  checkpoints: number;
  latestCheckpointSize: number;
  priceLists: number;
  /** Price versions the receipts cite with no signed list among `priceLists`: the audit cannot price those receipts. */
  missingPriceVersions: string[];
}

/** Runs a write of `file`; an error that does not say which file (a write on a descriptor) is told it. */
function writing<T>(file: string, run: () => T): T {
  try {
    return run();
  } catch (e) {
    if (e !== null && typeof e === 'object' && (e as { path?: unknown }).path === undefined) (e as { path?: string }).path = file;
    throw e;
  }
}

/**
 * Writes the export of `log` into `outDir`. `priceLists` (readPriceLists of the data dir) are the
 * signed lists of every version the receipts cite: without them the export does not audit.
 */
export async function exportLog(log: ReceiptLog, outDir: string, priceLists: readonly StoredPriceList[]): Promise<ExportSummary> {
  await log.flush();
  log.checkpoint(); // the export's latest checkpoint covers every receipt in it
  const cpDir = path.join(outDir, 'checkpoints');
  makeFolder(cpDir);
  // An earlier export into the same folder must not leave checkpoints of another log behind.
  for (const name of fs.readdirSync(cpDir)) if (/^(0|[1-9][0-9]*)$/.test(name)) fs.rmSync(path.join(cpDir, name));
  let receipts = 0;
  const receiptsFile = path.join(outDir, 'receipts.jsonl');
  const cited = new Set<string>();
  writeFileAtomic(receiptsFile, (fd) => {
    let buf: string[] = [];
    for (const line of log.lines()) {
      buf.push(line);
      receipts++;
      const version = priceVersionOf(line);
      if (version !== undefined) cited.add(version);
      if (buf.length === 1024) {
        writeAllSync(fd, buf.join('\n') + '\n');
        buf = [];
      }
    }
    if (buf.length) writeAllSync(fd, buf.join('\n') + '\n');
  });
  const cps = log.checkpoints(); // (each over receipts this connection read: all of them are in the file)
  const write = (file: string, text: string) => writing(file, () => fs.writeFileSync(file, text));
  for (const cp of cps) write(path.join(outDir, 'checkpoints', String(cp.size)), cp.note);
  const latest = cps.at(-1);
  if (latest) write(path.join(outDir, 'checkpoint'), latest.note);
  else fs.rmSync(path.join(outDir, 'checkpoint'), { force: true });
  write(path.join(outDir, 'provider.pub'), log.providerId + '\n');
  const pricesDir = path.join(outDir, 'prices');
  makeFolder(pricesDir);
  // Nor its price lists: the audit checks every list in the folder.
  for (const name of fs.readdirSync(pricesDir)) if (name.endsWith('.json')) fs.rmSync(path.join(pricesDir, name));
  for (const l of priceLists) write(path.join(pricesDir, `${l.version}.json`), l.text);
  const held = new Set(priceLists.map((l) => l.version));
  return { receipts, checkpoints: cps.length, latestCheckpointSize: latest?.size ?? 0, priceLists: priceLists.length, missingPriceVersions: [...cited].filter((v) => !held.has(v)).sort() };
}

/** The price version a log line's receipt cites (read only to warn; the audit checks it for real). */
function priceVersionOf(line: string): string | undefined {
  const price = peekLine(line)?.price;
  const version = price !== null && typeof price === 'object' ? (price as { version?: unknown }).version : undefined;
  return typeof version === 'string' ? version : undefined;
}
