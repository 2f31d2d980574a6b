// A serving node whose data files are changed in place by another program (the same inode:
// `truncate -s 0 receipts.db-wal`, an older state.db copied over the live one): the node notices
// before SQLite checkpoints what is left into its files, stops taking paid work (503 no_capacity,
// /readyz 503 saying why, /healthz 503 and seller_receipt_log_stopped 1 for the receipt log), says so
// in one error line naming the copy it made of what it still holds, and serves on otherwise.
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { verifyLog } from '../attestation/log-verify.ts';
import type { RunningNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { loadKeyFile } from '../src/identity.ts';
import { CloseGuard } from '../src/store/close-guard.ts';
import { startTinyNode, tinyNodeConfigYaml } from './helpers/node-config.ts';
import { parseConfig } from '../src/config.ts';
import { startNode } from '../src/node.ts';
import { askNode, logLines } from './helpers/paid-ask.ts';
import { captureNodeWatches } from './helpers/node-watch.ts';
import { openFilesUnder } from './helpers/open-files.ts';
import { testKey } from './helpers/receipts.ts';
import { until } from './helpers/wait.ts';

const dirs: string[] = [];
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  for (const c of cleanups.splice(0).reverse()) await c();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

const STOPPED = 'the receipt log has stopped, and paid work is refused until the node is restarted: ';
const gauge = async (node: RunningNode) => /^seller_receipt_log_stopped (\d+)$/m.exec(await (await fetch(`${node.opsUrl}/metrics`)).text())?.[1];

async function serving(): Promise<{ home: string; data: string; logFile: string; node: RunningNode; ask: () => ReturnType<typeof askNode>; watches: (() => void)[] }> {
  const watches = captureNodeWatches(); // (the node's 5 s file watch, run when the test wants it)
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-files-changed-'));
  dirs.push(home);
  const logFile = path.join(home, 'node.log');
  const fd = fs.openSync(logFile, 'w');
  cleanups.push(() => fs.closeSync(fd));
  const market = testKey();
  const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  cleanups.push(() => buyer.stop());
  const node = await startTinyNode(home, { publicKey: market.id, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 0, min_free_mb: 0 }' }, { logDestination: fd });
  cleanups.push(() => node.stop(1000));
  return { home, data: path.join(home, 'data'), logFile, node, ask: () => askNode(buyer, node, market), watches };
}

describe('a serving node whose files are changed in place', () => {
  test('receipts.db-wal cut short: the next receipt is not committed, the log stops, one error line names the copy holding every durable receipt, the metric and /readyz say so, and the node serves on', async () => {
    const { home, data, logFile, node, ask } = await serving();
    expect(await gauge(node)).toBe('0');
    expect((await fetch(`${node.opsUrl}/readyz`)).status).toBe(200);
    for (let i = 0; i < 3; i++) expect((await ask()).head.status).toBe(200);

    execFileSync('truncate', ['-s', '0', path.join(data, 'receipts.db-wal')]);
    const cut = await ask(); // (its work is done; its receipt is refused, not committed into the cut files)
    expect((cut.trailer as { receipt?: unknown }).receipt).toBeUndefined();
    await until('the stop line', () => logLines(logFile, 50).some((l) => l.msg.startsWith(STOPPED)));

    expect(await gauge(node)).toBe('1');
    const ready = await fetch(`${node.opsUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { reasons: string[] }).reasons).toContainEqual(expect.stringMatching(/^the receipt log has stopped \(receipt log file .*receipts\.db-wal was cut short in place \(it is 0 bytes; /));
    expect((await fetch(`${node.opsUrl}/healthz`)).status).toBe(503);
    const refused = await ask();
    expect([refused.head.status, (refused.trailer as { error?: { code?: string } }).error?.code]).toEqual([503, 'no_capacity']);
    const status = (await (await fetch(`${node.opsUrl}/status`)).json()) as { accepting: boolean; uptime_s: number };
    expect(status.accepting).toBe(false); // (the node itself answers on)

    const stops = logLines(logFile, 50).filter((l) => l.msg.startsWith(STOPPED));
    expect(stops).toHaveLength(1);
    const copy = /were copied to (\S+): stop the node, move that file to (\S+), remove /.exec(stops[0]!.msg);
    expect(copy, stops[0]!.msg).not.toBeNull();
    expect(stops[0]!.msg).toContain('Its 3 durable receipts (each checked against the log\'s Merkle tree) were copied to');
    cleanups.pop();
    await node.stop(1000);
    expect(logLines(logFile, 50).filter((l) => l.msg.startsWith(STOPPED))).toHaveLength(1); // (the stop adds none)

    // As the line says: the copy in place, the -wal and -shm gone; the log opens whole (receipts.head vouches for 3).
    for (const x of ['', '-wal', '-shm']) fs.rmSync(path.join(data, `receipts.db${x}`), { force: true });
    fs.renameSync(copy![1]!, copy![2]!);
    const log = ReceiptLog.open({ path: copy![2]!, seed: loadKeyFile(path.join(home, 'node.key')).seed, threads: 0 });
    try {
      expect(log.size).toBe(3);
      expect(verifyLog({ provider: log.providerId, receipts: [...log.lines()], checkpoints: log.checkpoints().map((c) => c.note) })).toMatchObject({ ok: true });
    } finally {
      await log.close();
    }
  }, 60_000);

  test('an older state.db copied over the live one: paid requests are refused at the next file check, one error line names the copy, /readyz says why; the receipt log goes on', async () => {
    const { home, data, logFile, node, ask, watches } = await serving();
    expect(watches).toHaveLength(1);
    expect((await ask()).head.status).toBe(200);
    const older = path.join(home, 'state-older.db');
    const snap = new Database(path.join(data, 'state.db'), { readonly: true });
    await snap.backup(older); // (a backup taken the proper way, now)
    snap.close();
    expect((await ask()).head.status).toBe(200);

    execFileSync('cp', [older, path.join(data, 'state.db')]);
    watches[0]!(); // the node's file check
    const refused = await ask();
    expect([refused.head.status, (refused.trailer as { error?: { code?: string } }).error?.code]).toEqual([503, 'no_capacity']);
    const ready = await fetch(`${node.opsUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { reasons: string[] }).reasons).toContainEqual(expect.stringMatching(/^state file .*state\.db was written over in place \(.*\) while the node used it \(something other than the node changed it, .*\): paid requests are refused until a restart\. Its used tickets and Idempotency-Key records .*were copied to .*state\.rescued-\d+\.db: stop the node, move that file to /));
    await until('its error line', () => logLines(logFile, 50).some((l) => l.msg.startsWith('state file ')));
    watches[0]!();
    expect(logLines(logFile, 50).filter((l) => l.msg.startsWith('state file '))).toHaveLength(1);
    expect(fs.readdirSync(data).filter((f) => /^state\.rescued-\d+\.db$/.test(f))).toHaveLength(1);
    expect(await gauge(node)).toBe('0'); // (the receipt log has not stopped: its own gauge)
    expect((await fetch(`${node.opsUrl}/healthz`)).status).toBe(200);
    // Stopped, the node leaves the files as it found them: its close checkpoints nothing into the
    // older copy and its -wal stays (close-guard.ts).
    const sha = (f: string) => crypto.createHash('sha256').update(fs.readFileSync(f)).digest('hex');
    const wal = fs.readFileSync(path.join(data, 'state.db-wal'));
    await node.stop(1000);
    expect(sha(path.join(data, 'state.db'))).toBe(sha(older));
    expect(fs.existsSync(path.join(data, 'state.db-wal'))).toBe(true);
    expect(fs.readFileSync(path.join(data, 'state.db-wal')).equals(wal)).toBe(true);
  }, 60_000);

  test('a normal stop still checkpoints state.db: the -wal is gone and the file holds the used tickets', async () => {
    const { data, node, ask } = await serving();
    expect((await ask()).head.status).toBe(200);
    await node.stop(1000);
    expect(fs.existsSync(path.join(data, 'state.db-wal'))).toBe(false);
    const db = new Database(path.join(data, 'state.db'), { readonly: true });
    try {
      expect(db.prepare<[], { n: number }>('SELECT count(*) AS n FROM used_tickets').get()!.n).toBe(1);
      expect(db.pragma('quick_check', { simple: true })).toBe('ok');
    } finally {
      db.close();
    }
  }, 60_000);

  test("state.db's close guard that cannot be opened: the start fails naming state.db and releases every data file, and the next start serves", async () => {
    const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-files-changed-'));
    dirs.push(home);
    const data = path.join(home, 'data');
    /** This process's descriptors open on the data folder's files. */
    const openInData = () => openFilesUnder(`${data}/`);
    const market = testKey();
    const open = CloseGuard.open.bind(CloseGuard);
    const spy = vi.spyOn(CloseGuard, 'open').mockImplementation((file) => {
      if (path.basename(file) === 'state.db') throw new Error('EMFILE: too many open files');
      return open(file);
    });
    const config = { publicKey: market.id, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 0, min_free_mb: 0 }' };
    await expect(startTinyNode(home, config)).rejects.toThrow(/state\.db.*EMFILE|EMFILE.*state\.db/s);
    expect(spy.mock.calls.map(([f]) => path.basename(f))).toEqual(['receipts.db', 'state.db']);
    expect(openInData()).toEqual([]); // (the receipt log, state.db's connection and its seal: all closed)
    spy.mockRestore();
    // Nothing left held: the data folder's lock, the receipt log and state.db open again here.
    const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
    cleanups.push(() => buyer.stop());
    const node = await startNode(parseConfig(tinyNodeConfigYaml(config), home));
    cleanups.push(() => node.stop(1000));
    expect((await askNode(buyer, node, market)).head.status).toBe(200);
  }, 60_000);
});
