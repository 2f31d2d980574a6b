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
