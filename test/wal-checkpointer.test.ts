// state.db's WAL checkpoints run on a thread of their own (src/store/wal-checkpointer.ts), not on
// the connection that writes on the event loop: the writer's own checkpoint comes only past
// ~40 MiB of WAL, yet the WAL is copied into the database and started over as the writes go on.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { openStateDb } from '../src/store/state-db.ts';
import { FALLBACK_CHECKPOINT_PAGES, WalCheckpointer } from '../src/store/wal-checkpointer.ts';
import { until } from './helpers/wait.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wal-checkpointer-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const size = (f: string): number => (fs.existsSync(f) ? fs.statSync(f).size : 0);

describe('WalCheckpointer', () => {
  test('the writer never checkpoints on its own (the node runs its fallback, past FALLBACK_CHECKPOINT_PAGES, through the seal); the thread copies the WAL into the database, and the WAL starts over', async () => {
    const file = path.join(dir, 'state.db');
    const db = openStateDb(file);
    expect(db.pragma('wal_autocheckpoint', { simple: true })).toBe(0);
    expect(FALLBACK_CHECKPOINT_PAGES).toBe(10_000);
    db.exec('CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)');
    const insert = db.prepare('INSERT INTO t (v) VALUES (?)');
    const fill = (n: number) => db.transaction(() => { for (let i = 0; i < n; i++) insert.run(Buffer.alloc(1000, i)); })();
    fill(2000); // ~2 MB, ~500 pages: far below the fallback
    const base = size(file);
    const wal = size(`${file}-wal`);
    expect(wal).toBeGreaterThan(1_000_000); // (all of it in the WAL: nothing checkpointed it)
    const errors: string[] = [];
    const cp = new WalCheckpointer(file, { intervalMs: 20, onError: (m) => errors.push(m) });
    try {
      await until('the thread to copy the WAL into the database', () => size(file) > base + 1_000_000, 10_000);
      // Once all of it is copied, the writer starts the WAL over: more writes do not grow it past what it was.
      for (let round = 0; round < 3; round++) {
        await new Promise((r) => setTimeout(r, 100));
        fill(2000);
      }
      expect(size(`${file}-wal`)).toBeLessThan(wal * 2);
      expect(db.prepare('SELECT count(*) AS n FROM t').get()).toEqual({ n: 8000 });
      expect(errors).toEqual([]);
    } finally {
      await cp.close();
      db.close();
    }
  });

  test('a file that is not there: said once (not once a tick), and close() still ends the thread', async () => {
    const errors: string[] = [];
    const cp = new WalCheckpointer(path.join(dir, 'missing', 'state.db'), { intervalMs: 10, onError: (m) => errors.push(m) });
    await until('the failure to be said', () => errors.length > 0, 5000);
    await new Promise((r) => setTimeout(r, 100));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/unable to open database file|directory does not exist/);
    await cp.close();
    await cp.close(); // (twice: the same)
  });

  test('close() resolves when the thread has already ended, and when its error reports cross the close', async () => {
    const dead = new WalCheckpointer(path.join(dir, 'missing', 'state.db'), { intervalMs: 10_000 });
    await (dead as unknown as { worker: { terminate(): Promise<number> } }).worker.terminate(); // (it died)
    await dead.close();
    for (let i = 0; i < 10; i++) {
      let errors = 0;
      const cp = new WalCheckpointer(path.join(dir, 'missing', `state-${i}.db`), { intervalMs: 1, onError: () => void errors++ });
      await until('its first error', () => errors > 0, 5000);
      await cp.close();
    }
  });
});
