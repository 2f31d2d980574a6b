// A small paid chat request to a node started in-process (a ticket the test's market key signs),
// and the lines of a node's JSON log at one level: what the node-level tests share.
import crypto from 'node:crypto';
import fs from 'node:fs';
import { utf8 } from '../../attestation/bytes.ts';
import type { RunningNode } from '../../src/node.ts';
import type { Host } from '../../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../../src/p2p/infer-protocol.ts';
import { readResponse, request } from '../../src/p2p/request-stream.ts';
import { signTicket, ticketPayload, type TestKey } from './receipts.ts';

/** Sends `chat/completions` with `body` (a short default) under a fresh ticket for exactly those bytes. */
export async function askNode(buyer: Host, node: RunningNode, market: TestKey, opts: { idempotencyKey?: string; body?: object } = {}): Promise<Awaited<ReturnType<typeof readResponse>>> {
  const { res } = await openPaid(buyer, node, market, opts);
  return readResponse(res);
}

/** The same request, its response stream left to the caller; and the ticket's payload. */
export async function openPaid(buyer: Host, node: RunningNode, market: TestKey, opts: { idempotencyKey?: string; body?: object } = {}) {
  const body = utf8(JSON.stringify(opts.body ?? { model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }));
  const payload = ticketPayload(node.providerId, { model: 'tiny/llama', price_version: node.priceVersion, body_sha256: crypto.createHash('sha256').update(body).digest('hex'), max_cost_micro_usd: '100000' });
  const head = { endpoint: 'chat/completions', ticket: signTicket(market, payload), ...(opts.idempotencyKey ? { idempotency_key: opts.idempotencyKey } : {}) };
  return { payload, res: await request(buyer, node.addresses[0]!, INFER_PROTOCOL, head, body) };
}

/** The lines of a pino log file at `level` (40 warn, 50 error). */
export function logLines(file: string, level: number): { msg: string; [k: string]: unknown }[] {
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as { level: number; msg: string }).filter((l) => l.level === level);
}
