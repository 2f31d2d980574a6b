// `seller-node start` as an operator runs it: a real process with a config, serving over libp2p,
// answering on the ops port, and stopping cleanly on SIGTERM with every receipt on disk.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { fromHex, toHex, utf8 } from '../attestation/bytes.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { createHost } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { CAPACITY_PAYLOAD_TYPE, CAPACITY_PROTOCOL } from '../src/p2p/capacity-protocol.ts';
import { LOG_PROTOCOL } from '../src/p2p/log-protocol.ts';
import { verifyEnvelope } from '../attestation/dsse.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { loadKeyFile } from '../src/identity.ts';
import { assertCliBuilt, runCli } from './helpers/cli-run.ts';
import { killLeftNodes, spawnNode, waitForStart } from './helpers/node-process.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';

const dir = tempDir('seller-node-start-');
afterAll(() => removeTemp(dir));
const market = testKey();

afterEach(killLeftNodes);

function config(extra = ''): string {
  return tinyNodeConfigYaml({ publicKey: market.id, extra });
}

beforeAll(assertCliBuilt);

describe('seller-node start', () => {
  test('serves a paid request over libp2p, reports it on /metrics, and stops cleanly on SIGTERM', async () => {
    expect((await runCli(['init', '--data', dir])).code).toBe(0);
    writeTinyLlama(path.join(dir, 'tiny.gguf'));
    fs.writeFileSync(path.join(dir, 'config.yaml'), config());
    const child = spawnNode(path.join(dir, 'config.yaml'));
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    const { addr, ops, priceVersion } = await waitForStart(child);
    const provider = loadKeyFile(path.join(dir, 'node.key')).providerId;
    expect(await (await fetch(`${ops}/healthz`)).json()).toEqual({ status: 'ok' });
    expect((await fetch(`${ops}/readyz`)).status).toBe(200);

    const buyer = await createHost({ seed: testKey().seed, listen: [] });
    const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 12, seed: 1 }));
    const ticket = signTicket(market, ticketPayload(provider, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(body).digest()), max_cost_micro_usd: '100000' }));
    const res = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket }, body));
    // The signed capacity snapshot names the model, its free slots and queue, its context,
    // quantization bucket and measured throughput, and the price version.
    const cap = await readResponse(await request(buyer, addr, CAPACITY_PROTOCOL, {}));
    const capEnv = JSON.parse(Buffer.from(cap.body).toString('utf8'));
    const capChecked = verifyEnvelope(capEnv, { payloadType: CAPACITY_PAYLOAD_TYPE, keys: [{ keyid: provider, publicKey: fromHex(provider) }] });
    expect(capChecked.ok).toBe(true);
    if (capChecked.ok) {
      const snapshot = JSON.parse(Buffer.from(capChecked.value.payload).toString('utf8'));
      expect(snapshot).toMatchObject({ provider, price_version: priceVersion, accepting: true, models: [{ id: 'tiny/llama', slots: 1, free_slots: 1, queued: 0, queue_limit: 16, context: 512, quantization: 'f32' }] });
      expect(snapshot.models[0].tokens_per_second).toBeGreaterThan(0);
    }
    // The receipt can be fetched back from the node's log by request id.
    const requestId = JSON.parse(Buffer.from(ticket.payload, 'base64').toString('utf8')).request_id;
    const fetched = await readResponse(await request(buyer, addr, LOG_PROTOCOL, { op: 'receipt', request_id: requestId }));
    expect(JSON.parse(Buffer.from(fetched.body).toString('utf8')).receipts).toEqual([res.trailer.receipt]);
    // Endpoints a peer makes up, without a ticket: refused, and counted under one label value.
    for (const endpoint of ['nope-1', 'nope-2', 'x'.repeat(64)]) {
      const bad = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint }, body));
      expect(bad.head.status).toBe(400);
    }
    await buyer.stop();
    expect(res.head.status).toBe(200);
    const v = verifyReceipt(res.trailer.receipt as string, { provider });
    expect(v.ok).toBe(true);

    const metrics = await (await fetch(`${ops}/metrics`)).text();
    expect(metrics).toMatch(/seller_requests_total\{endpoint="chat\/completions",status="200"\} 1/);
    expect(metrics).toMatch(/seller_requests_total\{endpoint="invalid",status="400"\} 3/);
    expect(metrics).not.toMatch(/nope|xxxx/);
    expect(metrics).toMatch(/seller_receipts_signed_total\{status="completed"\} 1/);
    // Tokens and earnings are the receipt's; its latency and time to first token are observed once.
    if (!v.ok) throw new Error('unreachable');
    const { usage, cost_micro_usd: cost } = v.value.payload;
    expect(usage.output_tokens).toBeGreaterThan(0);
    expect(metrics).toContain(`seller_tokens_total{direction="in",model="tiny/llama"} ${usage.input_tokens}\n`);
    expect(metrics).toContain(`seller_tokens_total{direction="out",model="tiny/llama"} ${usage.output_tokens}\n`);
    expect(metrics).toContain(`seller_earnings_micro_usd_total{model="tiny/llama"} ${cost}\n`);
    expect(metrics).toMatch(/seller_request_duration_seconds_count\{endpoint="chat\/completions",model="tiny\/llama"\} 1\n/);
    expect(metrics).toMatch(/seller_time_to_first_token_seconds_count\{model="tiny\/llama"\} 1\n/);
    expect(metrics).toContain('seller_slots_in_use{model="tiny/llama"} 0\n');
    expect(metrics).toContain('seller_queue_depth{model="tiny/llama"} 0\n');
    const status = (await (await fetch(`${ops}/status`)).json()) as { provider_id: string; receipts: { receipts: number } };
    expect(status.provider_id).toBe(provider);

    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(stderr).not.toMatch(/hello world/); // prompts never reach the logs
    const log = ReceiptLog.open({ path: path.join(dir, 'data', 'receipts.db'), seed: loadKeyFile(path.join(dir, 'node.key')).seed, threads: 0, checkpointIntervalMs: 0 });
    expect(log.size).toBe(1);
    expect(log.latestCheckpoint()?.size).toBe(1);
    await log.close();
  });

  test('SIGTERM lets an in-flight stream finish, refuses new work, and exits 0 with its receipt on disk', async () => {
    const d2 = path.join(dir, 'drain');
    expect((await runCli(['init', '--data', d2])).code).toBe(0);
    writeTinyLlama(path.join(d2, 'tiny.gguf'));
    fs.writeFileSync(path.join(d2, 'config.yaml'), config());
    const child = spawnNode(path.join(d2, 'config.yaml'));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    const { addr, priceVersion } = await waitForStart(child);
    const provider = loadKeyFile(path.join(d2, 'node.key')).providerId;
    const buyer = await createHost({ seed: testKey().seed, listen: [] });
    const ask = (maxTokens: number) => {
      const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: maxTokens, seed: 2, stream: true }));
      const ticket = signTicket(market, ticketPayload(provider, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(body).digest()), max_cost_micro_usd: '100000' }));
      return request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket }, body);
    };
    const inFlight = await ask(400);
    await inFlight.head;
    child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 100));
    // New work is refused while the running stream drains.
    const late = await ask(5).then(readResponse).then((r) => r.head.status, () => 'refused');
    expect([503, 'refused']).toContain(late);
    let trailer: Record<string, unknown> = {};
    for await (const f of inFlight.frames) if (f.kind === 'trailer') trailer = f.value;
    expect(trailer.status).toBe('completed');
    expect(verifyReceipt(trailer.receipt as string, { provider }).ok).toBe(true);
    expect(await exited).toBe(0);
    await buyer.stop();
    const log = ReceiptLog.open({ path: path.join(d2, 'data', 'receipts.db'), seed: loadKeyFile(path.join(d2, 'node.key')).seed, threads: 0, checkpointIntervalMs: 0 });
    expect(log.byRequestId(trailer.request_id as string).length).toBe(1);
    await log.close();
  });

  test('stop_grace_s bounds the drain: work still running when it ends is cancelled, each buyer still gets its receipt in the trailer, and the node exits 0', async () => {
    // Eight long streams at once on eight slots take seconds on two cores (over 30 s on no machine
    // here); with a 1 s grace the node must not wait for them. Without the setting reaching the
    // node's stop (its default grace is 30 s) every one of them would complete.
    const d3 = path.join(dir, 'grace');
    expect((await runCli(['init', '--data', d3])).code).toBe(0);
    writeTinyLlama(path.join(d3, 'tiny.gguf'));
    fs.writeFileSync(path.join(d3, 'config.yaml'), tinyNodeConfigYaml({ publicKey: market.id, context: 2048, slots: 8, extra: 'stop_grace_s: 1' }));
    const child = spawnNode(path.join(d3, 'config.yaml'));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    const { addr, priceVersion } = await waitForStart(child);
    const provider = loadKeyFile(path.join(d3, 'node.key')).providerId;
    const buyer = await createHost({ seed: testKey().seed, listen: [] });
    const ask = async () => {
      const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 2000, seed: 2, stream: true }));
      const payload = ticketPayload(provider, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(body).digest()), max_cost_micro_usd: '100000' });
      let trailer: Record<string, unknown> | undefined;
      const res = await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket: signTicket(market, payload) }, body);
      expect((await res.head).status).toBe(200);
      // Every stream ends with its trailer, a cancelled one too (s30 review: it was reset, no receipt).
      for await (const f of res.frames) if (f.kind === 'trailer') trailer = f.value;
      return { requestId: payload.request_id, trailer };
    };
    const runs = Array.from({ length: 8 }, ask);
    await new Promise((r) => setTimeout(r, 300)); // all eight generating
    child.kill('SIGTERM');
    const outcomes = await Promise.all(runs);
    expect(await exited).toBe(0);
    await buyer.stop();
    // Each has its one receipt in the log, the one its trailer carried, and not all of them
    // completed: the drain was cut short.
    const log = ReceiptLog.open({ path: path.join(d3, 'data', 'receipts.db'), seed: loadKeyFile(path.join(d3, 'node.key')).seed, threads: 0, checkpointIntervalMs: 0 });
    const statuses = outcomes.map((o) => {
      const lines = log.byRequestId(o.requestId);
      expect(lines.map((l) => l.line)).toEqual([o.trailer?.receipt]);
      expect(verifyReceipt(o.trailer!.receipt as string, { provider }).ok).toBe(true);
      return o.trailer!.status as string;
    });
    expect(statuses).toContain('cancelled');
    expect(statuses.filter((s) => s === 'completed').length).toBeLessThan(8);
    await log.close();
  });

  test('an invalid config is refused at start, naming the key', async () => {
    fs.writeFileSync(path.join(dir, 'bad.yaml'), config().replace('context: 512', 'context: lots'));
    const r = await runCli(['start', '--config', path.join(dir, 'bad.yaml')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/models\[0\]\.context/);
    const missing = await runCli(['start', '--config', path.join(dir, 'none.yaml')]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/cannot read/);
  });
});
