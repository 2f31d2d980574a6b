// `seller-node market` and `seller-node start` as real processes (the built CLI): the node
// registers itself, the market issues a ticket for it, a buyer dials the address the market gave
// over libp2p, and the market collects and verifies the receipt. Both stop cleanly on a signal.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { verifyTicket } from '../attestation/ticket-verify.ts';
import { loadKeyFile } from '../src/identity.ts';
import { createHost } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { assertCliBuilt, runCli } from './helpers/cli-run.ts';
import { killLeftCliProcesses, spawnCli } from './helpers/cli-process.ts';
import { testKey } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';
import { waitFor } from './helpers/wait.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';

const dir = tempDir('seller-node-market-e2e-');
afterAll(() => {
  killLeftCliProcesses();
  removeTemp(dir);
});

async function startMarketProcess(data: string) {
  const p = spawnCli(['market', '--data', data, '--listen', '127.0.0.1:0']);
  const started = await waitFor('the market to start', () => {
    if (p.child.exitCode !== null) throw new Error(`market exited ${p.child.exitCode}: ${p.stderr()}`);
    const url = /seller-node market: (http:\/\/\S+)/.exec(p.stdout())?.[1];
    const key = /public key ([0-9a-f]{64})/.exec(p.stdout())?.[1];
    return url && key ? { url, key } : undefined;
  });
  return { ...p, ...started };
}

describe('seller-node market + seller-node start', () => {
  test('the node registers itself, serves a market-issued ticket, and the market collects its receipt', async () => {
    assertCliBuilt();
    const marketDir = path.join(dir, 'market');
    const market = await startMarketProcess(marketDir);
    expect(fs.statSync(path.join(marketDir, 'market.key')).mode & 0o777).toBe(0o600);
    // Its tickets, receipts and totals are kept beside the key, this user's only.
    expect(fs.statSync(path.join(marketDir, 'market.db')).mode & 0o777).toBe(0o600);
    expect(await (await fetch(`${market.url}/v1/market`)).json()).toEqual({ public_key: market.key, key_id: market.key });

    const nodeDir = path.join(dir, 'node');
    expect((await runCli(['init', '--data', nodeDir])).code).toBe(0);
    writeTinyLlama(path.join(nodeDir, 'tiny.gguf'));
    fs.writeFileSync(
      path.join(nodeDir, 'config.yaml'),
      tinyNodeConfigYaml({ publicKey: market.key, marketUrl: market.url }),
    );
    const provider = loadKeyFile(path.join(nodeDir, 'node.key')).providerId;
    const node = spawnCli(['start', '--config', path.join(nodeDir, 'config.yaml')]);
    const started = Date.now();

    // The node appears in the market's provider list, live, within a few seconds of starting.
    const listed = await waitFor('the node to register', async () => {
      if (node.child.exitCode !== null) throw new Error(`node exited ${node.child.exitCode}: ${node.stderr()}`);
      const list = (await (await fetch(`${market.url}/v1/providers`)).json()) as { provider: string; live: boolean; price_version: string; addresses: string[] }[];
      return list.find((p) => p.provider === provider && p.live);
    });
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(listed.price_version).toBe(/price version (\S+)/.exec(node.stdout())?.[1]);

    // The ops port tells the operator the node is registered: /readyz ready, /status the details.
    const ops = /ops (\S+)/.exec(node.stdout())?.[1];
    const ready = await waitFor('/readyz to say ready', async () => {
      const r = await fetch(`${ops}/readyz`);
      return r.status === 200 ? await r.json() : undefined;
    });
    expect(ready).toEqual({ ready: true, reasons: [] });
    const status = (await (await fetch(`${ops}/status`)).json()) as { marketplace: Record<string, unknown> };
    expect(status.marketplace).toMatchObject({ url: market.url.replace(/\/+$/, ''), registered: true, last_error: null });
    expect(status.marketplace.registered_at).toEqual(expect.any(Number));
    expect(status.marketplace.ticket_key).toEqual({ public_key: market.key, trusted: true });

    // A buyer asks the market for a ticket and dials the address the market gave.
    const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 8, seed: 1 }));
    const t = await (await fetch(`${market.url}/v1/tickets`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: toHex(crypto.createHash('sha256').update(body).digest()) }) })).json() as { ticket: never; provider: string; addresses: string[]; request_id: string };
    expect(t.provider).toBe(provider);
    expect(verifyTicket(t.ticket, { marketplaceKeys: [{ publicKey: market.key }], provider, body }).ok).toBe(true);
    const buyer = await createHost({ seed: testKey().seed, listen: [] });
    try {
      const res = await readResponse(await request(buyer, t.addresses[0]!, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket: t.ticket }, body));
      expect(res.head.status).toBe(200);
      const collected = await (await fetch(`${market.url}/v1/receipts`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ receipt: res.trailer.receipt }) })).json();
      expect(collected).toMatchObject({ ok: true, request_id: t.request_id });
      const totals = (await (await fetch(`${market.url}/v1/totals`)).json()) as { receipts: number; by_provider: Record<string, { receipts: number }> };
      expect(totals.receipts).toBe(1);
      expect(totals.by_provider[provider]?.receipts).toBe(1);
    } finally {
      await buyer.stop();
    }

    // A second node that trusts another key than the market's: it registers, says why it is not
    // ready, tells the market it is not accepting work, and the market routes no buyer to it.
    const wrongDir = path.join(dir, 'node-wrong-key');
    expect((await runCli(['init', '--data', wrongDir])).code).toBe(0);
    writeTinyLlama(path.join(wrongDir, 'tiny.gguf'));
    fs.writeFileSync(path.join(wrongDir, 'config.yaml'), tinyNodeConfigYaml({ publicKey: testKey().id, marketUrl: market.url }));
    const wrongId = loadKeyFile(path.join(wrongDir, 'node.key')).providerId;
    const wrong = spawnCli(['start', '--config', path.join(wrongDir, 'config.yaml')]);
    await waitFor('the second node to register and send its snapshot', async () => {
      if (wrong.child.exitCode !== null) throw new Error(`node exited ${wrong.child.exitCode}: ${wrong.stderr()}`);
      const list = (await (await fetch(`${market.url}/v1/providers`)).json()) as { provider: string; live: boolean; accepting: boolean }[];
      return list.find((p) => p.provider === wrongId && p.live && p.accepting === false);
    });
    const wrongOps = /ops (\S+)/.exec(wrong.stdout())?.[1];
    const notReady = await fetch(`${wrongOps}/readyz`);
    expect(notReady.status).toBe(503);
    expect(((await notReady.json()) as { reasons: string[] }).reasons).toEqual([
      `the marketplace at ${market.url.replace(/\/+$/, '')} signs tickets with key ${market.key}, which is not in marketplace.public_keys: every ticket it issues would be refused`,
    ]);
    expect(wrong.stderr()).toMatch(/"level":50.*the marketplace signs tickets with a key that is not in marketplace\.public_keys/);
    for (let i = 0; i < 3; i++) {
      const ask = await fetch(`${market.url}/v1/tickets`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: '00'.repeat(32) }) });
      expect(((await ask.json()) as { provider: string }).provider).toBe(provider);
    }
    wrong.child.kill('SIGTERM');
    expect(await wrong.exited).toBe(0);

    node.child.kill('SIGTERM');
    expect(await node.exited).toBe(0);
    market.child.kill('SIGTERM');
    expect(await market.exited).toBe(0);
    expect(market.stderr()).toMatch(/provider registered/);

    // The market keeps its key across restarts; SIGINT stops it cleanly too.
    const again = await startMarketProcess(marketDir);
    expect(again.key).toBe(market.key);
    again.child.kill('SIGINT');
    expect(await again.exited).toBe(0);
  });

  test('a --data that is a file is named, with why', async () => {
    const file = path.join(dir, 'not-a-folder');
    fs.writeFileSync(file, 'x');
    const r = await runCli(['market', '--data', file, '--listen', '127.0.0.1:0']);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`seller-node: cannot use --data ${file}: it, or a folder on its path, is a file, not a folder\n`);
  });

  test('a bad --listen is a usage error', async () => {
    const r = await runCli(['market', '--data', path.join(dir, 'm2'), '--listen', 'nowhere']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--listen must be host:port/);
  });
});

describe('a terminal that goes away', () => {
  // SIGHUP is what a process gets when its terminal or ssh session closes; by then its output has
  // nowhere to go. Writing the "stopping" line (and log lines) must not end it mid-shutdown.
  test('SIGHUP with stdout and stderr closed: the market still stops gracefully, exit 0', async () => {
    assertCliBuilt();
    const m = await startMarketProcess(path.join(dir, 'market-hup'));
    m.child.stdout!.destroy();
    m.child.stderr!.destroy();
    await new Promise((r) => setTimeout(r, 100));
    m.child.kill('SIGHUP');
    expect(await m.exited).toBe(0);
  });
});

describe('seller-node gateway at start', () => {
  test('warns when its marketplace does not answer, and not when it does', async () => {
    assertCliBuilt();
    const market = await startMarketProcess(path.join(dir, 'market-for-gateway'));
    const good = spawnCli(['gateway', '--market', market.url, '--listen', '127.0.0.1:0']);
    // A port nothing listens on (bound, then released).
    const net = await import('node:net');
    const s = net.createServer();
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    const closed = (s.address() as import('node:net').AddressInfo).port;
    await new Promise((r) => s.close(r));
    const bad = spawnCli(['gateway', '--market', `http://127.0.0.1:${closed}`, '--listen', '127.0.0.1:0']);
    // Something that answers, but not as a marketplace does.
    const http = await import('node:http');
    const notMarket = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"hello":"world"}'));
    await new Promise<void>((r) => notMarket.listen(0, '127.0.0.1', r));
    const notMarketUrl = `http://127.0.0.1:${(notMarket.address() as import('node:net').AddressInfo).port}`;
    const wrong = spawnCli(['gateway', '--market', notMarketUrl, '--listen', '127.0.0.1:0']);
    try {
      await waitFor('the warning about a wrong answer', () => (/warning: /.test(wrong.stderr()) ? true : undefined));
      expect(wrong.stderr()).toBe(`seller-node: warning: the marketplace's key is malformed; buyers get 502 bad_market_response until that changes\n`);
      await waitFor('the warning', () => (/warning: the marketplace/.test(bad.stderr()) ? true : undefined));
      expect(bad.stderr()).toBe(`seller-node: warning: the marketplace at http://127.0.0.1:${closed} did not answer (ECONNREFUSED); buyers get 502 market_unreachable until that changes\n`);
      expect(bad.stdout()).toMatch(/^seller-node gateway: listening http:\/\/127\.0\.0\.1:\d+\/v1/); // it serves anyway
      await waitFor('the good gateway to start', () => (/listening/.test(good.stdout()) ? true : undefined));
      await new Promise((r) => setTimeout(r, 300)); // (its check has had time to answer)
      expect(good.stderr()).not.toMatch(/warning/);
    } finally {
      for (const p of [good, bad, wrong, market]) p.child.kill('SIGTERM');
      notMarket.closeAllConnections();
      notMarket.close();
    }
    expect(await wrong.exited).toBe(0);
    expect(await good.exited).toBe(0);
    expect(await bad.exited).toBe(0);
    expect(await market.exited).toBe(0);
  });
});
