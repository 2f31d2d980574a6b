// One writer per data dir, and a data dir's problems named before any model loads.
// - a second `seller-node start` or `log fill` on a running node's folder is refused, the running
//   node untouched; a node killed outright leaves no stale lock;
// - `log export` beside a running node works, and the node carries on past its checkpoint timer;
// - a folder the node cannot use is refused as `data_dir: ...` even when a model would also fail.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test, vi } from 'vitest';
import { LlamaThreadAdapter } from '../adapters/runtime-thread.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { signPriceList } from '../attestation/price-list.ts';
import { ratesToWire } from '../attestation/receipt.ts';
import { parseConfig } from '../src/config.ts';
import { lockDataDir } from '../src/data-dir-lock.ts';
import { createKeyFile, loadKeyFile } from '../src/identity.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { assertCliBuilt, runCli } from './helpers/cli-run.ts';
import { killLeftNodes, spawnNode, waitForStart } from './helpers/node-process.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';

const dir = tempDir('seller-node-data-dir-');
afterAll(() => removeTemp(dir));
afterEach(killLeftNodes);
beforeAll(assertCliBuilt);
const market = testKey();

/** A folder with a key, the tiny model and a config (checkpoints every 300 ms). */
function home(name: string): string {
  const h = path.join(dir, name);
  fs.mkdirSync(h, { recursive: true });
  createKeyFile(path.join(h, 'node.key'));
  writeTinyLlama(path.join(h, 'tiny.gguf'));
  // The layout `seller-node init` makes, which `log fill --data` and `log export --data` read: the key in the data dir.
  const yaml = tinyNodeConfigYaml({ publicKey: market.id, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 300 }' });
  fs.writeFileSync(path.join(h, 'config.yaml'), yaml.replace('data_dir: ./data', 'data_dir: .'));
  return h;
}

async function paidRequest(h: string, addr: string, priceVersion: string): Promise<{ status: number; receipt: unknown }> {
  const provider = loadKeyFile(path.join(h, 'node.key')).providerId;
  const buyer = await createHost({ seed: testKey().seed, listen: [] });
  try {
    const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4, seed: 1 }));
    const ticket = signTicket(market, ticketPayload(provider, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(body).digest()), max_cost_micro_usd: '100000' }));
    const res = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket }, body));
    return { status: res.head.status as number, receipt: res.trailer?.receipt };
  } finally {
    await buyer.stop();
  }
}

describe('a running node owns its data dir', () => {
  test('a second start and log fill are refused; log export works beside it; the node serves on through its checkpoint timer', async () => {
    const h = home('shared');
    const config = path.join(h, 'config.yaml');
    const provider = loadKeyFile(path.join(h, 'node.key')).providerId;
    const child = spawnNode(config);
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    const { addr, ops, priceVersion } = await waitForStart(child);
    expect((await paidRequest(h, addr, priceVersion)).status).toBe(200);

    // A second node on the same folder: refused before it loads anything, naming the key and why.
    const second = await runCli(['start', '--config', config]);
    expect(second.code).toBe(1);
    expect(second.stderr).toMatch(/^seller-node: data_dir: .* is in use by another seller-node process/m);
    // log fill would fork the running node's chain: refused, nothing appended.
    const fill = await runCli(['log', 'fill', '--data', h, '--count', '5']);
    expect(fill.code).toBe(1);
    expect(fill.stderr).toMatch(/is in use by another seller-node process/);

    // log export beside the running node, before its timer has signed a checkpoint over the receipt.
    const out = path.join(h, 'export');
    const ex = await runCli(['log', 'export', '--data', h, '--out', out]);
    expect(ex.stderr, ex.stderr).toBe('');
    expect(ex.stdout).toMatch(/^exported 1 receipt, 1 checkpoint and 1 price list/);
    expect((await runCli(['audit', out])).code).toBe(0);
    // The node's /status shows the checkpoint over its receipt, whoever signed it.
    expect(((await (await fetch(`${ops}/status`)).json()) as { receipts: { receipts: number; lastCheckpointSize: number } }).receipts).toMatchObject({ receipts: 1, lastCheckpointSize: 1 });

    await new Promise((r) => setTimeout(r, 900)); // the node's checkpoint timer turns
    expect(await (await fetch(`${ops}/healthz`)).json()).toEqual({ status: 'ok' });
    const next = await paidRequest(h, addr, priceVersion);
    expect(next.status).toBe(200);
    expect(verifyReceipt(next.receipt as string, { provider }).ok).toBe(true);

    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(stderr).not.toMatch(/"level":(50|60)/); // nothing went wrong inside the node
    const log = ReceiptLog.open({ path: path.join(h, 'receipts.db'), seed: loadKeyFile(path.join(h, 'node.key')).seed, threads: 0, checkpointIntervalMs: 0 });
    expect(log.size).toBe(2);
    expect(log.checkpoints().map((c) => c.size)).toEqual([1, 2]);
    await log.close();
    // Stopped: the folder is free again (fill gets past the lock), and fill refuses the node's real log.
    const after = await runCli(['log', 'fill', '--data', h, '--count', '3']);
    expect(after.code).toBe(1);
    expect(after.stderr).toMatch(/holds real receipts \(seq 0 is not synthetic\)/);
  });

  test('a node killed outright (SIGKILL) leaves no stale lock', async () => {
    const h = home('killed');
    const child = spawnNode(path.join(h, 'config.yaml'));
    const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_code, signal) => r(signal)));
    await waitForStart(child);
    expect(() => lockDataDir(h)).toThrow(/in use by another seller-node process/);
    child.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');
    const lock = lockDataDir(h);
    lock.release();
    lock.release(); // idempotent
    const fill = await runCli(['log', 'fill', '--data', h, '--count', '3']);
    expect(fill.code, fill.stderr).toBe(0);
  });
});

describe('startNode names a data dir it cannot use before it loads a model', () => {
  /** A node home whose model file is corrupt: a start that reached the model would fail naming it. */
  function corruptModelHome(name: string) {
    const h = path.join(dir, name);
    fs.mkdirSync(path.join(h, 'data'), { recursive: true });
    createKeyFile(path.join(h, 'node.key'));
    writeTinyLlama(path.join(h, 'tiny.gguf'));
    fs.truncateSync(path.join(h, 'tiny.gguf'), fs.statSync(path.join(h, 'tiny.gguf')).size >> 1); // a truncated download
    return { h, config: parseConfig(tinyNodeConfigYaml({ publicKey: market.id, logLevel: 'fatal' }), h) };
  }

  test('another node holding the folder', async () => {
    const { h, config } = corruptModelHome('held');
    const lock = lockDataDir(path.join(h, 'data'));
    try {
      const e = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
      expect(e).toBeInstanceOf(NodeStartError);
      expect(e!.message).toMatch(/^data_dir: .*data is in use by another seller-node process/);
    } finally {
      lock.release();
    }
    // Once free, the start gets as far as the model, and its failure releases the folder again.
    await expect(startNode(config)).rejects.toThrow(/^models: tiny\/llama: the runtime could not start: model file .*tiny\.gguf: llama\.cpp could not load it: tensor .* data is not within the file bounds/);
    lockDataDir(path.join(h, 'data')).release();
  });

  test('a price list file of that version that is not this node’s', async () => {
    const { h, config } = corruptModelHome('prices');
    const id = loadKeyFile(path.join(h, 'node.key'));
    const version = signPriceList(id.seed, id.providerId, [{ model: 'tiny/llama', ...ratesToWire(config.models[0]!.prices) }]).payload.version;
    fs.mkdirSync(path.join(h, 'data', 'prices'));
    fs.writeFileSync(path.join(h, 'data', 'prices', `${version}.json`), '{"not":"a price list"}');
    const e = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
    expect(e).toBeInstanceOf(NodeStartError);
    expect(e!.message).toMatch(/^data_dir: .* is not this node's price list of version/);
    lockDataDir(path.join(h, 'data')).release(); // the failed start let the folder go
  });

  test("another provider's receipt log", async () => {
    const { h, config } = corruptModelHome('foreign-log');
    const other = ReceiptLog.open({ path: path.join(h, 'data', 'receipts.db'), seed: new Uint8Array(crypto.randomBytes(32)), threads: 0, checkpointIntervalMs: 0 });
    await other.close();
    const e = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
    expect(e).toBeInstanceOf(NodeStartError);
    expect(e!.message).toMatch(/^data_dir: .*receipts\.db is the receipt log of provider [0-9a-f]{64}, not of this key/);
    lockDataDir(path.join(h, 'data')).release();
  });

  test('a state database that is not one', async () => {
    const { h, config } = corruptModelHome('bad-state');
    fs.writeFileSync(path.join(h, 'data', 'state.db'), Buffer.alloc(4096, 0x41));
    const e = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
    expect(e).toBeInstanceOf(NodeStartError);
    expect(e!.message).toMatch(/^data_dir: .*state\.db: /);
    // The receipt log it had opened was closed again: it opens here.
    const log = ReceiptLog.open({ path: path.join(h, 'data', 'receipts.db'), seed: loadKeyFile(path.join(h, 'node.key')).seed, threads: 0, checkpointIntervalMs: 0 });
    await log.close();
    lockDataDir(path.join(h, 'data')).release();
  });
});

describe('startNode names what it cannot listen on, and a data dir that is not a folder', () => {
  function goodHome(name: string, extra: Partial<{ listen: string; ops: string; dataDir: string }> = {}) {
    const h = path.join(dir, name);
    fs.mkdirSync(h, { recursive: true });
    createKeyFile(path.join(h, 'node.key'));
    writeTinyLlama(path.join(h, 'tiny.gguf'));
    let yaml = tinyNodeConfigYaml({ publicKey: market.id, logLevel: 'fatal' });
    if (extra.listen) yaml = yaml.replace('listen: [/ip4/127.0.0.1/tcp/0]', `listen: [${extra.listen}]`);
    if (extra.ops) yaml = yaml.replace('ops: { http: "127.0.0.1:0" }', `ops: { http: "${extra.ops}" }`);
    if (extra.dataDir) yaml = yaml.replace('data_dir: ./data', `data_dir: ${extra.dataDir}`);
    return { h, config: parseConfig(yaml, h) };
  }
  async function busyPort(): Promise<{ port: number; close: () => Promise<void> }> {
    const net = await import('node:net');
    const s = net.createServer();
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    return { port: (s.address() as import('node:net').AddressInfo).port, close: () => new Promise((r) => s.close(() => r())) };
  }

  test('a libp2p port in use: the address and why, no stack, no libp2p advice, before any model loads; the folder is let go', async () => {
    const busy = await busyPort();
    try {
      const { h, config } = goodHome('p2p-busy', { listen: `/ip4/127.0.0.1/tcp/${busy.port}` });
      const e = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
      expect(e).toBeInstanceOf(NodeStartError);
      expect(e!.message).toBe(`listen: /ip4/127.0.0.1/tcp/${busy.port}: address already in use (pick another in listen)`);
      // Named before the model was loaded (minutes for a real one): it was never probed.
      expect(fs.existsSync(path.join(h, 'data', 'model-probes.json'))).toBe(false);
      lockDataDir(path.join(h, 'data')).release();
    } finally {
      await busy.close();
    }
    // The port once free: tried, let go, and taken by libp2p.
    const { config } = goodHome('p2p-fixed', { listen: `/ip4/127.0.0.1/tcp/${busy.port}` });
    const node = await startNode(config);
    try {
      expect(node.addresses.some((a) => a.includes(`/ip4/127.0.0.1/tcp/${busy.port}/`))).toBe(true);
    } finally {
      await node.stop(1000);
    }
  });

  test('an ops port in use names ops.http', async () => {
    const busy = await busyPort();
    try {
      const { h, config } = goodHome('ops-busy', { ops: `127.0.0.1:${busy.port}` });
      const e = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
      expect(e).toBeInstanceOf(NodeStartError);
      expect(e!.message).toBe(`ops.http: 127.0.0.1:${busy.port}: address already in use (pick another host:port in ops.http)`);
      lockDataDir(path.join(h, 'data')).release();
      // ... before any model loads (the ops server answers from the start, while models load):
      // with a model file that cannot load, the port is still what is named.
      fs.truncateSync(path.join(h, 'tiny.gguf'), 1000);
      const early = await startNode(config).then(() => undefined, (err: unknown) => err as Error);
      expect(early!.message).toBe(`ops.http: 127.0.0.1:${busy.port}: address already in use (pick another host:port in ops.http)`);
    } finally {
      await busy.close();
    }
  });

  test('an ops.http address this machine does not have names ops.http, in words', async () => {
    const { h, config } = goodHome('ops-noaddr', { ops: '192.0.2.1:9464' }); // (TEST-NET-1)
    await expect(startNode(config)).rejects.toThrow(/^ops\.http: 192\.0\.2\.1:9464: no such address on this machine \(pick another host:port in ops\.http\)$/);
    lockDataDir(path.join(h, 'data')).release();
  });

  test('IPv4 and IPv6 addresses on a host without IPv6 (every IPv6 one fails, every IPv4 one listens): started on IPv4, as libp2p does', async () => {
    const { config } = goodHome('p2p-no-ipv6', { listen: '/ip4/127.0.0.1/tcp/0, /ip6/2001:db8::1/tcp/0' }); // (2001:db8::/32: documentation, never local)
    const node = await startNode(config);
    try {
      expect(node.addresses.length).toBeGreaterThan(0);
      expect(node.addresses.every((a) => a.startsWith('/ip4/127.0.0.1/tcp/'))).toBe(true);
    } finally {
      await node.stop(1000);
    }
  });

  test('a listen address this machine does not have', async () => {
    const { h, config } = goodHome('p2p-noaddr', { listen: '/ip4/192.0.2.1/tcp/0' }); // (TEST-NET-1: never a local address)
    await expect(startNode(config)).rejects.toThrow(/^listen: \/ip4\/192\.0\.2\.1\/tcp\/0: no such address on this machine \(pick another in listen\)$/);
    lockDataDir(path.join(h, 'data')).release();
  });

  test('a lock file the node cannot open is named with SQLite\'s reason', async () => {
    const { h, config } = goodHome('lock-is-dir');
    fs.mkdirSync(path.join(h, 'data', 'node.lock'), { recursive: true }); // a folder where the lock file goes
    await expect(startNode(config)).rejects.toThrow(new RegExp(`^data_dir: ${path.join(h, 'data', 'node.lock')}: unable to open database file$`));
  });

  test("a data_dir the node makes is this user's only, and so are its databases (state.db holds recorded answers)", async () => {
    const { h, config } = goodHome('made-dir', { dataDir: './made/data' });
    const node = await startNode(config);
    try {
      expect((fs.statSync(path.join(h, 'made', 'data')).mode & 0o777).toString(8)).toBe('700');
      for (const f of ['state.db', 'state.db-wal', 'receipts.db', 'receipts.db-wal']) expect((fs.statSync(path.join(h, 'made', 'data', f)).mode & 0o777).toString(8), f).toBe('600');
    } finally {
      await node.stop(1000);
    }
  });

  test('while its models load, the ops server already answers: /healthz ok, /readyz 503 saying what loads, /status loading', async () => {
    const free = await busyPort();
    await free.close(); // (a port that was free a moment ago)
    const { config } = goodHome('ops-loading', { ops: `127.0.0.1:${free.port}` });
    let go!: () => void;
    const held = new Promise<void>((r) => (go = r));
    const start = LlamaThreadAdapter.prototype.start;
    vi.spyOn(LlamaThreadAdapter.prototype, 'start').mockImplementation(async function (this: LlamaThreadAdapter) {
      await held; // a model that takes its time to load
      return start.call(this);
    });
    const starting = startNode(config);
    try {
      const ops = `http://127.0.0.1:${free.port}`;
      let ready: Response | undefined;
      for (let i = 0; i < 200 && !ready; i++) ready = await fetch(`${ops}/readyz`).catch(() => new Promise<undefined>((r) => setTimeout(() => r(undefined), 25)));
      expect([ready!.status, await ready!.json()]).toEqual([503, { ready: false, reasons: ['loading models: 0 of 1 ready'] }]);
      expect((await fetch(`${ops}/healthz`)).status).toBe(200);
      expect(await (await fetch(`${ops}/status`)).json()).toMatchObject({ loading: true, models_ready: [], models: ['tiny/llama'] });
      go();
      const node = await starting;
      try {
        const after = (await (await fetch(`${ops}/readyz`)).json()) as { reasons: string[] };
        expect(after.reasons.some((r) => r.startsWith('loading'))).toBe(false);
        expect(await (await fetch(`${ops}/status`)).json()).toMatchObject({ accepting: true, models: [{ id: 'tiny/llama' }] });
      } finally {
        await node.stop(1000);
      }
    } finally {
      go();
      vi.restoreAllMocks();
      await starting.then((n) => n.stop(1000)).catch(() => undefined);
    }
  });

  test('a data_dir that is a file', async () => {
    const { h, config } = goodHome('file-dir', { dataDir: './afile' });
    fs.writeFileSync(path.join(h, 'afile'), 'not a folder');
    await expect(startNode(config)).rejects.toThrow(new RegExp(`^data_dir: ${path.join(h, 'afile')}: it, or a folder on its path, is a file, not a folder$`));
  });
});
