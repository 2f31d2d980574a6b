import http from 'node:http';
import { afterEach, describe, expect, test } from 'vitest';
import { createLogger } from '../src/ops/logger.ts';
import { createMetrics, type Metrics } from '../src/ops/metrics.ts';
import { createOpsServer, isLoopbackHost, type OpsServer, type OpsServerOptions, type ReadyResult } from '../src/ops/server.ts';
import { stalledRequest } from './helpers/stalled-request.ts';

const JSON_TYPE = 'application/json; charset=utf-8';
const servers: OpsServer[] = [];

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function start(overrides: Partial<OpsServerOptions> = {}): Promise<{ url: string; metrics: Metrics; server: OpsServer }> {
  const metrics = (overrides.metrics as Metrics | undefined) ?? createMetrics({ defaultMetrics: false });
  const server = createOpsServer({
    port: 0,
    metrics,
    ready: () => ({ ready: true }),
    status: () => ({ provider_id: 'ab12', models: [{ id: 'llama', slots: 2, queue: 0 }], receipts: 10, uptime_s: 5 }),
    ...overrides,
  });
  servers.push(server);
  const { url } = await server.listen();
  return { url, metrics, server };
}

async function getJson(url: string, init?: RequestInit): Promise<{ status: number; type: string | null; body: unknown; headers: Headers }> {
  const res = await fetch(url, init);
  const text = await res.text();
  return { status: res.status, type: res.headers.get('content-type'), body: text === '' ? undefined : JSON.parse(text), headers: res.headers };
}

describe('ops server routes', () => {
  test('listens on 127.0.0.1 by default, port 0 picks a free port', async () => {
    const { url, server } = await start();
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const port = Number(new URL(url).port);
    expect(port).toBeGreaterThan(0);
    const addr = server.app.server.address();
    expect(typeof addr === 'object' && addr !== null ? addr.address : addr).toBe('127.0.0.1');
  });

  test('GET /healthz is 200 {status:"ok"} while the process is up', async () => {
    const { url } = await start();
    const r = await getJson(`${url}/healthz`);
    expect(r.status).toBe(200);
    expect(r.type).toBe(JSON_TYPE);
    expect(r.body).toEqual({ status: 'ok' });
    expect(r.headers.get('cache-control')).toBe('no-store');
  });

  test('GET /healthz passes health() details through and is 503 when not ok', async () => {
    let ok = true;
    const { url } = await start({ health: () => ({ ok, version: '0.1.0', writer: ok ? 'running' : 'dead' }) });
    expect(await getJson(`${url}/healthz`)).toMatchObject({ status: 200, body: { status: 'ok', version: '0.1.0', writer: 'running' } });
    ok = false;
    expect(await getJson(`${url}/healthz`)).toMatchObject({ status: 503, body: { status: 'unhealthy', writer: 'dead' } });
  });

  test('GET /readyz follows ready(): 200 when ready, 503 with the reasons otherwise', async () => {
    let state: ReadyResult = { ready: false, reasons: ['model llama loading', 'marketplace unreachable'] };
    const { url } = await start({ ready: async () => state });
    let r = await getJson(`${url}/readyz`);
    expect(r.status).toBe(503);
    expect(r.type).toBe(JSON_TYPE);
    expect(r.body).toEqual({ ready: false, reasons: ['model llama loading', 'marketplace unreachable'] });
    state = { ready: true };
    r = await getJson(`${url}/readyz`);
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ ready: true, reasons: [] });
    state = { ready: false };
    expect(await getJson(`${url}/readyz`)).toMatchObject({ status: 503, body: { ready: false, reasons: [] } });
  });

  test('GET /status returns what status() gives, bigints as decimal strings', async () => {
    let receipts = 10;
    const { url } = await start({
      status: () => ({ provider_id: 'ab12', models: [{ id: 'llama', slots: { total: 2, busy: 1 }, queue: 3 }], receipts: receipts++, earned_micro_usd: 2n ** 64n, uptime_s: 5 }),
    });
    const r = await getJson(`${url}/status`);
    expect(r.status).toBe(200);
    expect(r.type).toBe(JSON_TYPE);
    expect(r.body).toEqual({ provider_id: 'ab12', models: [{ id: 'llama', slots: { total: 2, busy: 1 }, queue: 3 }], receipts: 10, earned_micro_usd: '18446744073709551616', uptime_s: 5 });
    expect((await getJson(`${url}/status`)).body).toMatchObject({ receipts: 11 });
  });

  test('GET /metrics is the Prometheus exposition with the registry content type, values after incrementing', async () => {
    const { url, metrics } = await start({ metrics: createMetrics() });
    metrics.requests.inc({ endpoint: 'chat/completions', status: '200' });
    metrics.tokens.inc({ direction: 'out', model: 'llama' }, 42);
    metrics.earnings.add('llama', 9_007_199_254_740_991n);
    metrics.ticketRefusals.inc({ reason: 'bad_signature' });
    const res = await fetch(`${url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe(metrics.registry.contentType);
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const lines = (await res.text()).split('\n');
    expect(lines).toContain('seller_requests_total{endpoint="chat/completions",status="200"} 1');
    expect(lines).toContain('seller_tokens_total{direction="out",model="llama"} 42');
    expect(lines).toContain('seller_earnings_micro_usd_total{model="llama"} 9007199254740991');
    expect(lines).toContain('seller_ticket_refusals_total{reason="bad_signature"} 1');
    expect(lines.some((l) => l.startsWith('process_cpu_user_seconds_total '))).toBe(true);

    metrics.requests.inc({ endpoint: 'chat/completions', status: '200' });
    expect((await (await fetch(`${url}/metrics`)).text()).split('\n')).toContain('seller_requests_total{endpoint="chat/completions",status="200"} 2');
  });

  test('HEAD works on the GET routes', async () => {
    const { url } = await start();
    for (const path of ['/healthz', '/readyz', '/status', '/metrics']) {
      const res = await fetch(`${url}${path}`, { method: 'HEAD' });
      expect(res.status).toBe(200);
      expect(await res.text()).toBe('');
    }
  });
});

describe('ops server and DNS rebinding', () => {
  /** GET path with this Host header (fetch sends its own Host; node:http takes ours). */
  const withHost = (url: string, path: string, host: string): Promise<{ status: number; body: string }> =>
    new Promise((resolve, reject) => {
      const u = new URL(url);
      const req = http.request({ host: u.hostname, port: u.port, path, headers: { host } }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode!, body }));
      });
      req.on('error', reject);
      req.end();
    });

  test('on the loopback, a Host that is not the loopback is 403 host_not_allowed; the loopback in any spelling is served', async () => {
    const { url } = await start();
    const port = new URL(url).port;
    for (const host of ['evil.example', `evil.example:${port}`, `127.0.0.1.evil.example:${port}`]) {
      const r = await withHost(url, '/status', host);
      expect(r.status, host).toBe(403);
      expect(JSON.parse(r.body), host).toMatchObject({ error: { code: 'host_not_allowed' } });
    }
    expect((await withHost(url, '/metrics', 'evil.example')).status).toBe(403);
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, 'localhost']) expect((await withHost(url, '/status', host)).status, host).toBe(200);
  });
});

describe('ops server errors', () => {
  test('unknown routes are 404 {error:{code:"not_found"}}', async () => {
    const { url } = await start();
    for (const path of ['/', '/nope', '/healthz/extra', '/v1/chat/completions?x=1']) {
      const r = await getJson(`${url}${path}`);
      expect(r.status).toBe(404);
      expect(r.type).toBe(JSON_TYPE);
      expect(r.body).toMatchObject({ error: { code: 'not_found' } });
      expect(typeof (r.body as { error: { message: unknown } }).error.message).toBe('string');
    }
    expect(await getJson(`${url}/nope`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } })).toMatchObject({ status: 404, body: { error: { code: 'not_found' } } });
  });

  test('a wrong method on a known route is always 405 with Allow', async () => {
    const { url } = await start();
    for (const path of ['/healthz', '/readyz', '/status', '/metrics']) {
      for (const method of ['POST', 'PUT', 'DELETE', 'PATCH']) {
        const r = await getJson(`${url}${path}`, { method });
        expect(r.status).toBe(405);
        expect(r.type).toBe(JSON_TYPE);
        expect(r.headers.get('allow')).toBe('GET, HEAD');
        expect(r.body).toMatchObject({ error: { code: 'method_not_allowed' } });
      }
    }
  });

  test('a throwing callback is a 500 JSON error with no stack or message leaked, and the server keeps serving', async () => {
    let logged = '';
    const logger = createLogger({ level: 'error', destination: { write: (s: string) => void (logged += s) } });
    const secret = 'kaboom-internal-detail';
    const { url } = await start({
      logger,
      health: () => {
        throw new Error(secret);
      },
      ready: async () => {
        throw new TypeError(secret);
      },
      status: () => {
        throw new Error(secret);
      },
    });
    for (const [path, name] of [['/healthz', 'health'], ['/readyz', 'ready'], ['/status', 'status']] as const) {
      const res = await fetch(`${url}${path}`);
      const text = await res.text();
      expect(res.status).toBe(500);
      expect(res.headers.get('content-type')).toBe(JSON_TYPE);
      expect(JSON.parse(text)).toEqual({ error: { code: 'internal_error', message: `${name} callback failed` } });
      expect(text).not.toContain(secret);
      expect(text).not.toContain('at ');
      expect(text).not.toContain('.ts');
    }
    // The operator sees what happened in the log.
    expect(logged).toContain(secret);
    expect(logged).toContain('ops: status callback failed');
    // Still serving.
    const m = await fetch(`${url}/metrics`);
    expect(m.status).toBe(200);
  });

  test('a callback returning junk or never settling is a 500, not a hang or a crash', async () => {
    const { url } = await start({
      callbackTimeoutMs: 100,
      health: () => ({ ok: 'yes' }) as unknown as { ok: boolean },
      ready: () => new Promise<ReadyResult>(() => {}),
      status: () => {
        const cyclic: Record<string, unknown> = { a: 1 };
        cyclic.self = cyclic;
        return cyclic;
      },
    });
    for (const path of ['/healthz', '/readyz', '/status']) {
      const r = await getJson(`${url}${path}`);
      expect(r.status).toBe(500);
      expect(r.body).toMatchObject({ error: { code: 'internal_error' } });
    }
    const { url: url2 } = await start({ ready: () => ({ ready: false, reasons: [42] }) as unknown as ReadyResult, status: () => [1, 2] });
    expect((await getJson(`${url2}/readyz`)).status).toBe(500);
    expect((await getJson(`${url2}/status`)).status).toBe(500);
  });
});

describe('ops server lifecycle', () => {
  test('close() stops serving; listening twice is refused', async () => {
    const server = createOpsServer({ port: 0, metrics: createMetrics({ defaultMetrics: false }), ready: () => ({ ready: true }), status: () => ({}) });
    const { url } = await server.listen();
    await expect(server.listen()).rejects.toThrow(/already listening/);
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    await server.close();
    await expect(fetch(`${url}/healthz`)).rejects.toThrow();
  });

  test('only loopback hosts count as loopback (listen() warns about the others)', () => {
    for (const h of ['127.0.0.1', '127.1.2.3', 'localhost', '::1', '[::1]']) expect(isLoopbackHost(h)).toBe(true);
    for (const h of ['0.0.0.0', '::', '10.0.0.5', '192.168.1.2', 'example.com', '127.0.0.1.example.com']) expect(isLoopbackHost(h)).toBe(false);
  });

  test('bad options are refused', () => {
    const base = { metrics: createMetrics({ defaultMetrics: false }), ready: () => ({ ready: true }), status: () => ({}) };
    expect(() => createOpsServer({ ...base, port: 70000 })).toThrow(RangeError);
    expect(() => createOpsServer({ ...base, port: -1 })).toThrow(RangeError);
    expect(() => createOpsServer({ ...base, port: 1.5 })).toThrow(RangeError);
    expect(() => createOpsServer({ ...base, port: 0, host: '' })).toThrow(TypeError);
    expect(() => createOpsServer({ ...base, port: 0, metrics: {} as Metrics })).toThrow(TypeError);
  });
});

test('a request whose body stops short is answered 408 and closed once its deadline has passed (Node enforces it: headersTimeout within it)', async () => {
  const { url } = await start({ requestTimeoutMs: 1000 });
  const u = new URL(url);
  const r = await stalledRequest(Number(u.port), u.hostname, '/status');
  expect(r.answer).toMatch(/^HTTP\/1\.1 408 /);
  expect(r.ms).toBeLessThan(10_000);
});
