// Two requests Node's HTTP server would answer itself with an empty body (an HTTP/1.1 request
// without Host: 400; an Expect other than 100-continue: 417) get each server's error body, on the
// gateway, the dev market and the ops server; HTTP/1.0 without Host is fine.
import crypto from 'node:crypto';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { createMetrics } from '../src/ops/metrics.ts';
import { createOpsServer, type OpsServer } from '../src/ops/server.ts';

let market: Market;
let gw: Gateway;
let ops: OpsServer;
const ports: Record<string, number> = {};

beforeAll(async () => {
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)) });
  const m = await market.listen();
  ports.market = m.port;
  gw = await createGateway({ market: m.url, port: 0 });
  ports.gateway = gw.port;
  ops = createOpsServer({ port: 0, metrics: createMetrics({ defaultMetrics: false }), ready: () => ({ ready: true }), status: () => ({}) });
  ports.ops = new URL((await ops.listen()).url).port as unknown as number;
});

afterAll(async () => {
  await ops?.close();
  await gw?.close(1000);
  await market?.close();
});

function exchange(port: number, text: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(Number(port), '127.0.0.1');
    let got = '';
    s.on('data', (c) => (got += c.toString('latin1')));
    s.on('close', () => resolve(got));
    s.on('error', () => resolve(got));
    s.write(text);
    setTimeout(() => s.destroy(), 5000);
  });
}

const paths = { gateway: '/v1/models', market: '/v1/providers', ops: '/status' } as const;

describe.each(['gateway', 'market', 'ops'] as const)('%s', (server) => {
  test('an HTTP/1.1 request without Host is 400 with the error body', async () => {
    const r = await exchange(ports[server]!, `GET ${paths[server]} HTTP/1.1\r\nConnection: close\r\n\r\n`);
    expect(r).toMatch(/^HTTP\/1\.1 400 /);
    expect(r).toMatch(/\{"error":\{"code":"(invalid_request|bad_request)","message":"an HTTP\/1\.1 request needs a Host header"\}\}$/);
  });

  test('an Expect other than 100-continue is 417 with the error body', async () => {
    const r = await exchange(ports[server]!, `GET ${paths[server]} HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: tea\r\nConnection: close\r\n\r\n`);
    expect(r).toMatch(/^HTTP\/1\.1 417 /);
    expect(r).toContain('{"error":{"code":"expectation_failed","message":"Expect: \\"tea\\" is not supported (only 100-continue)"}}');
  });

  test('HTTP/1.0 without Host is answered', async () => {
    const r = await exchange(ports[server]!, `GET ${paths[server]} HTTP/1.0\r\n\r\n`);
    // (the gateway and the ops server, on the loopback, take only a loopback Host: none is not one)
    expect(r).toMatch(server === 'gateway' || server === 'ops' ? /^HTTP\/1\.1 403 .*"code":"host_not_allowed"/s : /^HTTP\/1\.1 200 /);
  });
});
