// The layout of a node's data directory.
//   node.key, config.yaml, receipts.db, state.db
//   prices/<version>.json   every signed price list the node has used (a DSSE envelope, as signed)
import fs from 'node:fs';
import { writeAllSync, writeFileAtomic } from './atomic-file.ts';
import path from 'node:path';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { isPriceVersion, verifyPriceList, type PriceListPayload } from '../attestation/price-list.ts';
import { loadKeyFile, type NodeIdentity } from './identity.ts';
import { ReceiptLog, type ReceiptLogOptions } from './store/receipt-log.ts';
import { makeFolder } from './make-folder.ts';
import { readTextFile } from './read-text-file.ts';

export interface DataDirPaths {
  dir: string;
  key: string;
  config: string;
  receipts: string;
  prices: string;
}

export function dataDirPaths(dir: string): DataDirPaths {
  const abs = path.resolve(dir);
  return { dir: abs, key: path.join(abs, 'node.key'), config: path.join(abs, 'config.yaml'), receipts: path.join(abs, 'receipts.db'), prices: path.join(abs, 'prices') };
}

export function openReceiptLog(dir: string, opts: Partial<Omit<ReceiptLogOptions, 'path' | 'seed'>> = {}, keyFile?: string): { log: ReceiptLog; identity: NodeIdentity } {
  const p = dataDirPaths(dir);
  const identity = loadKeyFile(keyFile ?? p.key);
  const onNotice = opts.onNotice ?? ((m: string, level: 'warn' | 'error') => void process.stderr.write(`seller-node: ${level === 'error' ? 'error' : 'warning'}: ${m}\n`));
  return { log: ReceiptLog.open({ ...opts, onNotice, path: p.receipts, seed: identity.seed }), identity };
}

export class PriceListConflictError extends Error {
  override name = 'PriceListConflictError';
}

/** A price list as kept in the data dir: its version and the exact file text. */
export interface StoredPriceList {
  version: string;
  text: string;
}

/**
 * Keeps a signed price list in `<dir>/prices/<version>.json` before any receipt cites its version,
 * so that an export can carry every list its receipts cite. A version is derived from the prices
 * (priceVersion), so a list already kept for this version by this provider holds the same prices
 * (only issued_at differs): it is kept, never rewritten. A file there that is not such a list
 * (another key's, another version's, corrupted) throws PriceListConflictError: receipts may already cite
 * that version, and an auditor must see what they were priced against. New files are written
 * atomically (temporary file, fsync, rename), mode 0644.
 */
export function savePriceList(dir: string, list: { payload: PriceListPayload; envelope: DsseEnvelope }): 'saved' | 'kept' {
  const { version, provider } = list.payload;
  const folder = dataDirPaths(dir).prices;
  const file = path.join(folder, `${version}.json`);
  const existing = readIfExists(file);
  if (existing !== undefined) {
    const v = verifyPriceList(existing, { provider });
    // (A verified list of this version holds these prices: the version is derived from them.)
    const why = !v.ok ? `${v.error.code}: ${v.error.message}` : v.value.version !== version ? `it is the list of version ${v.value.version}` : undefined;
    if (why === undefined) return 'kept';
    throw new PriceListConflictError(`${file} is not this node's price list of version ${version} (${why}); receipts may already cite that version, so it is never replaced: restore the file this node wrote there`);
  }
  makeFolder(folder);
  // 0644: readable by whoever exports or audits, whatever the umask.
  writeFileAtomic(file, (fd) => writeAllSync(fd, serializeEnvelope(list.envelope) + '\n'), 0o644);
  syncDir(folder); // the rename itself durable before a receipt cites the version
  return 'saved';
}

/** The text of `prices/<version>.json` (a signed price list), or undefined when there is none. */
export function readPriceList(dir: string, version: string): string | undefined {
  if (!isPriceVersion(version)) return undefined;
  return readIfExists(path.join(dataDirPaths(dir).prices, `${version}.json`));
}

/** Every `prices/<version>.json` of a data dir, by version (none for a dir without prices/). */
export function readPriceLists(dir: string): StoredPriceList[] {
  const folder = dataDirPaths(dir).prices;
  if (!fs.existsSync(folder)) return [];
  return fs
    .readdirSync(folder)
    .filter((n) => n.endsWith('.json') && !n.startsWith('.'))
    .sort()
    .map((n) => ({ version: n.slice(0, -'.json'.length), text: readTextFile(path.join(folder, n)) }));
}

function readIfExists(file: string): string | undefined {
  try {
    return readTextFile(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

/** fsync of a folder (its entries), where the platform allows one (Windows cannot open a folder). */
function syncDir(dir: string): void {
  let fd: number;
  try {
    fd = fs.openSync(dir, 'r');
  } catch (e) {
    if (['EISDIR', 'EPERM', 'EACCES'].includes((e as NodeJS.ErrnoException).code ?? '')) return;
    throw e;
  }
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}
