// A request whose handler throws on a running node (startNode, in-process, logging to a file): the
// receipt log's write fails after the response went out, because another writer took the row the
// node's next receipt needed. The buyer is told (an internal_error trailer, and no receipt); the
// operator gets one "request handler failed" line naming the protocol, the buyer's peer and the
// error, and no request text; the node goes on answering.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { CAPACITY_PROTOCOL } from '../src/p2p/capacity-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { until } from './helpers/wait.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-handler-error-log-'));
const logFile = path.join(home, 'node.log');
const market = testKey();
let node: RunningNode | undefined;
let buyer: Host | undefined;
let logFd: number | undefined;

afterAll(async () => {
  await buyer?.stop();
  await node?.stop(1000);
  if (logFd !== undefined) fs.closeSync(logFd);
  fs.rmSync(home, { recursive: true, force: true });
});

interface LogLine {
  level: number;
  msg: string;
  [k: string]: unknown;
}
const lines = (): LogLine[] =>
  fs
    .readFileSync(logFile, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as LogLine);

/** A prompt no log line may quote. */
const SECRET = `private prompt ${crypto.randomUUID()} about the quarterly numbers`;

describe('a request handler that throws on a running node', () => {
  test('the buyer gets internal_error without a receipt, the log says why in one line without the prompt, and the node serves on', async () => {
    createKeyFile(path.join(home, 'node.key'));
    writeTinyLlama(path.join(home, 'tiny.gguf'));
    const config = parseConfig(tinyNodeConfigYaml({ publicKey: market.id, context: 256, logLevel: 'info' }), home);
    logFd = fs.openSync(logFile, 'w');
    node = await startNode(config, { logDestination: logFd });
    const addr = node.addresses[0]!;

    // Another writer stores a batch at the seq the node's next receipt takes: the node's commit of
    // that receipt fails (UNIQUE constraint), after the response body went to the buyer.
    const other = new Database(path.join(home, 'data', 'receipts.db'));
    try {
      other.pragma('busy_timeout = 5000');
      const next = other.prepare<[], { next: number }>('SELECT COALESCE(MAX(first_seq + count), 0) AS next FROM receipt_batches').get()!.next;
      other
        .prepare('INSERT INTO receipt_batches (first_seq, count, payloads, offsets, sigs, leaves, request_keys) VALUES (?, 1, ?, ?, ?, ?, ?)')
        .run(next, Buffer.from('{}'), Buffer.alloc(8), Buffer.alloc(64), Buffer.alloc(32), Buffer.alloc(8));
    } finally {
      other.close();
    }

    buyer = await createHost({ seed: testKey().seed, listen: [] });
    const body = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: SECRET }], max_tokens: 8, seed: 1 }));
    const ticket = signTicket(market, ticketPayload(node.providerId, { price_version: node.priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(body).digest()), max_cost_micro_usd: '100000' }));
    const res = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket }, body));
    // The HEAD (200) and the body had gone out before the receipt failed: the server ends the
    // response with an error trailer (request-server.ts, finishWithError), and no receipt.
    expect(res.head.status).toBe(200);
    expect(res.trailer).toEqual({ error: { code: 'internal_error', message: 'the response ended without a trailer' } });

    const failed = () => lines().filter((l) => l.msg === 'request handler failed');
    await until('the handler failure in the log', () => failed().length > 0);
    const [line, ...more] = failed();
    expect(more).toEqual([]);
    expect(line).toMatchObject({
      level: 50, // error
      protocol: INFER_PROTOCOL,
      remote_peer: buyer.peerId.toString(),
      err: { name: 'ReceiptLogError', code: 'log_failed', message: expect.stringMatching(/^receipt log write failed: UNIQUE constraint failed: receipt_batches\.first_seq/) },
    });
    expect((line!.err as { message: string }).message.length).toBeLessThanOrEqual(200);
    expect(Object.keys(line!).sort()).toEqual(['err', 'hostname', 'level', 'msg', 'pid', 'protocol', 'remote_peer', 'time']);

    // The node still answers: a free request (tokenize needs no receipt) and its ops port.
    const tok = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'tokenize' }, utf8(JSON.stringify({ model: 'tiny/llama', prompt: 'hello there' }))));
    expect(tok.head.status).toBe(200);
    expect(JSON.parse(Buffer.from(tok.body).toString('utf8'))).toMatchObject({ model: 'tiny/llama', count: expect.any(Number) });
    // Its ops port answers too, and says it needs a restart (a liveness probe acts on the 503).
    const health = await fetch(`${node.opsUrl}/healthz`);
    expect([health.status, await health.json()]).toEqual([503, { status: 'unhealthy', reason: expect.stringContaining('restarted') }]);
    const status = (await (await fetch(`${node.opsUrl}/status`)).json()) as { accepting: boolean };
    expect(status.accepting).toBe(false);
    // The request whose receipt could not be written is still a request line (with its request id), and counted.
    const requestId = (JSON.parse(Buffer.from(ticket.payload, 'base64').toString()) as { request_id: string }).request_id;
    expect(lines().find((l) => l.msg === 'request' && l.request_id === requestId)).toMatchObject({ endpoint: 'chat/completions', status: 200, code: 'log_failed' });
    expect(await (await fetch(`${node.opsUrl}/metrics`)).text()).toMatch(/^seller_requests_total\{endpoint="chat\/completions",status="200"\} 1$/m);
    // A body the contract refuses: its request line names the model it asked for (a served one), not "".
    const badBody = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'wizard', content: SECRET }] }));
    const contract = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions' }, badBody));
    expect(contract.head.status).toBe(400);
    await until('the refused request in the log', () => lines().some((l) => l.msg === 'request' && l.status === 400));
    expect(lines().find((l) => l.msg === 'request' && l.status === 400)).toMatchObject({ endpoint: 'chat/completions', model: 'tiny/llama', code: 'invalid_request' });

    // Paid work would end without a receipt now: it is refused before anything runs, as a full
    // node's is (503 no_capacity: the gateway tries another provider), and the node says so.
    const body2 = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'again' }], max_tokens: 8, seed: 1 }));
    const ticket2 = signTicket(market, ticketPayload(node.providerId, { price_version: node.priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(body2).digest()), max_cost_micro_usd: '100000' }));
    const refused = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket: ticket2 }, body2));
    expect(refused.head.status).toBe(503);
    expect(refused.body.length).toBe(0);
    expect(refused.trailer).toMatchObject({ error: { code: 'no_capacity', message: expect.stringMatching(/receipt log has stopped/) } });
    const ready = await fetch(`${node.opsUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(JSON.stringify(await ready.json())).toMatch(/the receipt log has stopped \(receipt log write failed: UNIQUE constraint failed/);
    const cap = await readResponse(await request(buyer, addr, CAPACITY_PROTOCOL, {}));
    const capPayload = JSON.parse(Buffer.from(JSON.parse(Buffer.from(cap.body).toString('utf8')).payload, 'base64').toString('utf8'));
    expect(capPayload.accepting).toBe(false);
    // The refused request left its ticket unused (the first one's is used), and was counted.
    const state = new Database(path.join(home, 'data', 'state.db'), { readonly: true });
    try {
      const used = state.prepare<[string], { n: number }>('SELECT COUNT(*) AS n FROM used_tickets WHERE ticket_id = ?');
      expect(used.get(JSON.parse(Buffer.from(ticket.payload, 'base64').toString('utf8')).ticket_id)!.n).toBe(1);
      expect(used.get(JSON.parse(Buffer.from(ticket2.payload, 'base64').toString('utf8')).ticket_id)!.n).toBe(0);
    } finally {
      state.close();
    }
    const metrics = await (await fetch(`${node.opsUrl}/metrics`)).text();
    expect(metrics).toMatch(/seller_requests_total\{endpoint="chat\/completions",status="503"\} 1/);

    // A request the server refuses before it can be read (here a body over 8 MiB, its secret never
    // read) is a request line and a count too, naming the peer: the operator sees such traffic.
    const big = new Uint8Array(8 * 1024 * 1024 + 1).fill(0x61);
    const tooBig = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions' }, big));
    expect(tooBig.trailer).toMatchObject({ error: { code: 'body_too_large' } });
    await until('the unread request in the log', () => lines().some((l) => l.msg === 'request' && l.status === 413));
    expect(lines().find((l) => l.msg === 'request' && l.status === 413)).toMatchObject({ level: 30, endpoint: null, code: 'body_too_large', remote_peer: buyer.peerId.toString() });
    expect(await (await fetch(`${node.opsUrl}/metrics`)).text()).toMatch(/seller_requests_total\{endpoint="invalid",status="413"\} 1/);

    // Forged tickets name the peer that sent them, and are counted by reason. A large body's is
    // refused at its HEAD, once it sends more than is read unpaid; a small body's (parsed first)
    // is refused here as all paid work is now (the log has stopped), and names the peer too.
    const forger = testKey();
    const forgedBody = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: SECRET }], max_tokens: 4 }));
    const forgedTicket = signTicket(forger, ticketPayload(node.providerId, { price_version: node.priceVersion, body_sha256: toHex(crypto.createHash('sha256').update(forgedBody).digest()) }));
    const forgedSmall = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket: forgedTicket }, forgedBody));
    const forgedLarge = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket: forgedTicket }, new Uint8Array(1 << 20).fill(0x20)));
    expect([forgedSmall.head.status, forgedLarge.head.status]).toEqual([503, 401]);
    expect(forgedLarge.trailer).toMatchObject({ error: { code: 'ticket_invalid' } });
    await until('the forged tickets in the log', () => lines().some((l) => l.msg === 'request' && l.code === 'ticket_invalid'));
    expect(lines().find((l) => l.msg === 'request' && l.code === 'ticket_invalid')).toMatchObject({ status: 401, endpoint: null, remote_peer: buyer.peerId.toString() });
    expect(lines().filter((l) => l.msg === 'request' && l.status === 503).at(-1)).toMatchObject({ endpoint: 'chat/completions', code: 'no_capacity', remote_peer: buyer.peerId.toString() });
    expect(await (await fetch(`${node.opsUrl}/metrics`)).text()).toMatch(/^seller_ticket_refusals_total\{reason="ticket_invalid"\} 1$/m);

    // Refusals need no ticket, so their lines are bounded: at most 50 a second; the rest are counted,
    // and said in one warning once the next second begins (metrics count every one).
    const refusalLines = () => lines().filter((l) => l.msg === 'request' && l.code === 'model_not_found').length;
    const suppressed = () => lines().filter((l) => typeof l.suppressed === 'number').reduce((n, l) => n + (l.suppressed as number), 0);
    const ask = () => request(buyer!, addr, INFER_PROTOCOL, { endpoint: 'tokenize' }, utf8(JSON.stringify({ model: 'nobody/nothing', prompt: 'x' }))).then(readResponse);
    const burst = await Promise.all(Array.from({ length: 120 }, ask));
    expect(burst.every((r) => r.head.status === 404)).toBe(true);
    await new Promise((r) => setTimeout(r, 1100));
    expect((await ask()).head.status).toBe(404); // a new second: what was held back is said
    await until('the suppressed-lines warning and the last line', () => suppressed() > 0 && refusalLines() + suppressed() >= 121);
    expect(refusalLines() + suppressed()).toBe(121);
    expect(refusalLines()).toBeLessThan(121);
    expect(lines().find((l) => typeof l.suppressed === 'number')).toMatchObject({ level: 40, msg: expect.stringMatching(/refused request lines not logged \(more than 50 a second\)/) });
    expect(await (await fetch(`${node.opsUrl}/metrics`)).text()).toMatch(/seller_requests_total\{endpoint="tokenize",status="404"\} 121/);

    await node.stop(1000);
    node = undefined;
    // Every line the node wrote, from start to stop: none quotes the prompt.
    await until('the node stopped line', () => lines().some((l) => l.msg === 'node stopped'));
    const all = fs.readFileSync(logFile, 'utf8');
    expect(all).toContain('request handler failed');
    expect(all).not.toContain(SECRET);
    expect(all).not.toContain(SECRET.split(' ')[2]); // not even the unique word in it
    // At error level: the handler's line, and the receipt log's one line saying it has stopped (and why).
    expect(lines().filter((l) => l.level >= 50).map((l) => l.msg)).toEqual([
      expect.stringMatching(/^the receipt log has stopped, and paid work is refused until the node is restarted: receipt log write failed: UNIQUE constraint failed: receipt_batches\.first_seq/),
      'request handler failed',
    ]);
  });
});
