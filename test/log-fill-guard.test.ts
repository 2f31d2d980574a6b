// `seller-node log fill` signs synthetic receipts with the node's own key into a chain that can
// never be cut: it fills only a log that holds nothing else (a fresh one, or one fill started).
// The CLI runs in child processes: `npm run build` first.
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createKeyFile, loadKeyFile } from '../src/identity.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { isSyntheticReceiptLine, syntheticReceiptBody } from '../src/store/synthetic.ts';
import { assertCliBuilt, runCli, STACK_TRACE } from './helpers/cli-run.ts';
import { randomSeed, removeTemp, tempDir } from './helpers/tamper-log.ts';

const dir = tempDir('seller-node-fill-guard-');
afterAll(() => removeTemp(dir));
beforeAll(assertCliBuilt);

/** A receipt a node could have signed: well-formed, but not what fill writes. */
const realBody = (i: number) => ({ ...syntheticReceiptBody(i), request_id: `chatcmpl-real-${i}` });

function home(name: string): string {
  const h = path.join(dir, name);
  fs.mkdirSync(h, { recursive: true });
  createKeyFile(path.join(h, 'node.key'));
  return h;
}

function openLog(h: string): ReceiptLog {
  return ReceiptLog.open({ path: path.join(h, 'receipts.db'), seed: loadKeyFile(path.join(h, 'node.key')).seed, threads: 0, checkpointIntervalMs: 0 });
}

async function sizeOf(h: string): Promise<number> {
  const log = openLog(h);
  const n = log.size;
  await log.close();
  return n;
}

const fill = (h: string, count: number) => runCli(['log', 'fill', '--data', h, '--count', String(count), '--threads', '0']);

function expectRefused(r: Awaited<ReturnType<typeof fill>>, h: string, seq: number): void {
  expect(r.code, r.stderr).toBe(1);
  expect(r.stdout).toBe('');
  expect(r.stderr).toBe(
    `seller-node: ${h}'s receipt log holds real receipts (seq ${seq} is not synthetic); log fill appends synthetic receipts signed with this node's key, which can never be removed: use a fresh data dir (seller-node init --data DIR)\n`,
  );
  expect(r.stderr).not.toMatch(STACK_TRACE);
}

describe('which receipts are synthetic', () => {
  test('exactly what fill writes at that seq, nothing else', async () => {
    const log = ReceiptLog.open({ path: path.join(dir, 'unit.db'), seed: randomSeed(), threads: 0, checkpointIntervalMs: 0 });
    try {
      const lines = [];
      for (const body of [syntheticReceiptBody(0), syntheticReceiptBody(1), syntheticReceiptBody(5), realBody(3), { ...syntheticReceiptBody(4), finished_at: syntheticReceiptBody(4).finished_at + 1 }]) {
        lines.push((await log.append(body)).line);
      }
      // seq 0 and 1 as fill writes them; fill's body of index 5 at seq 2; a real request id; another time.
      expect(lines.map(isSyntheticReceiptLine)).toEqual([true, true, false, false, false]);
      expect(isSyntheticReceiptLine('not json')).toBe(false);
      expect(isSyntheticReceiptLine('{"payload":"%%%"}')).toBe(false);
    } finally {
      await log.close();
    }
  });
});

describe('log fill', () => {
  test('refuses a log whose seq 0 is a real receipt, and appends nothing', async () => {
    const h = home('real');
    const log = openLog(h);
    await Promise.all([0, 1, 2].map((i) => log.append(realBody(i))));
    await log.close();
    expectRefused(await fill(h, 5), h, 0);
    expect(await sizeOf(h)).toBe(3);
    expect(fs.existsSync(path.join(h, 'prices'))).toBe(false); // nor the synthetic price list
  });

  test('refuses a log fill started once a real receipt follows (the last seq is checked)', async () => {
    const h = home('mixed');
    const first = await fill(h, 4);
    expect(first.code, first.stderr).toBe(0);
    const log = openLog(h);
    await log.append(realBody(4));
    await log.close();
    expectRefused(await fill(h, 2), h, 4);
    expect(await sizeOf(h)).toBe(5);
  });

  test('fills a fresh data dir, and again the log it filled', async () => {
    const h = home('fresh');
    const a = await fill(h, 4);
    expect(a.code, a.stderr).toBe(0);
    expect(a.stdout).toMatch(/^appended 4 receipts \(seq 0\.\.3\) in [0-9.]+ s; log size 4\n$/);
    const b = await fill(h, 3);
    expect(b.code, b.stderr).toBe(0);
    expect(b.stdout).toMatch(/^appended 3 receipts \(seq 4\.\.6\) in [0-9.]+ s; log size 7\n$/);
    expect(await sizeOf(h)).toBe(7);
  });

  test('fills an empty log another tool opened (no receipts yet)', async () => {
    const h = home('empty-log');
    await openLog(h).close();
    const r = await fill(h, 2);
    expect(r.code, r.stderr).toBe(0);
    expect(await sizeOf(h)).toBe(2);
  });
});
