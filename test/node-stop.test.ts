// Stopping a node: one shutdown however many times stop() is called, and the node is down after it.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { startTinyNode } from './helpers/node-config.ts';
import { pruneState } from '../src/node.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'node-stop-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('RunningNode.stop', () => {
  test('called twice at once and once more after: one shutdown, and the node is down', async () => {
    const node = await startTinyNode(path.join(dir, 'a'), { publicKey: '00'.repeat(32), context: 256, logLevel: 'fatal' });
    expect((await fetch(`${node.opsUrl}/healthz`)).status).toBe(200);
    const first = node.stop(1000);
    const second = node.stop(1000);
    expect(second).toBe(first);
    await first;
    await expect(node.stop(1000)).resolves.toBeUndefined();
    await expect(fetch(`${node.opsUrl}/healthz`)).rejects.toThrow();
  });
});

describe('stopping tells the market at once', () => {
  test('the market sees accepting: false as the stop begins, not a heartbeat interval later, and issues no more tickets to the node', async () => {
    const { createMarket } = await import('../src/market/market.ts');
    const { waitForListed } = await import('./helpers/wait.ts');
    const market = createMarket({ seed: new Uint8Array(32).fill(61), heartbeatIntervalMs: 60_000 });
    const url = (await market.listen()).url;
    const node = await startTinyNode(path.join(dir, 'announce'), { publicKey: market.publicKey, marketUrl: url, context: 256, logLevel: 'fatal' });
    try {
      await waitForListed(url, [node.providerId]);
      const listed = async () => ((await (await fetch(`${url}/v1/providers`)).json()) as { provider: string; accepting: boolean }[]).find((p) => p.provider === node.providerId);
      expect((await listed())?.accepting).toBe(true);
      await node.stop(2000);
      // The heartbeat interval is a minute: only the stop's own announcement can have said it.
      expect((await listed())?.accepting).toBe(false);
    } finally {
      await node.stop(1000);
      await market.close();
    }
  });
});

describe('pruneState (the node\'s state pruner, every minute)', () => {
  test('a step that fails is logged and the next still runs; nothing is thrown into the timer', () => {
    const warnings: { obj: object; msg?: string }[] = [];
    const ran: string[] = [];
    expect(() =>
      pruneState(
        [
          () => {
            throw new Error('database is locked');
          },
          () => ran.push('idempotency'),
        ],
        { warn: ((obj: object, msg?: string) => void warnings.push({ obj, msg })) as never },
      ),
    ).not.toThrow();
    expect(ran).toEqual(['idempotency']);
    expect(warnings).toEqual([{ obj: { err: 'database is locked' }, msg: 'state pruning failed; tried again in a minute' }]);
  });
});
