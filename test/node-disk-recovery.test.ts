// The data dir's disk filling up and then getting room again: below receipts.min_free_mb the node
// refuses paid work (503 no_capacity, before the ticket is used) with one error line; once space is
// freed, its 5 s watch says "the data dir has room again: paid work is taken" (once) and paid work
// is accepted again: /readyz 200, /status accepting, and the very ticket refused before is served.
// The free space is what fs.statfsSync reports for the data dir (faked here); the node's 5 s watch
// is taken from setInterval and run when the test wants it, so nothing waits 5 s.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, test, vi } from 'vitest';
import { utf8 } from '../attestation/bytes.ts';
import type { RunningNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { logLines } from './helpers/paid-ask.ts';
import { captureNodeWatches } from './helpers/node-watch.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { until } from './helpers/wait.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-disk-recovery-'));
const market = testKey();
let node: RunningNode | undefined;
afterAll(async () => {
  vi.restoreAllMocks();
  await node?.stop(1000);
  fs.rmSync(home, { recursive: true, force: true });
});

test('low disk refuses paid work with one error line; room again is said once at info level, and paid work (the same ticket) is taken again; low again is said again', async () => {
  const data = path.join(home, 'data');
  // The data dir's file system, as statfs reports it: MiB free (every other folder as it is).
  let freeMb = 10;
  const realStatfs = fs.statfsSync;
  vi.spyOn(fs, 'statfsSync').mockImplementation(((p: fs.PathLike, o?: never) => {
    const st = realStatfs(p, o);
    return path.resolve(String(p)) === data ? { ...st, bsize: 4096, bavail: freeMb * 256 } : st;
  }) as typeof fs.statfsSync);
  const watches = captureNodeWatches();

  const logFile = path.join(home, 'node.log');
  const fd = fs.openSync(logFile, 'w');
  const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  try {
    node = await startTinyNode(home, { publicKey: market.id, receipts: '{ signer_threads: 1, min_free_mb: 100 }', logLevel: 'info' }, { logDestination: fd });
    expect(watches).toHaveLength(1);
    const watch = watches[0]!;
    const n = node;
    const lowLines = () => logLines(logFile, 50).filter((l) => /MiB free, less than receipts\.min_free_mb \(100 MiB\): paid work is refused until space is freed$/.test(l.msg));
    const roomLines = () => logLines(logFile, 30).filter((l) => l.msg === 'the data dir has room again: paid work is taken');
    // (The node's flag and each model's agree: a model takes no paid work while the node takes none.)
    const status = async () => {
      const s = (await (await fetch(`${n.opsUrl}/status`)).json()) as { accepting: boolean; models: { accepting: boolean }[] };
      expect(s.models.map((m) => m.accepting)).toEqual(s.models.map(() => s.accepting));
      return s.accepting;
    };
    // One ticket, sent twice: refused while the disk is low, served once there is room.
    const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }));
    const head = { endpoint: 'chat/completions', ticket: signTicket(market, ticketPayload(n.providerId, { model: 'tiny/llama', price_version: n.priceVersion, body_sha256: crypto.createHash('sha256').update(body).digest('hex'), max_cost_micro_usd: '100000' })) };
    const ask = async () => readResponse(await request(buyer, n.addresses[0]!, INFER_PROTOCOL, head, body));

    // The node's log is written asynchronously: a line is waited for, and its absence checked after a later line.
    const requestLines = () => logLines(logFile, 30).filter((l) => l.msg === 'request').length;
    // Low at start: said once (however often the watch looks), refused, not ready, not accepting.
    await until('the low-disk line', () => lowLines().length > 0);
    expect(lowLines()[0]).toMatchObject({ msg: "the data dir's file system has 10 MiB free, less than receipts.min_free_mb (100 MiB): paid work is refused until space is freed" });
    watch();
    watch();
    expect((await fetch(`${n.opsUrl}/readyz`)).status).toBe(503);
    expect(await status()).toBe(false);
    const refused = await ask();
    expect([refused.head.status, (refused.trailer as { error?: { code?: string } }).error?.code]).toEqual([503, 'no_capacity']);
    await until('the refused request\'s line', () => requestLines() === 1);
    expect(lowLines()).toHaveLength(1);

    // Room again: said once at info level, ready, accepting, and the same ticket is served (it was not used by the refusal).
    freeMb = 500;
    expect(roomLines()).toHaveLength(0); // (not before the watch has looked)
    watch();
    watch();
    await until('the room-again line', () => roomLines().length > 0);
    expect(roomLines()[0]).toMatchObject({ data_dir: expect.stringMatching(/data$/) });
    const ready = await fetch(`${n.opsUrl}/readyz`);
    expect([ready.status, await ready.json()]).toEqual([200, { ready: true, reasons: [] }]);
    expect(await status()).toBe(true);
    const served = await ask();
    expect(served.head.status).toBe(200);
    expect((served.trailer as { status?: string }).status).toBe('completed');
    await until('the served request\'s line', () => requestLines() === 2);
    expect(roomLines()).toHaveLength(1);
    expect(lowLines()).toHaveLength(1);

    // Low again: refused again, and said again.
    freeMb = 50;
    watch();
    await until('the second low-disk line', () => lowLines().length === 2);
    expect(lowLines()[1]!.msg).toMatch(/has 50 MiB free/);
    expect((await fetch(`${n.opsUrl}/readyz`)).status).toBe(503);
    const again = await readResponse((await (async () => {
      const b = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'again' }], max_tokens: 2 }));
      const h = { endpoint: 'chat/completions', ticket: signTicket(market, ticketPayload(n.providerId, { model: 'tiny/llama', price_version: n.priceVersion, body_sha256: crypto.createHash('sha256').update(b).digest('hex'), max_cost_micro_usd: '100000' })) };
      return request(buyer, n.addresses[0]!, INFER_PROTOCOL, h, b);
    })()));
    expect([again.head.status, (again.trailer as { error?: { code?: string } }).error?.code]).toEqual([503, 'no_capacity']);
  } finally {
    await buyer.stop();
    await node?.stop(1000);
    node = undefined;
    fs.closeSync(fd);
  }
}, 30_000);
