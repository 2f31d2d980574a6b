// The layout of a node's data directory.
import path from 'node:path';
import { loadKeyFile, type NodeIdentity } from './identity.ts';
import { ReceiptLog, type ReceiptLogOptions } from './store/receipt-log.ts';

export interface DataDirPaths {
  dir: string;
  key: string;
  config: string;
  receipts: string;
}

export function dataDirPaths(dir: string): DataDirPaths {
  const abs = path.resolve(dir);
  return { dir: abs, key: path.join(abs, 'node.key'), config: path.join(abs, 'config.yaml'), receipts: path.join(abs, 'receipts.db') };
}

export function openReceiptLog(dir: string, opts: Partial<Omit<ReceiptLogOptions, 'path' | 'seed'>> = {}): { log: ReceiptLog; identity: NodeIdentity } {
  const p = dataDirPaths(dir);
  const identity = loadKeyFile(p.key);
  return { log: ReceiptLog.open({ ...opts, path: p.receipts, seed: identity.seed }), identity };
}
