// state.db (used tickets, Idempotency-Key records) deleted while the node runs: SQLite goes on
// writing into the deleted file, and at the next start the records are gone (a retry under an
// Idempotency-Key was run and billed twice). The node notices within 5 s, copies what it still
// reads beside it, and refuses paid work until a restart; a state.db missing at start beside a
// receipt log that has receipts is said at error level.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, expect, test } from 'vitest';
import { parseConfig } from '../src/config.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { startTinyNode, tinyNodeConfigYaml } from './helpers/node-config.ts';
import { askNode, logLines } from './helpers/paid-ask.ts';
import { testKey } from './helpers/receipts.ts';
import { waitFor } from './helpers/wait.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-state-file-'));
const market = testKey();
let node: RunningNode | undefined;
afterAll(async () => {
  await node?.stop(1000);
  fs.rmSync(home, { recursive: true, force: true });
});

test('deleted while running: within 5 s paid work is refused (503 no_capacity, before the ticket is used), /readyz says why, its records are copied out; a restart without it says so', async () => {
  const logFile = path.join(home, 'node.log');
  const fd = fs.openSync(logFile, 'w');
  const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  try {
    node = await startTinyNode(home, { publicKey: market.id }, { logDestination: fd });
    const ask = (key?: string) => askNode(buyer, node!, market, key ? { idempotencyKey: key } : {});
    expect((await ask('retry-me')).head.status).toBe(200);
    const state = path.join(home, 'data', 'state.db');
    for (const x of ['', '-wal', '-shm']) fs.rmSync(state + x, { force: true });
    const ready = await waitFor('the node to say it takes no work', async () => {
      const r = await fetch(`${node!.opsUrl}/readyz`);
      return r.status === 503 ? ((await r.json()) as { reasons: string[] }) : undefined;
    }, 15_000, 200);
    expect(ready.reasons.join(' ')).toMatch(/state file .*state\.db was deleted or replaced while the node used it: paid requests are refused until a restart\. Its used tickets and Idempotency-Key records were copied to .*state\.rescued-\d+\.db/);
    const refused = await ask();
    expect([refused.head.status, (refused.trailer as { error?: { code?: string } }).error?.code]).toEqual([503, 'no_capacity']);
    const rescued = fs.readdirSync(path.join(home, 'data')).filter((f) => /^state\.rescued-\d+\.db$/.test(f));
    expect(rescued).toHaveLength(1);
    expect(fs.statSync(path.join(home, 'data', rescued[0]!)).mode & 0o777).toBe(0o600);
    // The copy holds the Idempotency-Key record of the request before the deletion.
    const copy = new Database(path.join(home, 'data', rescued[0]!), { readonly: true });
    try {
      const tables = copy.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[];
      const counts = tables.map((t) => (copy.prepare(`SELECT count(*) AS n FROM "${t.name}"`).get() as { n: number }).n);
      expect(counts.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    } finally {
      copy.close();
    }
    expect(logLines(logFile, 50).map((l) => l.msg)).toContainEqual(expect.stringMatching(/^state file .*state\.db was deleted or replaced while the node used it/));
    await node.stop(1000);
    node = undefined;
    // Started again without it (the copy not put back): one error line says what was lost.
    const logFile2 = path.join(home, 'node2.log');
    const fd2 = fs.openSync(logFile2, 'w');
    try {
      node = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: market.id }), home), { logDestination: fd2 });
      expect(logLines(logFile2, 50).map((l) => l.msg)).toContainEqual(expect.stringMatching(/state\.db was not there and has been created anew, though the receipt log holds 1 receipts: the used tickets and Idempotency-Key records it kept are gone/));
    } finally {
      await node?.stop(1000);
      node = undefined;
      fs.closeSync(fd2);
    }
  } finally {
    await buyer.stop();
    fs.closeSync(fd);
  }
}, 60_000);
