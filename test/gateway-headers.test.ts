// The gateway's pure pieces: X-Service-* headers → ticket routing, dial targets, URLs and --listen.
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, test, vi } from 'vitest';
import { peerIdFromSeed } from '../src/p2p/peer-id.ts';
import { parseListen } from '../src/cli/gateway.ts';
import { GatewayError } from '../src/gateway/errors.ts';
import { dialTarget } from '../src/gateway/dial-target.ts';
import { normalizeMarketUrl } from '../src/market-url.ts';
import { parseRoutingHeaders } from '../src/gateway/routing-headers.ts';
import { testKey } from './helpers/receipts.ts';

function refusal(headers: Record<string, string>): { status: number; code: string; message: string } {
  try {
    parseRoutingHeaders(headers);
  } catch (e) {
    if (e instanceof GatewayError) return { status: e.status, code: e.code, message: e.message };
    throw e;
  }
  throw new Error('accepted');
}

describe('X-Service-* routing headers', () => {
  test('no headers: no routing', () => {
    expect(parseRoutingHeaders({})).toEqual({ routing: {} });
  });

  test('each header becomes its ticket routing field, money exactly in micro-USD', () => {
    const p1 = 'AB'.repeat(32);
    const p2 = 'cd'.repeat(32);
    const r = parseRoutingHeaders({
      'x-service-min-att-tier': '3',
      'x-service-min-ctx': '4096',
      'x-service-quant': 'Q4_K_M',
      'x-service-prefer-providers': `${p1}, ${p2}`,
      'x-service-hedge': '0',
      'x-service-min-tok-s': '12.5',
      'x-service-max-wait-ms': '0',
      'x-service-max-cost-usd': '0.000001',
      'x-service-max-input-price-per-million-usd': '0.15',
      'x-service-max-output-price-per-million-usd': '12',
      'x-service-max-representative-request-price-usd': '1.234567',
    });
    expect(r).toEqual({
      routing: {
        min_attestation_tier: 'T3',
        min_context: 4096,
        quantization: 'q4-k-m',
        hedge: false,
        min_tokens_per_second: 12.5,
        max_wait_ms: 0,
        max_cost_micro_usd: '1',
        max_input_price_micro_usd_per_mtok: '150000',
        max_output_price_micro_usd_per_mtok: '12000000',
        max_request_price_micro_usd: '1234567',
      },
      preferredProviders: [p1.toLowerCase(), p2],
    });
    expect(parseRoutingHeaders({ 'x-service-min-att-tier': 'T4' }).routing.min_attestation_tier).toBe('T4');
    expect(parseRoutingHeaders({ 'x-service-min-att-tier': 't2' }).routing.min_attestation_tier).toBe('T2');
    expect(parseRoutingHeaders({ 'x-service-hedge': '1' }).routing.hedge).toBe(true);
    expect(parseRoutingHeaders({ 'x-service-min-ctx': '4294967295' }).routing.min_context).toBe(4294967295);
  });

  test.each([
    ['X-Service-Min-Att-Tier', '0'],
    ['X-Service-Min-Att-Tier', 'T5'],
    ['X-Service-Min-Att-Tier', 'gold'],
    ['X-Service-Min-Ctx', '0'],
    ['X-Service-Min-Ctx', '4294967296'],
    ['X-Service-Min-Ctx', '1.5'],
    ['X-Service-Quant', ''],
    ['X-Service-Quant', 'x'.repeat(33)],
    ['X-Service-Quant', 'q4 k'],
    ['X-Service-Prefer-Providers', ''],
    ['X-Service-Prefer-Providers', 'ab'.repeat(31)],
    ['X-Service-Prefer-Providers', `${'ab'.repeat(32)},${'ab'.repeat(32)}`],
    ['X-Service-Prefer-Providers', Array.from({ length: 65 }, (_, i) => i.toString(16).padStart(64, '0')).join(',')],
    ['X-Service-Hedge', 'true'],
    ['X-Service-Min-Tok-S', '0'],
    ['X-Service-Min-Tok-S', 'fast'],
    ['X-Service-Max-Wait-Ms', '-1'],
    ['X-Service-Max-Wait-Ms', '60001'],
    ['X-Service-Max-Cost-Usd', '1.0000001'],
    ['X-Service-Max-Cost-Usd', '$1'],
    ['X-Service-Max-Input-Price-Per-Million-Usd', '1e-3'],
    ['X-Service-Max-Output-Price-Per-Million-Usd', '-1'],
    ['X-Service-Max-Representative-Request-Price-Usd', '01.5'],
    ['X-Service-Estimate', 'short'],
    ['X-Service-Estimate', 'e'.repeat(129)],
  ])('%s: %j is 400 invalid_request naming the header', (name, value) => {
    const r = refusal({ [name.toLowerCase()]: value });
    expect(r).toMatchObject({ status: 400, code: 'invalid_request' });
    expect(r.message.startsWith(`${name}:`)).toBe(true);
  });

  test('a well-formed estimate id is taken; whether it is known is decided at execution', () => {
    expect(parseRoutingHeaders({ 'x-service-estimate': 'est_0123456789abcdef' }).estimateId).toBe('est_0123456789abcdef');
  });

  test('an X-Service-* header the API does not have is refused, naming the closest one; the API key\'s header and other headers pass', () => {
    expect(refusal({ 'x-service-max-cost': '0.000001' })).toMatchObject({ status: 400, code: 'invalid_request', message: 'X-Service-Max-Cost: not a header of this API (X-Service-Max-Cost-Usd?)' });
    expect(refusal({ 'x-service-min-attestation-tier': 'T4' }).message).toBe('X-Service-Min-Attestation-Tier: not a header of this API (X-Service-Min-Att-Tier?)');
    expect(refusal({ 'x-service-quantization': 'q4' }).message).toBe('X-Service-Quantization: not a header of this API (X-Service-Quant?)');
    expect(refusal({ 'x-service-colour': 'blue' }).message).toBe('X-Service-Colour: not a header of this API');
    expect(parseRoutingHeaders({ 'x-service-api-key': 'sk-svc-v1-whatever', 'x-request-id': 'mine', 'x-servicex': '1', 'x-service-min-ctx': '8' }).routing).toEqual({ min_context: 8 });
  });

  test('hedging cannot be combined with a preferred provider list', () => {
    expect(refusal({ 'x-service-prefer-providers': 'ab'.repeat(32), 'x-service-hedge': '1' }).message).toMatch(/^X-Service-Hedge: cannot be combined/);
  });
});

describe('dial targets', () => {
  const key = testKey();
  const peer = peerIdFromSeed(key.seed).toString();

  test('every address ends in the provider\'s own PeerId', () => {
    const t = dialTarget(key.id, peer, ['/ip4/127.0.0.1/tcp/4101', `/ip4/10.0.0.1/tcp/4101/p2p/${peer}`, '/ip4/10.0.0.2/tcp/1/p2p/' + peerIdFromSeed(testKey().seed).toString(), 'junk']);
    expect(t.map(String)).toEqual([`/ip4/127.0.0.1/tcp/4101/p2p/${peer}`, `/ip4/10.0.0.1/tcp/4101/p2p/${peer}`]);
  });

  test('a peer id that is not the provider\'s key, or no usable address, is refused', () => {
    expect(() => dialTarget(key.id, peerIdFromSeed(testKey().seed).toString(), ['/ip4/127.0.0.1/tcp/1'])).toThrow(/is not provider/);
    expect(() => dialTarget(key.id, peer, ['junk'])).toThrow(/no usable address/);
  });
});

describe('URLs and --listen', () => {
  test('market URLs', () => {
    expect(normalizeMarketUrl('http://127.0.0.1:11436/')).toBe('http://127.0.0.1:11436');
    expect(normalizeMarketUrl('http://127.0.0.1:11436/v1')).toBe('http://127.0.0.1:11436');
    expect(() => normalizeMarketUrl('ftp://x')).toThrow();
    expect(() => normalizeMarketUrl('nope')).toThrow();
    // A port fetch will not connect to: refused here, not met later as an opaque "fetch failed".
    expect(() => normalizeMarketUrl('http://127.0.0.1:6000')).toThrow('market URL "http://127.0.0.1:6000": port 6000 is one that fetch');
    expect(() => normalizeMarketUrl('http://market.example:10080/v1')).toThrow(/port 10080/);
    expect(normalizeMarketUrl('http://127.0.0.1:6001')).toBe('http://127.0.0.1:6001');
  });

  test('the ports refused as ones fetch will not connect to are exactly those that fetch refuses', async () => {
    const { fetchRefusesPort } = await import('../src/fetch-ports.ts');
    // Every refused port and its two neighbours, against this Node's fetch: a refused port fails
    // before connecting ("bad port"); any other port here reaches the TCP connect, refused or not.
    const ports = new Set<number>();
    for (let p = 1; p <= 65535; p++) if (fetchRefusesPort(p)) for (const q of [p - 1, p, p + 1]) if (q >= 1 && q <= 65535) ports.add(q);
    expect(ports.size).toBeGreaterThan(150);
    for (const p of ports) {
      const why = await fetch(`http://127.0.0.1:${p}/`, { signal: AbortSignal.timeout(2000) }).then(
        () => 'answered',
        (e: { cause?: { message?: string } }) => e.cause?.message ?? 'failed',
      );
      expect(why === 'bad port', `port ${p}`).toBe(fetchRefusesPort(p));
    }
  });

  test('--listen', () => {
    expect(parseListen('127.0.0.1:11435')).toEqual({ host: '127.0.0.1', port: 11435 });
    expect(() => parseListen('127.0.0.1:6666')).toThrow('--listen: port 6666 is one that fetch (Node, browsers, the openai client) refuses to connect to');
    expect(parseListen('[::1]:8080')).toEqual({ host: '::1', port: 8080 });
    expect(parseListen('localhost')).toEqual({ host: 'localhost', port: 11435 });
    expect(() => parseListen('127.0.0.1:99999')).toThrow();
    expect(() => parseListen('a:b:c')).toThrow();
  });
});

describe('a gateway whose marketplace does not answer', () => {
  test('paid and free requests get 502 market_unreachable in the error envelope; the gateway stays up', async () => {
    const { createGateway } = await import('../src/gateway/gateway.ts');
    // Port 2 on loopback: nothing listens, the connection is refused at once.
    const gw = await createGateway({ market: 'http://127.0.0.1:2', port: 0, marketTimeoutMs: 2000 });
    try {
      for (const [endpoint, body] of [
        ['chat/completions', { model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }] }],
        ['tokenize', { model: 'tiny/llama', prompt: 'hi' }],
      ] as const) {
        const r = await fetch(`${gw.url}/${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
        expect(r.status, endpoint).toBe(502);
        expect(((await r.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'market_unreachable', message: 'the marketplace at http://127.0.0.1:2 did not answer (ECONNREFUSED)' });
      }
      expect((await fetch(`${gw.url}/models`)).status).toBe(502);
      // A body over the limit is refused before the market is asked anything.
      const { MAX_REQUEST_BODY } = await import('../src/serve/contract.ts');
      const big = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: 'x'.repeat(MAX_REQUEST_BODY + 1) });
      expect(big.status).toBe(413);
      expect(((await big.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'request_too_large', message: expect.stringContaining(String(MAX_REQUEST_BODY)) });
      expect((await fetch(`${gw.url}/models`)).status).toBe(502); // still up
      // 8 MB of nesting (JSON.parse alone held the event loop ~1 s): refused unparsed, before the market is asked.
      const { MAX_JSON_DEPTH } = await import('../src/json-depth.ts');
      const deep = `{"model":"tiny/llama","messages":[{"role":"user","content":"hi"}],"metadata":{"a":${'['.repeat(4_000_000)}${']'.repeat(4_000_000)}}}`;
      for (const [endpoint, body] of [['chat/completions', deep], ['tokenize', deep], ['estimates', `{"endpoint":"chat/completions","body":${deep}}`]] as const) {
        const r = await fetch(`${gw.url}/${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
        expect([r.status, ((await r.json()) as { error: unknown }).error], endpoint).toEqual([400, { code: 'invalid_request', message: expect.stringContaining(`nests objects and arrays more than ${MAX_JSON_DEPTH} deep`) }]);
      }
      // A compressed body is refused naming Content-Encoding, before the market is asked.
      const { gzipSync } = await import('node:zlib');
      const gz = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' }, body: gzipSync(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }] })) });
      expect([gz.status, ((await gz.json()) as { error: { code: string; message: string } }).error]).toEqual([400, { code: 'invalid_request', message: 'Content-Encoding: "gzip" is not accepted: send the JSON body uncompressed' }]);
      // identity, or an empty header, is no encoding: on to the market (unreachable here).
      for (const coding of ['identity', '', ' Identity ']) {
        const plain = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': coding }, body: JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }] }) });
        expect(plain.status, JSON.stringify(coding)).toBe(502);
      }
      // A path served under other methods: 405 with Allow (no market needed to say so); an unknown path 404.
      for (const [method, path, allow] of [['GET', 'chat/completions', 'POST'], ['PUT', 'embeddings', 'POST'], ['DELETE', 'requests/req-x', 'GET, HEAD'], ['POST', 'models/tiny/llama', 'GET, HEAD']] as const) {
        const r = await fetch(`${gw.url}/${path}`, { method });
        expect([r.status, r.headers.get('allow'), ((await r.json()) as { error: { code: string } }).error.code], `${method} ${path}`).toEqual([405, allow, 'method_not_allowed']);
      }
      const none = await fetch(`${gw.url}/nothing/here`);
      expect([none.status, ((await none.json()) as { error: { code: string } }).error.code]).toEqual([404, 'not_found']);
      expect(gw.records.size).toBe(0); // nothing was paid for, nothing recorded
    } finally {
      await gw.close();
    }
  });
});

describe('closing a gateway', () => {
  test('a shutdown step that fails is logged and the steps after it still run: libp2p stops, the records file closes', async () => {
    const { createGateway } = await import('../src/gateway/gateway.ts');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-close-'));
    const recordsPath = path.join(dir, 'records.db');
    try {
      const warned: { step?: unknown; err?: unknown; msg?: string }[] = [];
      const logger = { info: () => undefined, error: () => undefined, warn: (o: object, msg?: string) => void warned.push({ ...(o as object), msg }) };
      const gw = await createGateway({ market: 'http://127.0.0.1:2', port: 0, recordsPath, logger });
      const httpClose = gw.app.close.bind(gw.app);
      gw.app.close = (async () => {
        await httpClose();
        throw new Error('the HTTP server failed to close');
      }) as unknown as typeof gw.app.close;
      const closeRecords = vi.spyOn(gw.records, 'close');
      await gw.close(1000); // resolves: the failure is logged, not thrown
      expect(warned).toContainEqual({ step: 'http', err: 'the HTTP server failed to close', msg: 'shutdown step failed' });
      expect(gw.libp2p.status).toBe('stopped');
      expect(closeRecords).toHaveBeenCalledTimes(1);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('starting a gateway', () => {
  test('on a port already in use: the start fails naming the cause; started again on a free port with the same records file, it serves and closes', async () => {
    const { createGateway } = await import('../src/gateway/gateway.ts');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-start-'));
    const recordsPath = path.join(dir, 'records.db');
    const taken = net.createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const port = (taken.address() as net.AddressInfo).port;
    try {
      await expect(createGateway({ market: 'http://127.0.0.1:2', port, recordsPath })).rejects.toThrow(/EADDRINUSE/);
      // The same records file and a free port: starts, serves, closes.
      const gw = await createGateway({ market: 'http://127.0.0.1:2', port: 0, recordsPath });
      expect((await fetch(`${gw.url}/requests/req-none`)).status).toBe(404);
      await gw.close(1000);
      expect(gw.libp2p.status).toBe('stopped');
    } finally {
      await new Promise((r) => taken.close(r));
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
