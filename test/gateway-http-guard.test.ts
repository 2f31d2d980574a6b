// The gateway as an HTTP server that spends its buyer's money without authentication: a web page's
// request (Origin) and a name that only resolves here (DNS rebinding: Host) are refused before any
// ticket; bodies being received share a byte budget and must arrive in time; a Transfer-Encoding
// other than chunked is refused. Against a real market with no provider: nothing refused here ever
// reaches it.
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { isLoopbackHostHeader } from '../src/gateway/http-guard.ts';
import { readApiKeysFile } from '../src/gateway/api-keys.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { MarketProxy } from './helpers/misbehaving-node.ts';

let market: Market;
let proxy: MarketProxy;
let gw: Gateway;

beforeAll(async () => {
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)) });
  // The market behind a proxy that counts the gateway's calls to it.
  proxy = await MarketProxy.start((await market.listen()).url);
  gw = await createGateway({ market: proxy.url, port: 0, requestTimeoutMs: 1500, bodyBudgetBytes: 1 << 20 });
});

afterAll(async () => {
  await gw?.close(1000);
  await proxy?.close();
  await market?.close();
});

const chat = JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }] });


/** Sends raw HTTP and resolves with what came back when the server closed or `ms` passed. */
function rawExchange(text: string | Buffer, ms = 5000, keepOpen = false): { answer: Promise<string>; socket: net.Socket } {
  const socket = net.connect(gw.port, gw.host);
  socket.write(text);
  const answer = new Promise<string>((resolve) => {
    let got = '';
    socket.on('data', (c) => {
      got += c.toString('latin1');
      if (!keepOpen && /\r\n\r\n[\s\S]*\}$/.test(got)) resolve(got);
    });
    socket.on('close', () => resolve(got));
    socket.on('error', () => resolve(got));
    setTimeout(() => resolve(got), ms);
  });
  return { answer, socket };
}

describe('requests the gateway refuses before any route', () => {
  test('a request from a web page (any Origin) is 403 origin_not_allowed, paid routes and reads alike; no ticket asked', async () => {
    const before = proxy.calls;
    for (const [method, route, body] of [['POST', '/chat/completions', chat], ['POST', '/embeddings', '{"model":"m","input":"x"}'], ['GET', '/models', undefined]] as const) {
      for (const origin of ['https://evil.example', 'null', 'http://127.0.0.1:8080']) {
        const r = await fetch(`${gw.url}${route}`, { method, headers: { origin, 'content-type': 'text/plain' }, ...(body ? { body } : {}) });
        expect(r.status, `${method} ${route} ${origin}`).toBe(403);
        expect(((await r.json()) as { error: { code: string } }).error.code).toBe('origin_not_allowed');
      }
    }
    expect(proxy.calls).toBe(before); // (the gateway never asked the market anything for them)
  });

  test('a Host that is not the loopback (a name rebound to 127.0.0.1) is 403 host_not_allowed; localhost, 127.x and [::1] are fine', async () => {
    const asHost = async (host: string): Promise<{ status: number; code?: string }> => {
      const { answer } = rawExchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`);
      const text = await answer;
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
      return { status, code: /"code":"([a-z_]+)"/.exec(text)?.[1] };
    };
    expect(await asHost(`attacker.example:${gw.port}`)).toEqual({ status: 403, code: 'host_not_allowed' });
    expect(await asHost('10.0.0.5')).toEqual({ status: 403, code: 'host_not_allowed' });
    // Past the guard, the contract refuses the empty body: the request got through.
    for (const ok of [`localhost:${gw.port}`, `127.0.0.1:${gw.port}`, `127.1.2.3`, `[::1]:${gw.port}`, 'LOCALHOST']) expect(await asHost(ok), ok).toEqual({ status: 400, code: 'invalid_request' });
  });

  test('a Transfer-Encoding other than chunked is 400 (it would be read as plain JSON)', async () => {
    const { answer } = rawExchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n${chat.length.toString(16)}\r\n${chat}\r\n0\r\n\r\n`);
    const text = await answer;
    expect(text).toMatch(/^HTTP\/1\.1 400 /);
    expect(text).toMatch(/"code":"invalid_request","message":"Transfer-Encoding: \\"gzip, chunked\\" is not accepted/);
  });

  test('bodies being received share a budget: over it, 503 gateway_busy with Retry-After; a stalled body is cut off in time and its share comes back', async () => {
    // 900 KB declared, a few bytes sent, then nothing: it holds 900 KB of the 1 MiB budget.
    const stalled = rawExchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n{"mo`, 10_000, true);
    await new Promise((r) => setTimeout(r, 200));
    const busy = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pad: 'x'.repeat(200_000) }) });
    expect(busy.status).toBe(503);
    expect(busy.headers.get('retry-after')).toBe('1');
    expect(((await busy.json()) as { error: { code: string } }).error.code).toBe('gateway_busy');
    // The stalled request is answered 408 once the request timeout (1.5 s here) has passed.
    const text = await stalled.answer;
    expect(text).toMatch(/^HTTP\/1\.1 408 /);
    stalled.socket.destroy();
    // Its share is back: the same request now passes the guard (and the contract refuses it).
    const again = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pad: 'x'.repeat(200_000) }) });
    expect(again.status).toBe(400);
  });

  test('a request with an API key whose body does not arrive in time: its 408 carries the X-RateLimit headers too', async () => {
    const key = 'sk-svc-v1-guard-0123456789';
    const keyed = await createGateway({ market: proxy.url, port: 0, requestTimeoutMs: 1000, apiKeys: [{ key, rateLimit: 7 }] });
    try {
      const socket = net.connect(keyed.port, keyed.host);
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mo`);
      const text = await new Promise<string>((resolve) => {
        let got = '';
        socket.on('data', (c) => (got += c.toString('latin1')));
        socket.on('close', () => resolve(got));
        setTimeout(() => resolve(got), 8000);
      });
      const [head = ''] = text.split('\r\n\r\n');
      expect(head).toMatch(/^HTTP\/1\.1 408 /);
      expect(head.toLowerCase()).toContain('\r\nx-ratelimit-limit: 7\r\n');
      expect(head.toLowerCase()).toContain('\r\nx-ratelimit-remaining: 6\r\n');
      expect(text).toContain('"code":"request_timeout"');
    } finally {
      await keyed.close(1000);
    }
  });
});

test('isLoopbackHostHeader', () => {
  for (const h of ['localhost', 'localhost:11435', '127.0.0.1', '127.0.0.1:80', '127.255.0.9:1', '[::1]', '[::1]:11435', 'LocalHost:1', 'localhost.', 'localhost.:8080', '127.0.0.1.', '127.1', '[0:0:0:0:0:0:0:1]', '[::ffff:127.0.0.1]:5', '[::FFFF:7f00:1]']) expect(isLoopbackHostHeader(h), h).toBe(true);
  for (const h of ['', 'evil.example', 'evil.example:11435', '127.0.0.1.evil.example', 'localhost.evil.example:80', '[::2]:1', '10.0.0.1', '0.0.0.0', 'evil@localhost', 'localhost/x', 'local host', '[::ffff:10.0.0.1]', '128.0.0.1', 'localhost..']) expect(isLoopbackHostHeader(h), h).toBe(false);
});

test('refused requests are at most 50 log lines a second, the rest counted in one warning; answered ones are all lines', async () => {
  const lines: { msg: string; o: Record<string, unknown> }[] = [];
  const collect = (o: object, msg?: string): void => void lines.push({ msg: msg ?? '', o: o as Record<string, unknown> });
  const g = await createGateway({ market: proxy.url, port: 0, logger: { info: collect, warn: collect, error: collect } });
  try {
    await Promise.all(Array.from({ length: 120 }, () => fetch(`${g.url}/no-such-route`).then((r) => r.arrayBuffer())));
    const logged = lines.filter((l) => l.msg === 'request' && l.o.status === 404).length;
    expect(logged).toBeGreaterThanOrEqual(50);
    expect(logged).toBeLessThan(120);
  } finally {
    await g.close(1000);
  }
  const logged = lines.filter((l) => l.msg === 'request' && l.o.status === 404).length;
  const suppressed = lines.filter((l) => /request lines of refused or unanswered requests not logged/.test(l.msg)).reduce((n, l) => n + (l.o.suppressed as number), 0);
  expect(logged + suppressed).toBe(120); // (every refusal is a line or counted: the count of the last second is said at close)
});

describe('API keys (--api-keys-file)', () => {
  const KEY = 'sk-svc-v1-0123456789abcdef';
  test('every route but /v1/models needs a known key, as Bearer or X-Service-API-Key; a missing or unknown one is 401 before the market is asked', async () => {
    const g = await createGateway({ market: proxy.url, port: 0, apiKeys: [KEY] });
    try {
      const before = proxy.calls;
      const post = (headers: Record<string, string>) => fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: '{}' });
      const codeOf = async (r: Response) => [r.status, ((await r.json()) as { error: { code: string } }).error.code];
      const missing = await post({});
      expect(missing.headers.get('www-authenticate')).toBe('Bearer');
      expect(await codeOf(missing)).toEqual([401, 'missing_api_key']);
      expect(await codeOf(await post({ authorization: 'Bearer sk-svc-v1-not-the-right-one' }))).toEqual([401, 'invalid_api_key']);
      expect(await codeOf(await post({ authorization: `Basic ${KEY}` }))).toEqual([401, 'missing_api_key']);
      expect(await codeOf(await fetch(`${g.url}/requests/req-x`))).toEqual([401, 'missing_api_key']);
      expect(proxy.calls).toBe(before);
      // With the key (either header), the request goes on: here the contract refuses the empty body.
      expect(await codeOf(await post({ authorization: `Bearer ${KEY}` }))).toEqual([400, 'invalid_request']);
      expect(await codeOf(await post({ 'x-service-api-key': KEY }))).toEqual([400, 'invalid_request']);
      expect(await codeOf(await post({ authorization: `Bearer\t${KEY}` }))).toEqual([400, 'invalid_request']);
      // The catalog is open, as the spec has it (HEAD as GET).
      expect((await fetch(`${g.url}/models`)).status).toBe(200);
      expect((await fetch(`${g.url}/models`, { method: 'HEAD' })).status).toBe(200);
    } finally {
      await g.close(1000);
    }
  });

  test('the keys file: one key a line, comments and blank lines skipped; a malformed line or no key is refused naming it', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'api-keys-'));
    try {
      const f = path.join(dir, 'keys');
      fs.writeFileSync(f, `# buyers\n${KEY}\n\n  sk-svc-v1-fedcba9876543210  \n`);
      expect(readApiKeysFile(f)).toEqual([{ key: KEY }, { key: 'sk-svc-v1-fedcba9876543210' }]);
      fs.writeFileSync(f, `${KEY}\nshort\n`);
      expect(() => readApiKeysFile(f)).toThrow(`${f}:2: an API key is 16 to 256 visible ASCII characters, without spaces`);
      fs.writeFileSync(f, '# nothing\n');
      expect(() => readApiKeysFile(f)).toThrow(`${f} holds no API key`);
      expect(() => readApiKeysFile(path.join(dir, 'missing'))).toThrow(/cannot read the API keys file .*missing: not found/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
