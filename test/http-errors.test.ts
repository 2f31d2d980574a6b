// Requests that never reach a route: a URL fastify cannot decode (its frameworkErrors path) and bytes
// Node's HTTP parser refuses (the server's clientError). Each of the three HTTP servers — the
// development market, the buyer gateway and the node's ops server — must answer them with its own
// error body {error: {code, message}}, close that connection, and keep serving the next request.
import crypto from 'node:crypto';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { createMetrics } from '../src/ops/metrics.ts';
import { createOpsServer, type OpsServer } from '../src/ops/server.ts';

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: any;
  /** Whether the server closed the connection (it must, after a request it could not parse). */
  closed: boolean;
}

/**
 * Sends raw bytes on a fresh connection and reads until the server closes it, or for 2 s at most
 * (then `closed` is false and the connection is cut here).
 */
function raw(port: number, bytes: string): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    const chunks: Buffer[] = [];
    let closed = true;
    const cut = setTimeout(() => {
      closed = false;
      socket.destroy();
    }, 2000);
    socket.on('data', (d: Buffer) => chunks.push(d));
    socket.on('error', reject);
    socket.on('close', () => {
      clearTimeout(cut);
      const text = Buffer.concat(chunks).toString('utf8');
      const [head = '', ...rest] = text.split('\r\n\r\n');
      const [statusLine = '', ...lines] = head.split('\r\n');
      const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
      const bodyText = rest.join('\r\n\r\n');
      let body: unknown;
      try {
        body = JSON.parse(bodyText);
      } catch {
        body = bodyText;
      }
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1] ?? 0), headers, body, closed });
    });
    socket.write(bytes);
  });
}

const CLIENT_ERRORS: { name: string; bytes: (path: string) => string; status: number; code?: string; message: RegExp }[] = [
  {
    name: 'both transfer-encoding: chunked and content-length',
    bytes: (p) => `POST ${p} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n`,
    status: 400,
    message: /not valid HTTP/,
  },
  {
    name: 'a content-length that is not a number',
    bytes: (p) => `POST ${p} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 12abc\r\n\r\n{}`,
    status: 400,
    message: /not valid HTTP.*Content-Length/,
  },
  {
    name: 'headers larger than the server accepts',
    bytes: (p) => `GET ${p} HTTP/1.1\r\nHost: localhost\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
    status: 431,
    code: 'headers_too_large',
    message: /headers/,
  },
  {
    name: 'chunk extensions larger than the server accepts',
    bytes: (p) => `POST ${p} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2;${'e'.repeat(20_000)}\r\n{}\r\n0\r\n\r\n`,
    status: 413,
    code: 'request_too_large',
    message: /chunk extensions/,
  },
];

/** The checks every server gets: `badRequestCode` is its own code for a malformed request. */
function describeServer(name: string, setup: () => Promise<{ port: number; base: string; badUrl: string; next: string; nextStatus: number; badRequestCode: string }>) {
  describe(name, () => {
    let s: Awaited<ReturnType<typeof setup>>;
    beforeAll(async () => {
      s = await setup();
    });

    test.each(CLIENT_ERRORS)('$name: its own error body, the connection closed, the server still up', async (c) => {
      const a = await raw(s.port, c.bytes(new URL(s.next).pathname));
      expect(a.status).toBe(c.status);
      expect(a.headers['content-type']).toBe('application/json; charset=utf-8');
      expect(a.headers['connection']).toBe('close');
      expect(Number(a.headers['content-length'])).toBe(Buffer.byteLength(JSON.stringify(a.body)));
      expect(a.body).toEqual({ error: { code: c.code ?? s.badRequestCode, message: expect.stringMatching(c.message) } });
      expect(a.closed).toBe(true);
      expect((await fetch(s.next)).status).toBe(s.nextStatus);
    });

    test('a URL that cannot be decoded is 400 in its own error body, and the server still serves', async () => {
      const res = await fetch(s.base + s.badUrl);
      expect(res.status).toBe(400);
      expect(res.headers.get('content-type')).toBe('application/json; charset=utf-8');
      expect(await res.json()).toEqual({ error: { code: s.badRequestCode, message: expect.stringMatching(/not a valid URL/i) } });
      expect((await fetch(s.next)).status).toBe(s.nextStatus);
    });

    test('the same bad URL on a kept-alive connection does not stop the next request on it', async () => {
      const both = `GET ${s.badUrl} HTTP/1.1\r\nHost: localhost\r\n\r\nGET ${new URL(s.next).pathname} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n`;
      const a = await raw(s.port, both);
      expect(a.status).toBe(400);
      expect(String(a.body)).toContain(`HTTP/1.1 ${s.nextStatus} `); // the second answer follows the first on the same connection
    });
  });
}

let market: Market;
let marketUrl: string;
let gateway: Gateway;
let ops: OpsServer;

afterAll(async () => {
  await ops?.close();
  await gateway?.close(1000);
  await market?.close();
});

describeServer('the development market', async () => {
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)) });
  const { url, port } = await market.listen();
  marketUrl = url;
  return { port, base: url, badUrl: '/v1/receipts/%ZZ', next: `${url}/v1/market`, nextStatus: 200, badRequestCode: 'invalid_request' };
});

describeServer('the gateway', async () => {
  // The market's URL is only used when a request needs it; none of these do.
  gateway = await createGateway({ market: 'http://127.0.0.1:2', port: 0 });
  const base = gateway.url.replace(/\/v1$/, '');
  return { port: gateway.port, base, badUrl: '/v1/requests/%ZZ', next: `${base}/v1/requests/req-none`, nextStatus: 404, badRequestCode: 'invalid_request' };
});

describe('path parameters as long as a request id may be', () => {
  // A ticket's (and a receipt's) request_id is up to 128 characters; fastify's router refuses
  // parameters over 100 by default (414), before the route could answer.
  const id = 'r'.repeat(128);
  test('the market looks a 128-character request id up: 404 not_found, not 414', async () => {
    const res = await fetch(`${marketUrl}/v1/receipts/${id}`);
    expect(res.status).toBe(404);
    expect(((await res.json()) as any).error.code).toBe('not_found');
  });
  test('the gateway looks a 128-character request id up: 404 request_not_found, not 414', async () => {
    const res = await fetch(`${gateway.url}/requests/${id}`);
    expect(res.status).toBe(404);
    expect(((await res.json()) as any).error.code).toBe('request_not_found');
  });
  test('a path parameter beyond the router\'s limit is 414 url_too_long in the server\'s own body (market and gateway)', async () => {
    for (const url of [`${marketUrl}/v1/receipts/${'r'.repeat(300)}`, `${gateway.url}/requests/${'r'.repeat(300)}`]) {
      const res = await fetch(url);
      expect([url, res.status]).toEqual([url, 414]);
      expect(await res.json()).toEqual({ error: { code: 'url_too_long', message: expect.stringMatching(/^url: a path parameter is longer/) } });
    }
  });
});

describe('the gateway, further', () => {
  test('its answer to a bad URL carries x-request-id, as every answer of the gateway does', async () => {
    const res = await fetch(gateway.url.replace(/\/v1$/, '') + '/v1/requests/%ZZ');
    expect(res.status).toBe(400);
    expect(res.headers.get('x-request-id')).toMatch(/^req-[0-9a-f-]{36}$/);
  });
});

describeServer('the ops server', async () => {
  ops = createOpsServer({ port: 0, metrics: createMetrics({ defaultMetrics: false }), ready: () => ({ ready: true }), status: () => ({}) });
  const { url, port } = await ops.listen();
  return { port, base: url, badUrl: '/healthz/%ZZ', next: `${url}/healthz`, nextStatus: 200, badRequestCode: 'bad_request' };
});
