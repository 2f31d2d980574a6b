// A data dir nearly full: a receipt that cannot be written after the work ran left the buyer with a
// 502 and the node stopped (h3 of session 17). Below receipts.min_free_mb the node takes no paid
// work: refused 503 no_capacity before the ticket is used, /readyz says why, one error line.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { lowDisk, type RunningNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { askNode, logLines } from './helpers/paid-ask.ts';
import { testKey } from './helpers/receipts.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-disk-space-'));
const market = testKey();
let node: RunningNode | undefined;
afterAll(async () => {
  await node?.stop(1000);
  fs.rmSync(home, { recursive: true, force: true });
});

describe('lowDisk', () => {
  test('names the free space and the setting below it; 0 turns it off; a folder that cannot be asked is no answer', () => {
    expect(lowDisk(home, 0)).toBeUndefined();
    expect(lowDisk(home, 1)).toBeUndefined(); // (this machine has a MiB free)
    expect(lowDisk(home, 2 ** 30)).toMatch(/^the data dir's file system has \d+ MiB free, less than receipts\.min_free_mb \(1073741824 MiB\)$/);
    expect(lowDisk(path.join(home, 'no', 'such', 'dir'), 2 ** 30)).toBeUndefined();
  });
});

test('a node whose data dir has less free space than receipts.min_free_mb refuses paid work before the ticket is used, and says why', async () => {
  const logFile = path.join(home, 'node.log');
  const fd = fs.openSync(logFile, 'w');
  const buyer = await createHost({ seed: new Uint8Array(32).fill(3), listen: [] });
  try {
    node = await startTinyNode(home, { publicKey: market.id, receipts: '{ signer_threads: 1, min_free_mb: 1073741824 }' }, { logDestination: fd });
    const ready = await fetch(`${node.opsUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { reasons: string[] }).reasons).toContainEqual(expect.stringMatching(/^the data dir's file system has \d+ MiB free, less than receipts\.min_free_mb/));
    const r = await askNode(buyer, node, market);
    expect(r.head.status).toBe(503);
    expect((r.trailer as { error: { code: string; message: string } }).error).toMatchObject({ code: 'no_capacity', message: expect.stringMatching(/MiB free, less than receipts\.min_free_mb .*; another provider can take it$/) });
    expect(logLines(logFile, 50).map((e) => e.msg)).toContainEqual(expect.stringMatching(/MiB free, less than receipts\.min_free_mb \(1073741824 MiB\): paid work is refused until space is freed$/));
  } finally {
    await buyer.stop();
    await node?.stop(1000);
    node = undefined;
    fs.closeSync(fd);
  }
}, 60_000);
