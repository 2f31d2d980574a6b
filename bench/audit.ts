// `seller-node audit` over a 100,000-receipt export, against the time raw verification of that many
// signatures takes on one core (100,000 ÷ raw verification rate).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { record } from './lib.ts';

const CLI = path.resolve(import.meta.dirname, '..', 'bin', 'seller-node.js');

export function benchAudit(n: number, rawVerifyRate: number): void {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-audit-'));
  const cli = (...args: string[]) => execFileSync(process.execPath, [CLI, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  cli('init', '--data', path.join(dir, 'node'));
  cli('log', 'fill', '--data', path.join(dir, 'node'), '--count', String(n));
  cli('log', 'export', '--data', path.join(dir, 'node'), '--out', path.join(dir, 'export'));
  const t0 = performance.now();
  const out = cli('audit', path.join(dir, 'export'));
  const seconds = (performance.now() - t0) / 1000;
  if (!out.includes('\nOK')) throw new Error(`audit did not pass:\n${out}`);
  fs.rmSync(dir, { recursive: true, force: true });
  const budget = n / rawVerifyRate;
  const ratio = seconds / budget;
  record({ name: `seller-node audit, ${n.toLocaleString('en-US')} receipts (wall, s)`, value: seconds, unit: 's', baseline: budget, ratio, target: '<= 1.3', pass: ratio <= 1.3 });
}
