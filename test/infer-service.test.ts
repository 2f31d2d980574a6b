// The serving core end to end in-process: real llama.cpp (tiny model), real SQLite receipt log,
// real ticket gate; the transport is a recording response.
import crypto from 'node:crypto';
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import { TokenizerBusyError, TokenizerProcess } from '../adapters/tokenizer-process.ts';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { computeCost, formatUsd, maxOutputTokensWithin } from '../attestation/money.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { Admission } from '../src/dispatch/admission.ts';
import { TicketGate } from '../src/dispatch/ticket-gate.ts';
import { FreeWorkPace } from '../src/dispatch/free-work-pace.ts';
import { IdempotencyStore } from '../src/dispatch/idempotency.ts';
import { InferService, NodeStopping, type InferResponse, type ServedModel } from '../src/serve/infer-service.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { endpointsServed } from '../src/serve/contract.ts';
import { startServing, TEST_RATES, type Serving } from './helpers/serving.ts';

const market = testKey();
const node = testKey();
const rates = TEST_RATES;
let serving: Serving;
let adapter: Serving['adapter'];
let log: ReceiptLog;
let db: Serving['db'];
let service: InferService;
let model: ServedModel;

beforeAll(async () => {
  serving = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: market.id });
  ({ adapter, log, db, service, model } = serving);
});
afterAll(async () => {
  await serving?.close();
});

interface Recorded {
  head?: { status: number; headers: Record<string, string> };
  data: Uint8Array[];
  /** Per write: whether it asked to resolve only once sent (DataOptions.sent). */
  sent: boolean[];
  trailer?: Record<string, any>;
}

function recorder(opts: { failAfter?: number; failOn?: (b: Uint8Array) => boolean; onData?: (n: number) => void } = {}): { res: InferResponse; out: Recorded } {
  const out: Recorded = { data: [], sent: [] };
  return {
    out,
    res: {
      head: async (h) => void (out.head = h),
      data: async (b, o) => {
        if ((opts.failAfter !== undefined && out.data.length >= opts.failAfter) || opts.failOn?.(b)) throw new Error('stream closed');
        out.data.push(b);
        out.sent.push(o?.sent === true);
        opts.onData?.(out.data.length);
      },
      trailer: async (t) => void (out.trailer = t),
    },
  };
}

function request(endpoint: string, body: object | Uint8Array, over: Record<string, unknown> = {}, ticketOver = {}) {
  const bytes = body instanceof Uint8Array ? body : utf8(JSON.stringify(body));
  const ticket = signTicket(market, ticketPayload(node.id, { endpoint, model: 'tiny/llama', price_version: 'p1', body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000', ...ticketOver }));
  return { head: { endpoint, ticket, ...over }, body: bytes, signal: new AbortController().signal, ticket };
}

const text = (r: Recorded) => Buffer.concat(r.data).toString('utf8');
/** How many delta events (each at least one token) reached the buyer. */
const deltaEvents = (r: Recorded): number => text(r).split('\n\n').filter((e) => e.includes('"delta":{"content"')).length;
const sha = (r: Recorded) => crypto.createHash('sha256').update(Buffer.concat(r.data)).digest('hex');
/** Makes the runtime fail ('the GPU fell off the bus') after three chunks; the tokens it produced. */
function failAfterThreeChunks(): { produced: () => number; restore: () => void } {
  const generate = adapter.generate.bind(adapter);
  let produced = 0;
  adapter.generate = async function* (r) {
    const inner = generate(r);
    for (let i = 0; i < 3; i++) {
      const n = await inner.next();
      if (n.done) break;
      produced += n.value.tokens.length;
      yield n.value;
    }
    await inner.return(undefined as never);
    throw new Error('the GPU fell off the bus');
  };
  return { produced: () => produced, restore: () => void (adapter.generate = generate) };
}
const chatBody = { model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 20, seed: 11, temperature: 0.7 };

describe('InferService', () => {
  test('chat completion: body, exact usage and cost, a durable receipt that verifies and hashes what was sent', async () => {
    const { res, out } = recorder();
    const req = request('chat/completions', chatBody);
    await service.handle(req, res);
    expect(out.head).toMatchObject({ status: 200, headers: { 'content-type': 'application/json', 'x-request-id': expect.any(String) } });
    const body = JSON.parse(text(out));
    expect(body).toMatchObject({ object: 'chat.completion', model: 'tiny/llama', choices: [{ message: { role: 'assistant' } }], service: { request_id: expect.any(String) } });
    const inputTokens = await adapter.countInputTokens({ kind: 'chat', messages: chatBody.messages as never });
    expect(body.usage.prompt_tokens).toBe(inputTokens);
    expect(body.usage.completion_tokens).toBeLessThanOrEqual(20);
    expect(body.usage.cost).toBe(formatUsd(computeCost({ input_tokens: body.usage.prompt_tokens, output_tokens: body.usage.completion_tokens }, rates)));
    const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
    expect(v.ok).toBe(true);
    if (!v.ok) return;
    expect(v.value.payload).toMatchObject({ status: 'completed', request_id: body.service.request_id, usage: { input_tokens: body.usage.prompt_tokens, output_tokens: body.usage.completion_tokens }, response_sha256: sha(out) });
    expect(v.value.payload.request_sha256).toBe(crypto.createHash('sha256').update(req.body).digest('hex'));
    expect(log.byRequestId(body.service.request_id).map((r) => r.line)).toEqual([out.trailer!.receipt]);
    // The same seed gives the same answer: the basis of audit replay.
    const again = recorder();
    await service.handle(request('chat/completions', chatBody), again.res);
    expect(JSON.parse(text(again.out)).choices[0].message.content).toBe(body.choices[0].message.content);
  });

  test('the samplers a buyer sets reach the runtime: top_k 1 at temperature 1.5 answers what temperature 0 does (and differs without it)', async () => {
    const answer = async (extra: object): Promise<string> => {
      const { res, out } = recorder();
      await service.handle(request('chat/completions', { ...chatBody, ...extra }), res);
      expect(out.head?.status).toBe(200);
      return JSON.parse(text(out)).choices[0].message.content as string;
    };
    const greedy = await answer({ temperature: 0 });
    expect(await answer({ temperature: 1.5, seed: 3 })).not.toBe(greedy);
    expect(await answer({ temperature: 1.5, seed: 3, top_k: 1 })).toBe(greedy);
  });

  test('a node that cannot take the request whatever it may wait (stopping, or every slot busy and the queue full) refuses it 503 before its ticket is used: the same ticket is still good (s29 review: it was spent)', async () => {
    for (const make of [
      () => {
        const a = new Admission({ slots: 1, queue: 0 });
        a.close();
        return { admission: a, why: /the node is shutting down/ };
      },
      () => {
        const a = new Admission({ slots: 1, queue: 0 });
        void a.acquire(); // (the slot held, no queue)
        return { admission: a, why: /all 1 slots are busy and 0 requests are waiting/ };
      },
    ]) {
      const { admission, why } = make();
      const refusing = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), models: new Map([[model.id, { ...model, admission }]]), priceVersion: 'p1' });
      const before = log.size;
      const req = request('chat/completions', chatBody);
      const refused = recorder();
      await refusing.handle(req, refused.res);
      expect(refused.out.head?.status).toBe(503);
      expect(refused.out.trailer?.error).toMatchObject({ code: 'no_capacity', message: expect.stringMatching(why) });
      expect(log.size).toBe(before);
      // The ticket was not spent: the same request is served where there is room.
      const served = recorder();
      await service.handle(req, served.res);
      expect(served.out.head?.status).toBe(200);
    }
  });

  test('a field outside the contract is refused before any work: 400 naming it, no receipt', async () => {
    const before = log.size;
    for (const extra of [{ mirostat: 2 }, { max_tokens: 10, max_completion_tokens: 3 }, { seed: 4294967295 }, { seed: -1 }]) {
      const { res, out } = recorder();
      await service.handle(request('chat/completions', { ...chatBody, ...extra }), res);
      expect(out.head?.status, JSON.stringify(extra)).toBe(400);
      expect(out.trailer?.error).toMatchObject({ code: 'invalid_request', message: expect.stringMatching(new RegExp(`^${Object.keys(extra).at(-1)}: `)) });
    }
    expect(log.size).toBe(before);
  });

  test('a paid input too long for the context by its length alone is refused before it is tokenised: 400 context_length_exceeded, no receipt', async () => {
    const before = log.size;
    const { res, out } = recorder();
    await service.handle(request('completions', { model: 'tiny/llama', prompt: 'hello world '.repeat(200_000), max_tokens: 4 }), res);
    expect(out.head?.status).toBe(400);
    expect(out.trailer?.error).toMatchObject({ code: 'context_length_exceeded', message: expect.stringMatching(/^an input of at least \d+ tokens \(2400000 bytes\) exceeds the model's context of \d+$/) });
    expect(log.size).toBe(before);
  });

  test('streams: chunks, a usage chunk only with include_usage, then [DONE]', async () => {
    for (const includeUsage of [true, false]) {
      const { res, out } = recorder();
      await service.handle(request('chat/completions', { ...chatBody, stream: true, stream_options: { include_usage: includeUsage } }), res);
      expect(out.head?.headers).toMatchObject({ 'content-type': 'text/event-stream', 'x-service-stream-mode': 'live' });
      const events = text(out).split('\n\n').filter(Boolean);
      expect(events.at(-1)).toBe('data: [DONE]');
      const parsed = events.slice(0, -1).map((e) => JSON.parse(e.slice('data: '.length)));
      expect(parsed[0].choices[0].delta.role).toBe('assistant');
      const usageChunks = parsed.filter((c) => c.usage);
      expect(usageChunks.length).toBe(includeUsage ? 1 : 0);
      const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
      expect(v).toMatchObject({ ok: true, value: { payload: { response_sha256: sha(out) } } });
      if (includeUsage && v.ok) expect(usageChunks[0].usage.completion_tokens).toBe(v.value.payload.usage.output_tokens);
    }
  });

  test('streamed tokens are written in sent mode (billed once handed over), the opening and closing events not; with an Idempotency-Key too', async () => {
    for (const keyed of [false, true]) {
      for (const [endpoint, body, token] of [
        ['chat/completions', { ...chatBody, stream: true }, '"delta":{"content"'],
        ['responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 20, seed: 11, stream: true }, 'response.output_text.delta'],
      ] as const) {
        const { res, out } = recorder();
        const over = keyed ? { idempotency_key: `sent-mode-${endpoint.replace('/', '-')}` } : {};
        await service.handle(request(endpoint, body, over), res);
        expect(out.trailer?.receipt).toBeDefined();
        const writes = out.data.map((b, i) => ({ token: Buffer.from(b).toString('utf8').includes(token), sent: out.sent[i] }));
        expect(writes.filter((w) => w.token).length).toBeGreaterThan(0);
        expect({ endpoint, over, writes: writes.filter((w) => w.token !== w.sent) }).toEqual({ endpoint, over, writes: [] });
      }
    }
  });

  test('a buyer who leaves mid-stream gets a cancelled receipt for exactly the tokens delivered', async () => {
    const ac = new AbortController();
    const { res, out } = recorder({ failAfter: 4, onData: (n) => n === 4 && ac.abort() });
    const req = { ...request('chat/completions', { ...chatBody, stream: true, max_tokens: 200 }), signal: ac.signal };
    await service.handle(req, res);
    const p = onlyReceiptOf(req);
    // 4 writes reached the buyer: the role event, then deltas (a few tokens a write, coalesced).
    // Every delta event carries at least one token; tokens still queued when the buyer left are
    // not billed; the hash covers exactly the bytes that were written.
    expect(p.status).toBe('cancelled');
    expect(p.usage.output_tokens).toBeGreaterThanOrEqual(deltaEvents(out));
    expect(p.usage.output_tokens).toBeLessThan(200);
    expect(p.response_sha256).toBe(sha(out));
  });

  test('buyers who leave mid-write free the runtime slot each time (one slot: later requests still run)', async () => {
    for (let i = 0; i < 3; i++) {
      // The write itself fails (the stream is gone) and the request's signal never fires.
      const { res } = recorder({ failAfter: 2 });
      await service.handle(request('chat/completions', { ...chatBody, stream: true, max_tokens: 300 }), res);
    }
    const { res, out } = recorder();
    await service.handle(request('chat/completions', chatBody), res);
    expect(out.head?.status).toBe(200);
    expect(out.trailer?.status).toBe('completed');
  });

  test('a write the stream refuses (the signal never fired) ends the run as cancelled, billed for what was delivered, with no runtime error', async () => {
    const { res, out } = recorder({ failAfter: 3 });
    const req = request('chat/completions', { ...chatBody, stream: true, max_tokens: 300 });
    await service.handle(req, res);
    expect(out.data).toHaveLength(3);
    expect(out.trailer).toMatchObject({ status: 'cancelled' });
    expect(out.trailer).not.toHaveProperty('error');
    const p = onlyReceiptOf(req);
    expect(p.status).toBe('cancelled');
    expect(p.response_sha256).toBe(sha(out));
    expect(p.usage.output_tokens).toBeGreaterThanOrEqual(deltaEvents(out));
    expect(p.usage.output_tokens).toBeLessThan(300);
    expect(BigInt(p.cost_micro_usd)).toBe(computeCost({ input_tokens: p.usage.input_tokens, output_tokens: p.usage.output_tokens }, rates));
  });

  test('a write refused after the run completed (the closing [DONE]) is cancelled too, billed for every token delivered', async () => {
    const body = { ...chatBody, stream: true, max_tokens: 12 };
    const whole = recorder();
    const first = request('chat/completions', body);
    await service.handle(first, whole.res);
    const completed = onlyReceiptOf(first);
    expect(completed.status).toBe('completed');
    const { res, out } = recorder({ failOn: (b) => Buffer.from(b).toString().includes('[DONE]') });
    const req = request('chat/completions', body);
    await service.handle(req, res);
    expect(text(out)).not.toContain('[DONE]');
    expect(out.trailer).toMatchObject({ status: 'cancelled' });
    expect(out.trailer).not.toHaveProperty('error');
    const p = onlyReceiptOf(req);
    expect(p.status).toBe('cancelled');
    // The same seed: the same run. Billed for the tokens whose text went out before the closing
    // write failed (at most what the completed run billed), the prompt in full.
    expect(p.usage.input_tokens).toBe(completed.usage.input_tokens);
    expect(p.usage.output_tokens).toBeGreaterThanOrEqual(deltaEvents(out));
    expect(p.usage.output_tokens).toBeLessThanOrEqual(completed.usage.output_tokens);
    expect(p.response_sha256).toBe(sha(out));
  });

  test('generation is capped so the worst case never exceeds the hold', async () => {
    const { res, out } = recorder();
    // Hold 20 micro-USD: input ~15 tokens × 0.15 = 3, so at most floor((20e6 - 15·150000) / 600000) outputs.
    await service.handle(request('chat/completions', { ...chatBody, max_tokens: 400 }, {}, { max_cost_micro_usd: '20' }), res);
    const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
    expect(v.ok).toBe(true);
    if (!v.ok) return;
    expect(BigInt(v.value.payload.cost_micro_usd) <= 20n).toBe(true);
    expect(v.value.payload.hold_micro_usd).toBe('20');
  });

  test('refusals: a code, nothing charged, no receipt', async () => {
    const before = log.size;
    const cases: [ReturnType<typeof request>, number, string][] = [
      [{ ...request('chat/completions', chatBody), body: utf8('{not json') }, 400, 'invalid_request'],
      [request('chat/completions', { ...chatBody, model: 'nope' }), 404, 'model_not_found'],
      [request('chat/completions', { ...chatBody, messages: [] }), 400, 'invalid_request'],
      [request('translate', chatBody), 400, 'invalid_request'],
      [{ ...request('chat/completions', chatBody), head: { endpoint: 'chat/completions' } } as never, 401, 'ticket_invalid'],
      [request('chat/completions', chatBody, {}, { provider: testKey().id }), 401, 'ticket_wrong_provider'],
      [request('chat/completions', chatBody, {}, { price_version: 'p0' }), 409, 'ticket_price_version_mismatch'],
      [request('chat/completions', chatBody, {}, { issued_at: Date.now() - 600_000, expires_at: Date.now() - 300_000 }), 401, 'ticket_expired'],
      [request('chat/completions', chatBody, {}, { body_sha256: '00'.repeat(32) }), 400, 'ticket_body_mismatch'],
      [request('chat/completions', chatBody, {}, { max_cost_micro_usd: '0' }), 403, 'request_cost_limit_exceeded'],
      [request('chat/completions', chatBody, {}, { routing: { quantization: 'q8-0' } }), 503, 'routing_unsatisfied'],
      [request('chat/completions', chatBody, {}, { routing: { min_context: 600 } }), 503, 'routing_unsatisfied'],
      // max_tokens beyond what the context leaves is refused, never quietly cut (context 512)
      [request('chat/completions', { ...chatBody, max_tokens: 600 }), 400, 'context_length_exceeded'],
      [request('chat/completions', { ...chatBody, max_tokens: 600 }, {}, { routing: { min_context: 100 } }), 400, 'context_length_exceeded'],
      [request('chat/completions', { ...chatBody, n: 3 }), 400, 'invalid_request'],
      // an input the context cannot hold is that, not a hold too small for it (no max_tokens, no cost cap)
      [request('completions', { model: 'tiny/llama', prompt: 'hello world '.repeat(400) }, {}, { max_cost_micro_usd: '1' }), 400, 'context_length_exceeded'],
      // each input is embedded on its own: one longer than the context is refused before any work
      [request('embeddings', { model: 'tiny/llama', input: ['hi', 'hello world '.repeat(400)] }), 400, 'context_length_exceeded'],
    ];
    for (const [req, status, code] of cases) {
      const { res, out } = recorder();
      await service.handle(req, res);
      expect([out.head?.status, out.trailer?.error?.code], code).toEqual([status, code]);
      expect(out.data.length).toBe(0);
    }
    const once = request('chat/completions', chatBody);
    await service.handle(once, recorder().res);
    const replay = recorder();
    await service.handle(once, replay.res);
    expect(replay.out.trailer?.error?.code).toBe('ticket_replayed');
    expect(log.size).toBe(before + 1);
  });

  test('no free slot within the wait: 503, nothing charged', async () => {
    const release = await model.admission.acquire();
    try {
      const { res, out } = recorder();
      const before = log.size;
      await service.handle(request('chat/completions', chatBody, {}, { routing: { max_wait_ms: 30 } }), res);
      expect([out.head?.status, out.trailer?.error?.code]).toEqual([503, 'no_capacity']);
      expect(log.size).toBe(before);
    } finally {
      release();
    }
  });

  test('tokenize and count_tokens: the runtime\'s own count, no ticket, no receipt', async () => {
    const before = log.size;
    const { res, out } = recorder();
    await service.handle({ head: { endpoint: 'tokenize' }, body: utf8(JSON.stringify({ model: 'tiny/llama', messages: chatBody.messages, return_tokens: true })), signal: new AbortController().signal }, res);
    const body = JSON.parse(text(out));
    expect(body.count).toBe(await adapter.countInputTokens({ kind: 'chat', messages: chatBody.messages as never }));
    expect(body.tokens.length).toBeGreaterThan(0);
    expect(log.size).toBe(before);
  });

  test('work a peer can ask for without paying stays small: free bodies bounded, free requests one at a time, a large paid body parsed only under its ticket', async () => {
    const { FREE_QUEUE, MAX_FREE_BODY, PARSED_BEFORE_TICKET } = await import('../src/serve/infer-service.ts');
    const free = (prompt: string) => ({ head: { endpoint: 'count_tokens' }, body: utf8(JSON.stringify({ model: 'tiny/llama', prompt })), signal: new AbortController().signal });
    const overhead = utf8(JSON.stringify({ model: 'tiny/llama', prompt: '' })).length;
    const atLimit = recorder();
    await service.handle(free('a'.repeat(MAX_FREE_BODY - overhead)), atLimit.res);
    expect(atLimit.out.head?.status).toBe(200);
    const over = recorder();
    await service.handle(free('a'.repeat(MAX_FREE_BODY - overhead + 1)), over.res);
    expect([over.out.head?.status, over.out.trailer?.error?.code]).toEqual([413, 'body_too_large']);
    // Many at once: one runs, FREE_QUEUE wait their turn, three more are refused at once (nothing is charged for any).
    const many = Array.from({ length: FREE_QUEUE + 4 }, () => recorder());
    await Promise.all(many.map((r) => service.handle(free('hello world'), r.res)));
    const statuses = many.map((r) => r.out.head?.status);
    expect(statuses.filter((x) => x === 200)).toHaveLength(FREE_QUEUE + 1);
    expect(many.filter((r) => r.out.head?.status === 503).map((r) => r.out.trailer?.error?.code)).toEqual(['no_capacity', 'no_capacity', 'no_capacity']);
    // A large paid body of deep nesting: without a ticket for it, refused on the ticket, never parsed.
    const before = log.size;
    const nested = utf8('['.repeat(PARSED_BEFORE_TICKET + 1));
    const unticketed = recorder();
    await service.handle({ head: { endpoint: 'chat/completions' }, body: nested, signal: new AbortController().signal }, unticketed.res);
    expect([unticketed.out.head?.status, unticketed.out.trailer?.error?.code]).toEqual([401, 'ticket_invalid']);
    const forBody = recorder(); // a ticket for other bytes
    await service.handle({ ...request('chat/completions', chatBody), body: nested }, forBody.res);
    expect([forBody.out.head?.status, forBody.out.trailer?.error?.code]).toEqual([400, 'ticket_body_mismatch']);
    // Under a ticket for exactly these bytes it is parsed, and refused for what it is.
    const ticketed = recorder();
    const t = signTicket(market, ticketPayload(node.id, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: 'p1', body_sha256: toHex(crypto.createHash('sha256').update(nested).digest()), max_cost_micro_usd: '100000' }));
    await service.handle({ head: { endpoint: 'chat/completions', ticket: t }, body: nested, signal: new AbortController().signal }, ticketed.res);
    expect([ticketed.out.head?.status, ticketed.out.trailer?.error?.code]).toEqual([400, 'invalid_request']);
    // A small one is parsed first, as before: its contract error names the field.
    const small = recorder();
    await service.handle({ head: { endpoint: 'chat/completions' }, body: utf8('{"model":"tiny/llama"}'), signal: new AbortController().signal }, small.res);
    expect([small.out.head?.status, small.out.trailer?.error?.code]).toEqual([400, 'invalid_request']);
    expect(log.size).toBe(before);
  });

  test('an idempotent retry gets the same answer and receipt, billed once, also after a restart', async () => {
    const before = log.size;
    const first = recorder();
    await service.handle(request('chat/completions', chatBody, { idempotency_key: 'retry-1' }), first.res);
    expect(first.out.head?.status).toBe(200);
    // The retry comes with a fresh ticket for the same request; it is answered from the record.
    const retry = recorder();
    await service.handle(request('chat/completions', chatBody, { idempotency_key: 'retry-1' }), retry.res);
    expect(text(retry.out)).toBe(text(first.out));
    expect(retry.out.trailer?.receipt).toBe(first.out.trailer?.receipt);
    expect(log.size).toBe(before + 1);
    // Another body under the same key is refused.
    const other = recorder();
    await service.handle(request('chat/completions', { ...chatBody, seed: 99 }, { idempotency_key: 'retry-1' }), other.res);
    expect([other.out.head?.status, other.out.trailer?.error?.code]).toEqual([409, 'idempotency_key_reused']);
    // A new store over the same database (a restart) still knows the answer.
    const restarted = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const late = recorder();
    await restarted.handle(request('chat/completions', chatBody, { idempotency_key: 'retry-1' }), late.res);
    expect(late.out.trailer?.receipt).toBe(first.out.trailer?.receipt);
    expect(log.size).toBe(before + 1);
    // A refused first attempt records nothing: the retry runs.
    const refused = recorder();
    await service.handle(request('chat/completions', chatBody, { idempotency_key: 'retry-2' }, { max_cost_micro_usd: '0' }), refused.res);
    expect(refused.out.head?.status).toBe(403);
    const ran = recorder();
    await service.handle(request('chat/completions', chatBody, { idempotency_key: 'retry-2' }), ran.res);
    expect(ran.out.head?.status).toBe(200);
    expect(log.size).toBe(before + 2);
    // Keys that are not 1 to 256 characters of well-formed Unicode are refused, nothing run or billed.
    for (const bad of ['', 'x'.repeat(257), 'lone \uD800 surrogate', 'lone \uDC00 low', 5]) {
      const r = recorder();
      await service.handle(request('chat/completions', chatBody, { idempotency_key: bad }), r.res);
      expect([r.out.head?.status, r.out.trailer?.error?.code], String(bad)).toEqual([400, 'invalid_request']);
    }
    expect(log.size).toBe(before + 2);
  });

  test('an idempotent answer is recorded before its trailer leaves: a retry while the trailer is still on its way is answered from the record', async () => {
    const before = log.size;
    let release!: () => void;
    const stuck = new Promise<void>((r) => (release = r));
    let trailerAt!: () => void;
    const atTrailer = new Promise<void>((r) => (trailerAt = r));
    const first = recorder();
    // The trailer's write does not complete (a buyer's connection stalled, or the node about to die).
    const slow: InferResponse = { ...first.res, trailer: async (t) => { first.out.trailer = t; trailerAt(); await stuck; } };
    const running = service.handle(request('chat/completions', chatBody, { idempotency_key: 'trailer-late' }), slow);
    await atTrailer;
    try {
      const retry = recorder();
      await service.handle(request('chat/completions', chatBody, { idempotency_key: 'trailer-late' }), retry.res);
      expect(retry.out.head?.status).toBe(200); // not 409 idempotency_in_progress
      expect(retry.out.trailer?.receipt).toBe(first.out.trailer?.receipt);
      expect(text(retry.out)).toBe(text(first.out));
    } finally {
      release();
    }
    await running;
    expect(log.size).toBe(before + 1);
  });

  test('a record that cannot be written (state.db full) still lets the trailer and its receipt out', async () => {
    const before = log.size;
    const store = new IdempotencyStore(db);
    let failed = 0;
    // As a full disk fails it: the running mark is dropped, then the write throws.
    const failing = new Proxy(store, {
      get: (t, p) =>
        p === 'finish'
          ? (account: string, key: string, response: unknown) => {
              const first = failed === 0 && response !== undefined;
              t.finish(account, key, undefined);
              if (first) {
                failed++;
                throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
              }
            }
          : Reflect.get(t, p),
    });
    const svc = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: failing, models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const first = recorder();
    await svc.handle(request('chat/completions', chatBody, { idempotency_key: 'disk-full' }), first.res);
    expect(failed).toBe(1);
    expect(first.out.head?.status).toBe(200);
    expect(typeof first.out.trailer?.receipt).toBe('string'); // the buyer has the receipt it is billed by
    expect(log.size).toBe(before + 1);
  });

  test('with the receipt log stopped: a recorded retry is still answered from its record; new paid work is refused 503, nothing run or kept', async () => {
    const first = recorder();
    await service.handle(request('chat/completions', chatBody, { idempotency_key: 'stopped-1' }), first.res);
    expect(first.out.head?.status).toBe(200);
    const before = log.size;
    // The same log, as the node sees it once a write has failed.
    const stoppedLog = new Proxy(log, { get: (t, p) => (p === 'failure' ? new Error('receipt log write failed: disk full') : Reflect.get(t, p)) });
    const stopped = new InferService({ log: stoppedLog, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const retry = recorder();
    await stopped.handle(request('chat/completions', chatBody, { idempotency_key: 'stopped-1' }), retry.res);
    expect(retry.out.trailer?.receipt).toBe(first.out.trailer?.receipt); // billed once, never sent elsewhere to run again
    for (const over of [{ idempotency_key: 'stopped-2' }, {}]) {
      const refused = recorder();
      await stopped.handle(request('chat/completions', chatBody, over), refused.res);
      expect([refused.out.head?.status, refused.out.trailer?.error?.code]).toEqual([503, 'no_capacity']);
    }
    expect(log.size).toBe(before);
    // The refused keyed request left nothing behind: once the node is healthy it runs.
    const later = recorder();
    await service.handle(request('chat/completions', chatBody, { idempotency_key: 'stopped-2' }), later.res);
    expect(later.out.head?.status).toBe(200);
    expect(log.size).toBe(before + 1);
  });

  test('a node that died after a keyed whole body\'s receipt was durable but before its response was recorded: the retry gets that answer and receipt, not run or billed again (s24 hC: it was 409 for good); a stream so is 409 idempotency_response_lost; one that died before any receipt runs the retry', async () => {
    const crashing = new IdempotencyStore(db);
    crashing.finish = () => {}; // the process dies before the trailer's record (the mark and what pending() wrote stay on disk)
    const dying = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: crashing, models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const before = log.size;
    const first = recorder();
    await dying.handle(request('chat/completions', chatBody, { idempotency_key: 'crash-1' }), first.res);
    expect(first.out.trailer?.status).toBe('completed');
    const streamed = recorder();
    await dying.handle(request('chat/completions', { ...chatBody, stream: true }, { idempotency_key: 'crash-3' }), streamed.res);
    expect(streamed.out.trailer?.status).toBe('completed');
    const notRun = recorder();
    await dying.handle(request('chat/completions', chatBody, { idempotency_key: 'crash-2' }, { max_cost_micro_usd: '0' }), notRun.res);
    expect(notRun.out.head?.status).toBe(403); // refused before any work: no receipt
    // The restarted node.
    const restarted = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1' });
    for (let i = 0; i < 2; i++) {
      const retry = recorder();
      await restarted.handle(request('chat/completions', chatBody, { idempotency_key: 'crash-1' }), retry.res);
      expect(retry.out.head).toEqual(first.out.head);
      expect(Buffer.concat(retry.out.data)).toEqual(Buffer.concat(first.out.data));
      expect(JSON.stringify(retry.out.trailer)).toBe(JSON.stringify(first.out.trailer)); // the same receipt, cost, usage: billed once
    }
    const lost = recorder();
    await restarted.handle(request('chat/completions', { ...chatBody, stream: true }, { idempotency_key: 'crash-3' }), lost.res);
    expect([lost.out.head?.status, lost.out.trailer?.error?.code]).toEqual([409, 'idempotency_response_lost']);
    expect(lost.out.trailer?.error?.message).toMatch(/completed \(receipt seq \d+ in this node's log\), but its response was not recorded/);
    expect(log.size).toBe(before + 2); // neither run again
    const again = recorder();
    await restarted.handle(request('chat/completions', { ...chatBody, seed: 5 }, { idempotency_key: 'crash-1' }), again.res);
    expect(again.out.trailer?.error?.code).toBe('idempotency_key_reused'); // another body under that key
    const runs = recorder();
    await restarted.handle(request('chat/completions', chatBody, { idempotency_key: 'crash-2' }), runs.res);
    expect(runs.out.trailer?.status).toBe('completed');
    expect(log.size).toBe(before + 3);
    // Recorded now: its retry is answered from the record.
    const replay = recorder();
    await restarted.handle(request('chat/completions', chatBody, { idempotency_key: 'crash-2' }), replay.res);
    expect(replay.out.trailer?.receipt).toBe(runs.out.trailer?.receipt);
  });

  test('a node that died after a keyed whole body was recorded but before its receipt was durable: the retry runs (once), and is then answered from its record', async () => {
    const crashing = new IdempotencyStore(db);
    crashing.finish = () => {};
    const dyingLog = new Proxy(log, { get: (t, p) => (p === 'append' ? () => Promise.reject(new Error('the process died')) : Reflect.get(t, p)) });
    const dying = new InferService({ log: dyingLog, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: crashing, models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const before = log.size;
    const first = recorder();
    await dying.handle(request('chat/completions', chatBody, { idempotency_key: 'no-receipt-1' }), first.res).catch(() => undefined);
    expect(first.out.head?.status).toBe(200);
    expect(first.out.trailer?.receipt).toBeUndefined();
    expect(log.size).toBe(before);
    const restarted = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const retry = recorder();
    await restarted.handle(request('chat/completions', chatBody, { idempotency_key: 'no-receipt-1' }), retry.res);
    expect(retry.out.trailer?.status).toBe('completed');
    expect(log.size).toBe(before + 1);
    const replay = recorder();
    await restarted.handle(request('chat/completions', chatBody, { idempotency_key: 'no-receipt-1' }), replay.res);
    expect(replay.out.trailer?.receipt).toBe(retry.out.trailer?.receipt);
    expect(log.size).toBe(before + 1);
  });

  test('an idempotency record the state store refuses: the buyer still gets the answer and its receipt, and the node says the store failed', async () => {
    const { StoreHealth } = await import('../src/store/store-health.ts');
    const state = new StoreHealth();
    const refusing = new IdempotencyStore(db);
    const finish = refusing.finish.bind(refusing);
    refusing.finish = (account, key, r, now) => {
      if (r) throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
      finish(account, key, r, now);
    };
    const svc = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: refusing, models: new Map([[model.id, model]]), priceVersion: 'p1', state });
    const { res, out } = recorder();
    await svc.handle(request('chat/completions', chatBody, { idempotency_key: 'unrecorded-1' }), res);
    expect(out.trailer?.status).toBe('completed');
    expect(typeof out.trailer?.receipt).toBe('string');
    expect(state.failure?.message).toBe('database or disk is full');
  });

  test('state.db full (a used ticket cannot be written): 503 no_capacity, nothing run, the failure reported once; a later write clears it', async () => {
    const { StoreHealth } = await import('../src/store/store-health.ts');
    let now = 1_000_000;
    const seen: string[] = [];
    const state = new StoreHealth({ now: () => now, onFailure: (e, first) => seen.push(`${first}:${(e as { code?: string }).code}`) });
    const internal: unknown[] = [];
    const svc = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1', state, onInternalError: (e) => internal.push(e) });
    const before = log.size;
    // A real SQLITE_FULL: the file may not grow past the pages it has.
    const pages = db.pragma('page_count', { simple: true }) as number;
    db.pragma(`max_page_count = ${pages}`);
    try {
      for (const over of [{}, { idempotency_key: 'full-1' }]) {
        let refused = recorder();
        // (fill the last free pages first: each refused try writes nothing)
        for (let i = 0; i < 500 && refused.out.head?.status !== 503; i++) {
          refused = recorder();
          await svc.handle(request('chat/completions', chatBody, over), refused.res);
        }
        expect([refused.out.head?.status, refused.out.trailer?.error?.code], JSON.stringify(refused.out.trailer)).toEqual([503, 'no_capacity']);
        expect(refused.out.trailer?.error?.message).toMatch(/state store failed: database or disk is full/);
      }
      expect(state.failure?.message).toBe('database or disk is full');
      expect(seen[0]).toBe('true:SQLITE_FULL');
      expect(seen.slice(1).every((x) => x === 'false:SQLITE_FULL')).toBe(true);
      expect(internal).toEqual([]); // not an internal error: the disk
      now += 30_000;
      expect(state.failure).toBeUndefined(); // tried again after the hold
    } finally {
      db.pragma('max_page_count = 1073741823');
    }
    const ok = recorder();
    await svc.handle(request('chat/completions', chatBody), ok.res);
    expect(ok.out.head?.status).toBe(200);
    expect(state.failure).toBeUndefined();
    expect(log.size).toBeGreaterThan(before);
  });

  test('a paid body over 64 KiB has its ticket verified once (before the parse), keyed or not', async () => {
    const { PARSED_BEFORE_TICKET } = await import('../src/serve/infer-service.ts');
    const gate = new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id });
    const vouch = gate.vouch.bind(gate);
    let vouches = 0;
    gate.vouch = (env, body) => (vouches++, vouch(env, body));
    const svc = new InferService({ log, gate, idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1' });
    // Over the size in JSON whitespace: still a small request.
    const big = utf8(JSON.stringify({ ...chatBody, max_tokens: 2 }) + ' '.repeat(PARSED_BEFORE_TICKET));
    for (const over of [{}, { idempotency_key: 'big-1' }]) {
      vouches = 0;
      const { res, out } = recorder();
      await svc.handle(request('chat/completions', big, over), res);
      expect(out.head?.status, JSON.stringify(out.trailer)).toBe(200);
      expect(vouches).toBe(1);
    }
  });

  test('an idempotent request verifies its ticket once, then records its use', async () => {
    const gate = new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id });
    const check = gate.check.bind(gate);
    let checks = 0;
    gate.check = (env, expect) => (checks++, check(env, expect));
    const svc = new InferService({ log, gate, idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: 'p1' });
    const { res, out } = recorder();
    const req = request('chat/completions', chatBody, { idempotency_key: 'once-1' });
    await svc.handle(req, res);
    expect(out.trailer?.status).toBe('completed');
    expect(checks).toBe(1);
    // The ticket is now used: the same ticket under another key is refused as a replay.
    const again = recorder();
    await svc.handle({ ...req, head: { ...req.head, idempotency_key: 'once-2' } }, again.res);
    expect(again.out.head?.status).toBe(409);
    expect(again.out.trailer?.error).toMatchObject({ code: 'ticket_replayed' });
  });

  test('responses: the responses body, and the responses event protocol without [DONE]', async () => {
    const plain = recorder();
    await service.handle(request('responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 12, seed: 2 }), plain.res);
    const body = JSON.parse(text(plain.out));
    expect(body).toMatchObject({ object: 'response', model: 'tiny/llama', output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text' }] }], service: { request_id: expect.any(String) } });
    expect(['completed', 'incomplete']).toContain(body.status);
    // The message itself says whether it was cut off, as the response does.
    expect(body.output[0].status).toBe(body.status);
    const v = verifyReceipt(plain.out.trailer!.receipt, { provider: node.id });
    expect(v).toMatchObject({ ok: true, value: { payload: { endpoint: 'responses', usage: { output_tokens: body.usage.output_tokens } } } });

    const streamed = recorder();
    await service.handle(request('responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 12, seed: 2, stream: true }), streamed.res);
    const events = text(streamed.out).split('\n\n').filter(Boolean).map((e) => {
      const [ev, data] = e.split('\n');
      return { event: ev!.slice('event: '.length), data: JSON.parse(data!.slice('data: '.length)) };
    });
    expect(text(streamed.out)).not.toContain('[DONE]');
    expect(events.map((e) => e.data.sequence_number)).toEqual(events.map((_, i) => i));
    expect(events.slice(0, 4).map((e) => e.event)).toEqual(['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
    expect(['response.completed', 'response.incomplete']).toContain(events.at(-1)!.event);
    const deltas = events.filter((e) => e.event === 'response.output_text.delta').map((e) => e.data.delta).join('');
    expect(events.find((e) => e.event === 'response.output_text.done')!.data.text).toBe(deltas);
    // Same seed, same words, whichever way they were delivered.
    expect(deltas).toBe(body.output[0].content[0].text);
    expect(events.at(-1)!.data.response.usage.output_tokens).toBe(body.usage.output_tokens);
    expect(events.find((e) => e.event === 'response.output_item.done')!.data.item.status).toBe(body.status);
    expect(events.at(-1)!.data.response.output[0].status).toBe(body.status);
    // Cut off by max_output_tokens: incomplete, the message too.
    const cut = recorder();
    await service.handle(request('responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 1, seed: 2 }), cut.res);
    expect(JSON.parse(text(cut.out))).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, output: [{ status: 'incomplete' }] });
  });

  test('embeddings: vectors, input tokens billed, a receipt', async () => {
    const { res, out } = recorder();
    await service.handle(request('embeddings', { model: 'tiny/llama', input: ['hello world', 'quick'] }), res);
    const body = JSON.parse(text(out));
    expect(body.data.map((d: { embedding: number[] }) => d.embedding.length)).toEqual([64, 64]);
    const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
    expect(v).toMatchObject({ ok: true, value: { payload: { usage: { input_tokens: body.usage.prompt_tokens, output_tokens: 0 } } } });
  });

  test('embeddings whose runtime fails: 500 runtime_failed naming why, nothing billed, the slot back', async () => {
    const embed = adapter.embed.bind(adapter);
    adapter.embed = async () => {
      throw new Error('the GPU fell off the bus');
    };
    const before = log.stats().receipts;
    const { res, out } = recorder();
    try {
      await service.handle(request('embeddings', { model: 'tiny/llama', input: ['hello world'] }), res);
    } finally {
      adapter.embed = embed;
    }
    expect(out.head?.status).toBe(500);
    expect(out.trailer).toEqual({ error: { code: 'runtime_failed', message: expect.stringMatching(/the GPU fell off the bus/) } });
    expect(log.stats().receipts).toBe(before);
    // The admission slot came back: the next request is served.
    const again = recorder();
    await service.handle(request('embeddings', { model: 'tiny/llama', input: ['hello world'] }), again.res);
    expect(again.out.head?.status).toBe(200);
  });

  test("a run the runtime finished before the node's stop cancelled it is answered in full and completed, whole body or stream (s30 review)", async () => {
    const generate = adapter.generate.bind(adapter);
    for (const stream of [false, true]) {
      const ac = new AbortController();
      // The stop's grace runs out just as the runtime ends the run.
      adapter.generate = async function* (r) {
        const done = yield* generate(r);
        ac.abort(new NodeStopping());
        return done;
      };
      const { res, out } = recorder();
      try {
        await service.handle({ ...request('chat/completions', { ...chatBody, stream }), signal: ac.signal }, res);
      } finally {
        adapter.generate = generate;
      }
      expect(ac.signal.aborted).toBe(true);
      expect(out.head?.status, `stream ${stream}`).toBe(200);
      expect(out.trailer?.error, `stream ${stream}`).toBeUndefined();
      const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
      if (!v.ok) throw new Error(v.error.message);
      expect(v.value.payload.status, `stream ${stream}`).toBe('completed');
      if (stream) expect(text(out)).toContain('data: [DONE]');
      else expect(JSON.parse(text(out)).choices[0].finish_reason).toMatch(/^(stop|length)$/);
    }
  });

  test("embeddings the node's own stop cut short: the buyer, still there, gets 503 no_capacity, nothing billed, no receipt (s30 review)", async () => {
    const embed = adapter.embed.bind(adapter);
    const ac = new AbortController();
    // The stop's grace runs out while the inputs are embedded.
    adapter.embed = async (inputs, known, signal) => {
      const r = await embed(inputs, known, signal);
      ac.abort(new NodeStopping());
      return r;
    };
    const before = log.stats().receipts;
    const { res, out } = recorder();
    try {
      await service.handle({ ...request('embeddings', { model: 'tiny/llama', input: ['hello world', 'quick'] }), signal: ac.signal }, res);
    } finally {
      adapter.embed = embed;
    }
    expect(out.head?.status).toBe(503);
    expect(out.trailer).toEqual({ error: { code: 'no_capacity', message: 'the node stopped before the answer was complete; nothing was billed, another provider can take it' } });
    expect(out.data).toEqual([]);
    expect(log.stats().receipts).toBe(before);
  });

  test('embeddings whose buyer leaves: the signal reaches the runtime, and a cancelled receipt bills the inputs it embedded before stopping, none if they left before it began', async () => {
    const input = ['hello world', 'hello', 'world hello', 'hello hello world', 'world'];
    const tokensOf = async (i: number) => adapter.countInputTokens({ kind: 'prompt', prompt: input[i]! });
    const embed = adapter.embed.bind(adapter);
    for (const leaveAfter of [0, 2]) {
      const ac = new AbortController();
      let started = 0;
      // The runtime, input by input, honouring the signal as the embedded adapter does (its own
      // test holds that); the buyer leaves once `leaveAfter` inputs are embedded.
      adapter.embed = async (inputs, known, signal) => {
        if (leaveAfter === 0) ac.abort();
        const out = { vectors: [] as number[][], inputTokens: 0 };
        for (let i = 0; i < inputs.length; i++) {
          if (signal?.aborted) break;
          const one = await embed([inputs[i]!], known && [known[i]!]);
          out.vectors.push(one.vectors[0]!);
          out.inputTokens += one.inputTokens;
          if (++started === leaveAfter) ac.abort();
        }
        return out;
      };
      const { res, out } = recorder();
      try {
        await service.handle({ ...request('embeddings', { model: 'tiny/llama', input }), signal: ac.signal }, res);
      } finally {
        adapter.embed = embed;
      }
      expect(out.data, `left after ${leaveAfter}`).toEqual([]);
      const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
      if (!v.ok) throw new Error(v.error.message);
      let billed = 0;
      for (let i = 0; i < leaveAfter; i++) billed += await tokensOf(i);
      expect(v.value.payload, `left after ${leaveAfter}`).toMatchObject({ status: 'cancelled', usage: { input_tokens: billed, output_tokens: 0 }, cost_micro_usd: computeCost({ input_tokens: billed, output_tokens: 0 }, rates).toString(), response_sha256: sha(out) });
    }
  });

  test('embeddings whose input costs more than the hold are refused before any work: 403, no receipt', async () => {
    const { res, out } = recorder();
    const before = log.stats().receipts;
    const embed = adapter.embed.bind(adapter);
    let embedded = 0;
    adapter.embed = (inputs) => (embedded++, embed(inputs));
    const req = request('embeddings', { model: 'tiny/llama', input: ['hello world '.repeat(50)] }, {}, { max_cost_micro_usd: '1' });
    try {
      await service.handle(req, res);
    } finally {
      adapter.embed = embed;
    }
    expect(embedded).toBe(0);
    expect(out.head?.status).toBe(403);
    expect(out.trailer?.error).toMatchObject({ code: 'request_cost_limit_exceeded', message: expect.stringMatching(/above the hold/) });
    expect(out.data).toEqual([]);
    await log.flush();
    expect(log.stats().receipts).toBe(before);
  });
});

/** The request id a test ticket carries. */
const idOf = (req: ReturnType<typeof request>): string => JSON.parse(Buffer.from(req.ticket.payload, 'base64').toString()).request_id;

/** The one durable receipt the log holds for a request, verified: its payload. */
function onlyReceiptOf(req: ReturnType<typeof request>) {
  const lines = log.byRequestId(idOf(req));
  expect(lines).toHaveLength(1);
  const v = verifyReceipt(lines[0]!.line, { provider: node.id });
  if (!v.ok) throw new Error(v.error.message);
  return v.value.payload;
}

describe('charging exactly the work performed', () => {
  test('a buyer who leaves before the runtime starts: a cancelled receipt billing nothing', async () => {
    const ac = new AbortController();
    const { res } = recorder();
    const head = res.head;
    res.head = async (h) => {
      await head(h);
      ac.abort(); // gone right after the HEAD: before the prompt reaches the runtime
    };
    const req = { ...request('chat/completions', { ...chatBody, stream: true }), signal: ac.signal };
    await service.handle(req, res);
    expect(onlyReceiptOf(req)).toMatchObject({ status: 'cancelled', usage: { input_tokens: 0, output_tokens: 0 }, cost_micro_usd: '0', first_token_at: null });
  });

  test('a cancelled stream bills only tokens whose text was written, not text still held back for a stop sequence', async () => {
    // Every chunk after the first is held back (empty text): only the first token reached the buyer.
    const generate = adapter.generate.bind(adapter);
    adapter.generate = async function* (r) {
      yield { text: 'Hello', tokens: [1] };
      yield { text: '', tokens: [2] };
      yield { text: '', tokens: [3] };
      throw new Error('the buyer left'); // stands in for the stream going away
    };
    const ac = new AbortController();
    const { res, out } = recorder();
    const data = res.data;
    let writes = 0;
    res.data = async (b) => {
      await data(b);
      if (++writes === 2) ac.abort(); // the role event, then "Hello"
    };
    const req = { ...request('chat/completions', { ...chatBody, stream: true, stop: ['XYZ'] }), signal: ac.signal };
    try {
      await service.handle(req, res);
    } finally {
      adapter.generate = generate;
    }
    const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
    if (!v.ok) throw new Error(v.error.message);
    expect(v.value.payload).toMatchObject({ status: 'cancelled', usage: { output_tokens: 1 }, response_sha256: sha(out) });
  });

  test('a cancelled stream does not bill a token whose text went out only in part (the rest held back for a possible stop, or cut by one)', async () => {
    // Greedy, the answer starts "quee lit"; with stop "ee!" the first token "quee" sends "qu" and holds
    // "ee"; with stop "e" it sends "qu" and the run ends there. The buyer resets after "qu".
    for (const stop of ['ee!', 'e']) {
      let sentQu = false;
      const { res, out } = recorder({
        failOn: (b) => {
          if (sentQu) return true;
          sentQu = Buffer.from(b).toString('utf8').includes('"content":"qu"');
          return false;
        },
      });
      await service.handle(request('chat/completions', { ...chatBody, temperature: 0, stream: true, stop: [stop] }), res);
      expect(sentQu, stop).toBe(true); // (the premise)
      expect(text(out), stop).not.toContain('quee');
      const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
      if (!v.ok) throw new Error(v.error.message);
      expect(v.value.payload, stop).toMatchObject({ status: 'cancelled', usage: { output_tokens: 0 }, response_sha256: sha(out) });
    }
  });

  test('a run that fails mid-stream: the trailer carries an error envelope beside the receipt for what was delivered', async () => {
    const failing = failAfterThreeChunks();
    const { res, out } = recorder();
    try {
      await service.handle(request('chat/completions', { ...chatBody, stream: true, max_tokens: 50 }), res);
    } finally {
      failing.restore();
    }
    const produced = failing.produced();
    expect(out.trailer).toMatchObject({ status: 'failed', error: { code: 'runtime_failed', message: expect.stringMatching(/the GPU fell off the bus/) } });
    const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
    if (!v.ok) throw new Error(v.error.message);
    expect(produced).toBeGreaterThan(0);
    expect(v.value.payload).toMatchObject({ status: 'failed', usage: { output_tokens: produced }, response_sha256: sha(out) });
    expect(text(out)).not.toContain('[DONE]');
  });

  test('a whole-body run that fails: no body, the error beside a receipt billing the evaluated prompt and no output (the buyer got none)', async () => {
    for (const endpoint of ['chat/completions', 'completions', 'responses'] as const) {
      const failing = failAfterThreeChunks();
      const body = endpoint === 'chat/completions' ? { ...chatBody, max_tokens: 50 } : endpoint === 'completions' ? { model: 'tiny/llama', prompt: 'hello', max_tokens: 50 } : { model: 'tiny/llama', input: 'hello', max_output_tokens: 50 };
      const { res, out } = recorder();
      try {
        await service.handle(request(endpoint, body), res);
      } finally {
        failing.restore();
      }
      expect(failing.produced(), endpoint).toBeGreaterThan(0);
      expect(text(out), endpoint).toBe('');
      expect(out.trailer, endpoint).toMatchObject({ status: 'failed', error: { code: 'runtime_failed', message: expect.stringMatching(/the GPU fell off the bus/) } });
      const v = verifyReceipt(out.trailer!.receipt, { provider: node.id });
      if (!v.ok) throw new Error(v.error.message);
      const input = v.value.payload.usage.input_tokens;
      expect(input, endpoint).toBeGreaterThan(0);
      expect(v.value.payload, endpoint).toMatchObject({ status: 'failed', usage: { input_tokens: input, output_tokens: 0 }, cost_micro_usd: computeCost({ input_tokens: input, output_tokens: 0 }, rates).toString(), response_sha256: sha(out) });
    }
  });

  test('a hold that covers the input but not one output token: 403 request_cost_limit_exceeded, no receipt', async () => {
    const messages = [{ role: 'user', content: 'hi' }];
    const n = await adapter.countInputTokens({ kind: 'chat', messages: messages as never });
    // The largest hold that covers the input and still buys no output token.
    let hold = computeCost({ input_tokens: n, output_tokens: 0 }, rates);
    while (maxOutputTokensWithin(hold + 1n, n, rates) < 1) hold++;
    expect(maxOutputTokensWithin(hold, n, rates)).toBe(0);
    const before = log.size;
    const { res, out } = recorder();
    await service.handle(request('chat/completions', { ...chatBody, messages }, {}, { max_cost_micro_usd: hold.toString() }), res);
    expect([out.head?.status, out.trailer?.error?.code]).toEqual([403, 'request_cost_limit_exceeded']);
    expect(out.trailer?.error?.message).toMatch(/not one output token/);
    expect(log.size).toBe(before);
  });
});

describe('embeddings', () => {
  test('the routing controls hold: price ceilings 403, quantization and tier 503, nothing charged', async () => {
    const before = log.size;
    const body = { model: 'tiny/llama', input: ['hello world'] };
    const cases: [object, number, string][] = [
      [{ max_input_price_micro_usd_per_mtok: '1' }, 403, 'price_ceiling_exceeded'],
      [{ min_attestation_tier: 'T3' }, 503, 'routing_unsatisfied'],
      [{ quantization: 'q4-0' }, 503, 'routing_unsatisfied'],
      [{ max_cost_micro_usd: '0' }, 403, 'request_cost_limit_exceeded'],
    ];
    for (const [routing, status, code] of cases) {
      const { res, out } = recorder();
      await service.handle(request('embeddings', body, {}, { routing }), res);
      expect([out.head?.status, out.trailer?.error?.code], JSON.stringify(routing)).toEqual([status, code]);
    }
    expect(log.size).toBe(before);
  });

  test('a buyer who leaves after the vectors were computed still gets a receipt for the work', async () => {
    const ac = new AbortController();
    const { res } = recorder({ failAfter: 0 });
    const head = res.head;
    res.head = async (h) => {
      await head(h);
      ac.abort();
    };
    const req = { ...request('embeddings', { model: 'tiny/llama', input: ['hello world'] }), signal: ac.signal };
    await service.handle(req, res);
    const n = await adapter.countInputTokens({ kind: 'prompt', prompt: 'hello world' });
    expect(onlyReceiptOf(req)).toMatchObject({ status: 'cancelled', usage: { input_tokens: n, output_tokens: 0 }, response_sha256: crypto.createHash('sha256').digest('hex') });
  });
});

describe('idempotency keys', () => {
  test('a request under a key whose buyer dropped is cancelled, billed for its work, not recorded: the retry runs', async () => {
    const before = log.size;
    const ac = new AbortController();
    // The connection drops as the answer starts: every write fails from the HEAD on.
    const dropped = { head: async () => (ac.abort(), Promise.reject(new Error('stream reset'))), data: async () => Promise.reject(new Error('stream reset')), trailer: async () => Promise.reject(new Error('stream reset')) } as InferResponse;
    const body = { ...chatBody, max_tokens: 30 };
    const first = request('chat/completions', body, { idempotency_key: 'net-drop' });
    await service.handle({ ...first, signal: ac.signal }, dropped);
    expect(onlyReceiptOf(first)).toMatchObject({ status: 'cancelled', usage: { input_tokens: 0, output_tokens: 0 }, cost_micro_usd: '0' });
    const retry = recorder();
    await service.handle(request('chat/completions', body, { idempotency_key: 'net-drop' }), retry.res);
    expect(retry.out.trailer?.status).toBe('completed');
    expect(log.size).toBe(before + 2);
  });

  test('a stream under a key still stops with its buyer (cancelled, billed for what was delivered); its retry runs again', async () => {
    const before = log.size;
    const ac = new AbortController();
    const { res } = recorder({ failAfter: 2, onData: (n) => n === 2 && ac.abort() });
    const body = { ...chatBody, stream: true, max_tokens: 200 };
    const firstReq = request('chat/completions', body, { idempotency_key: 'stream-drop' });
    await service.handle({ ...firstReq, signal: ac.signal }, res);
    const cancelled = onlyReceiptOf(firstReq);
    expect(cancelled.status).toBe('cancelled');
    expect(cancelled.usage.output_tokens).toBeLessThan(200);
    const retry = recorder();
    await service.handle(request('chat/completions', body, { idempotency_key: 'stream-drop' }), retry.res);
    expect(retry.out.trailer?.status).toBe('completed');
    expect(log.size).toBe(before + 2);
  });

  test('the same key and body sent to another endpoint is another request: 409, not the first answer', async () => {
    const body = { model: 'tiny/llama', input: 'hello' };
    const first = recorder();
    await service.handle(request('embeddings', body, { idempotency_key: 'xk-endpoint' }), first.res);
    expect(first.out.trailer?.status).toBe('completed');
    const second = recorder();
    await service.handle(request('responses', body, { idempotency_key: 'xk-endpoint' }), second.res);
    expect([second.out.head?.status, second.out.trailer?.error?.code]).toEqual([409, 'idempotency_key_reused']);
    expect(second.out.data).toEqual([]);
  });
});

describe("the tokenizer's child process with as many long inputs waiting as it queues", () => {
  test('a long chat, its count_tokens and a long prompt to tokenize are 503 no_capacity, nothing charged; the next request runs', async () => {
    const before = log.size;
    const long = Array.from({ length: 1200 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `turn ${i}` }));
    vi.spyOn(TokenizerProcess.prototype, 'render').mockRejectedValue(new TokenizerBusyError('8 long inputs are waiting for the tokenizer process already'));
    vi.spyOn(TokenizerProcess.prototype, 'tokenize').mockRejectedValue(new TokenizerBusyError('8 long inputs are waiting for the tokenizer process already'));
    try {
      for (const [endpoint, body] of [
        ['chat/completions', { model: 'tiny/llama', messages: long, max_tokens: 4 }],
        ['count_tokens', { model: 'tiny/llama', messages: long }],
        ['tokenize', { model: 'tiny/llama', prompt: 'hello world '.repeat(2000) }], // (24,000 characters: tokenised in the child)
      ] as const) {
        const { res, out } = recorder();
        await service.handle(request(endpoint, body), res);
        expect([out.head?.status, out.trailer?.error?.code], endpoint).toEqual([503, 'no_capacity']);
        expect(out.trailer?.error?.message).toMatch(/busy tokenising long inputs \(8 long inputs are waiting/);
        expect(out.data).toEqual([]);
      }
    } finally {
      vi.restoreAllMocks();
    }
    expect(log.size).toBe(before);
    const { res, out } = recorder();
    await service.handle(request('chat/completions', chatBody), res);
    expect(out.head?.status).toBe(200);
    expect(log.size).toBe(before + 1);
  });
});

describe('a model without a chat template (a base model\'s GGUF)', () => {
  let base: Serving;
  beforeAll(async () => {
    base = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: market.id, chatTemplate: null });
  });
  afterAll(async () => {
    await base?.close();
  });

  test('is sold for completions and embeddings only', () => {
    expect(base.adapter.info.chatTemplate).toBeNull();
    expect(endpointsServed(base.adapter.info)).toEqual(['completions', 'embeddings']);
    expect(endpointsServed(adapter.info)).toEqual(['chat/completions', 'completions', 'responses', 'embeddings']);
  });

  test('chat and responses are 404 model_not_found before the ticket is used, nothing charged; counting messages is 400 token_count_unsupported, never an estimate; prompts and embeddings run', async () => {
    const before = base.log.size;
    for (const [endpoint, body] of [
      ['chat/completions', chatBody],
      ['chat/completions', { ...chatBody, stream: true }],
      ['responses', { model: 'tiny/llama', input: 'hi', max_output_tokens: 4 }],
    ] as const) {
      const req = request(endpoint, body);
      for (let i = 0; i < 2; i++) {
        // Twice with the same ticket: refused for the model both times, never ticket_replayed (unused).
        const { res, out } = recorder();
        await base.service.handle(req, res);
        expect([out.head?.status, out.trailer?.error?.code], endpoint).toEqual([404, 'model_not_found']);
        expect(out.trailer?.error?.message).toBe(`model "tiny/llama" is not sold for ${endpoint} here: it has no chat template (it takes completions and embeddings)`);
        expect(out.data).toEqual([]);
      }
    }
    for (const endpoint of ['count_tokens', 'tokenize'] as const) {
      const { res, out } = recorder();
      await base.service.handle(request(endpoint, { model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }] }), res);
      expect([out.head?.status, out.trailer?.error?.code], endpoint).toEqual([400, 'token_count_unsupported']);
    }
    expect(base.log.size).toBe(before);
    for (const [endpoint, body] of [
      ['count_tokens', { model: 'tiny/llama', prompt: 'hi' }],
      ['completions', { model: 'tiny/llama', prompt: 'hi', max_tokens: 4 }],
      ['embeddings', { model: 'tiny/llama', input: 'hi' }],
    ] as const) {
      const { res, out } = recorder();
      await base.service.handle(request(endpoint, body), res);
      expect(out.head?.status, endpoint).toBe(200);
    }
    expect(base.log.size).toBe(before + 2);
  });
});

describe('a chat template that refuses the messages (as Gemma\'s refuses a system message)', () => {
  const REFUSING = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  let strict: Serving;
  beforeAll(async () => {
    strict = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: market.id, chatTemplate: REFUSING });
  });
  afterAll(async () => {
    await strict?.close();
  });

  test('chat, count_tokens and tokenize answer 400 invalid_request with the template\'s message; nothing charged; other messages run', async () => {
    const before = strict.log.size;
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }];
    for (const [endpoint, body] of [
      ['chat/completions', { model: 'tiny/llama', messages, max_tokens: 4 }],
      ['chat/completions', { model: 'tiny/llama', messages, max_tokens: 4, stream: true }],
      ['count_tokens', { model: 'tiny/llama', messages }],
      ['tokenize', { model: 'tiny/llama', messages }],
    ] as const) {
      const { res, out } = recorder();
      await strict.service.handle(request(endpoint, body), res);
      expect([out.head?.status, out.trailer?.error?.code], endpoint).toEqual([400, 'invalid_request']);
      expect(out.trailer?.error?.message).toMatch(/chat template refuses them: System role not supported/);
      expect(out.data).toEqual([]);
    }
    expect(strict.log.size).toBe(before);
    const { res, out } = recorder();
    await strict.service.handle(request('chat/completions', { model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }), res);
    expect(out.head?.status).toBe(200);
    expect(strict.log.size).toBe(before + 1);
  });
});

describe('a model whose file was modified in place while served', () => {
  test('paid requests for it are refused 503 no_capacity before the ticket is used, nothing charged; free ones still count', async () => {
    const before = log.size;
    adapter.modelFileState = () => 'modified';
    try {
      const req = request('chat/completions', chatBody);
      const refused = recorder();
      await service.handle(req, refused.res);
      expect([refused.out.head?.status, refused.out.trailer?.error?.code]).toEqual([503, 'no_capacity']);
      expect(refused.out.trailer?.error?.message).toMatch(/^model tiny\/llama: its file was modified in place while the node served it, so the weights it runs may no longer be those of model_sha256 [0-9a-f]{64}; the node serves it again once restarted$/);
      expect(log.size).toBe(before);
      const free = recorder();
      await service.handle({ head: { endpoint: 'count_tokens' }, body: utf8(JSON.stringify({ model: 'tiny/llama', prompt: 'hi' })), signal: new AbortController().signal }, free.res);
      expect(free.out.head?.status).toBe(200);
      delete (adapter as { modelFileState?: unknown }).modelFileState; // back to the class's own
      // The ticket was not used: the same request runs once the model is served again (here: the check passes).
      const ran = recorder();
      await service.handle(req, ran.res);
      expect(ran.out.head?.status).toBe(200);
      expect(log.size).toBe(before + 1);
    } finally {
      delete (adapter as { modelFileState?: unknown }).modelFileState;
    }
  });
});

describe('free requests take at most a quarter of the node\'s time, so unpaid work cannot starve paid streams', () => {
  /** A service whose pace runs on a clock the test moves; each tokenization "takes" `cost` ms of it. */
  function paced() {
    let t = 0;
    let cost = 0;
    const pace = new FreeWorkPace({ now: () => t });
    const inputTokens = adapter.inputTokens.bind(adapter);
    adapter.inputTokens = async (...a: Parameters<typeof inputTokens>) => {
      t += cost;
      return inputTokens(...a);
    };
    const svc = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), models: new Map([[model.id, model]]), priceVersion: 'p1', freePace: pace });
    const count = async (signal = new AbortController().signal) => {
      const r = recorder();
      await svc.handle({ head: { endpoint: 'count_tokens' }, body: utf8(JSON.stringify({ model: 'tiny/llama', prompt: 'hello world' })), signal }, r.res);
      return r.out;
    };
    return { count, advance: (ms: number) => void (t += ms), costs: (ms: number) => void (cost = ms), restore: () => void (adapter.inputTokens = inputTokens) };
  }

  test('after free work that took d ms the next waits 3d; a wait past the free deadline (2 s) is 503 no_capacity at once, one within it is waited out; nothing logged', async () => {
    const p = paced();
    try {
      const before = log.size;
      p.costs(1000);
      expect((await p.count()).head?.status).toBe(200);
      p.costs(0);
      const refused = await p.count();
      expect([refused.head?.status, refused.trailer?.error?.code]).toEqual([503, 'no_capacity']);
      expect(refused.trailer?.error?.message).toBe("free requests (tokenize, count_tokens) take at most 25 % of this node's time: try again in 3000 ms");
      p.advance(2950); // 50 ms to go: waited out
      const waited = await p.count();
      expect(waited.head?.status).toBe(200);
      expect(JSON.parse(text(waited)).count).toBe(await adapter.countInputTokens({ kind: 'prompt', prompt: 'hello world' }));
      expect(log.size).toBe(before);
    } finally {
      p.restore();
    }
  });

  test('a buyer who leaves while its request waits out the pace: 503 request_abandoned, and the free turn passes on', async () => {
    const p = paced();
    try {
      p.costs(1000);
      expect((await p.count()).head?.status).toBe(200);
      p.costs(0);
      p.advance(1500); // 1.5 s still to wait: within the deadline, so it waits
      const leaving = new AbortController();
      const waiting = p.count(leaving.signal);
      setTimeout(() => leaving.abort(), 20);
      const gone = await waiting;
      expect([gone.head?.status, gone.trailer?.error?.code]).toEqual([503, 'request_abandoned']);
      p.advance(1500);
      expect((await p.count()).head?.status).toBe(200); // the one free turn was given back
    } finally {
      p.restore();
    }
  });

  test('a tokenization that fails still paces the next by the time it took', async () => {
    let t = 0;
    const pace = new FreeWorkPace({ now: () => t });
    await expect(pace.run(async () => {
      t += 100;
      throw new Error('template refused');
    })).rejects.toThrow('template refused');
    expect(pace.wait()).toBe(300);
    t += 300;
    expect(pace.wait()).toBe(0);
    expect(() => new FreeWorkPace({ share: 0 })).toThrow(RangeError);
  });
});

describe('every request is observed once (metrics and the request line), also one whose buyer is gone before its answer', () => {
  test('a buyer that leaves while queued: 503 request_abandoned with its request id, its ticket used, nothing billed', async () => {
    const { Admission } = await import('../src/dispatch/admission.ts');
    const events: import('../src/serve/infer-service.ts').InferEvent[] = [];
    const busy: ServedModel = { ...model, admission: new Admission({ slots: 1, queue: 4 }) };
    const svc = new InferService({ log, gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id }), models: new Map([[busy.id, busy]]), priceVersion: 'p1', observe: (e) => events.push(e) });
    const release = await busy.admission.acquire({}); // the one slot taken
    const receiptsBefore = log.size;
    const r = request('chat/completions', { model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    const ac = new AbortController();
    const gone: InferResponse = { head: async () => { throw new Error('stream reset'); }, data: async () => { throw new Error('stream reset'); }, trailer: async () => { throw new Error('stream reset'); } };
    const handled = svc.handle({ ...r, signal: ac.signal }, gone).then(() => 'answered', (e: unknown) => (e as { code?: string }).code);
    await new Promise((res) => setTimeout(res, 20));
    ac.abort();
    expect(await handled).toBe('request_abandoned');
    release();
    const requestId = (JSON.parse(Buffer.from(r.ticket.payload, 'base64').toString()) as { request_id: string }).request_id;
    expect(events).toEqual([{ endpoint: 'chat/completions', model: 'tiny/llama', status: 503, code: 'request_abandoned', requestId }]);
    expect(log.size).toBe(receiptsBefore); // nothing billed
    // Its ticket was used: the same ticket again is refused.
    const again = recorder();
    await svc.handle(r, again.res);
    expect(again.out.trailer?.error?.code).toBe('ticket_replayed');
    expect(events.at(-1)).toMatchObject({ status: 409, code: 'ticket_replayed' });
  });
});

describe('the clock stepping back (NTP) between the first token and the end', () => {
  test('the run still gets a valid receipt, finished_at >= first_token_at', async () => {
    const T = Date.now();
    let calls = 0;
    // handle() started, generate() started, first token, then the clock steps back 500 ms.
    const now = () => (++calls <= 2 ? T : calls === 3 ? T + 1000 : T + 500);
    const gate = new TicketGate({ db: db, marketplaceKeys: [{ publicKey: market.id }], providerId: node.id });
    const service = new InferService({ log: log, gate, models: new Map([[model.id, model]]), priceVersion: 'p1', now });
    const bytes = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 }));
    const ticket = signTicket(market, ticketPayload(node.id, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: 'p1', body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000' }));
    let trailer: Record<string, unknown> | undefined;
    let status = 0;
    const res: InferResponse = { head: async (h) => void (status = h.status), data: async () => undefined, trailer: async (t) => void (trailer = t) };
    await service.handle({ head: { endpoint: 'chat/completions', ticket }, body: bytes, signal: new AbortController().signal }, res).catch(() => undefined);
    expect(status).toBe(200);
    expect(typeof trailer?.receipt).toBe('string');
    const v = verifyReceipt(trailer!.receipt as string, { provider: node.id });
    expect(v.ok).toBe(true);
  });
});
