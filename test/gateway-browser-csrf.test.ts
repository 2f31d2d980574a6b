// A real browser (headless Chromium) on a page of another origin tries to spend the buyer's money
// through the gateway with the requests a page can send without a CORS preflight: a no-cors fetch
// of a text/plain JSON body, and an auto-submitted text/plain form. The gateway must refuse both
// before any route (403 origin_not_allowed), so nothing is asked of the market and nothing is run.
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { BrowserContext } from 'playwright-core';
import { launchChromium } from './helpers/chromium.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { until } from './helpers/wait.ts';
import { MarketProxy } from './helpers/misbehaving-node.ts';


let tmp: string;
let market: Market;
let proxy: MarketProxy;
let gw: Gateway;
let page: http.Server;
let context: BrowserContext;
const requests: { method: string; route: string | null; status: number | null }[] = [];

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-browser-csrf-'));
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)) });
  // The market behind a proxy that counts every call the gateway makes to it.
  proxy = await MarketProxy.start((await market.listen()).url);
  const collect = (o: object, msg?: string): void => {
    if (msg === 'request') requests.push(o as (typeof requests)[number]);
  };
  gw = await createGateway({ market: proxy.url, port: 0, logger: { info: collect, warn: collect, error: collect } });
  // The attacker's page, on another origin (another port of the loopback).
  const body = JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'spend' }], max_tokens: 200, user: '=' });
  const html = `<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="${gw.url}/chat/completions" target="sink">
<input type="hidden" name='${body.slice(0, -3)}' value='"}'></form>
<iframe name="sink"></iframe>
<script>
window.done = fetch(${JSON.stringify(`${gw.url}/chat/completions`)}, { method: 'POST', mode: 'no-cors', headers: { 'content-type': 'text/plain' }, body: ${JSON.stringify(body)} })
  .then(() => 'sent', (e) => 'failed: ' + e.message)
  .then((r) => { document.getElementById('f').submit(); return r; });
</script></body></html>`;
  page = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end(html));
  await new Promise<void>((r) => page.listen(0, '127.0.0.1', r));
  context = await launchChromium(path.join(tmp, 'chromium-profile'));
}, 60_000);

afterAll(async () => {
  await context?.close();
  await new Promise((r) => page?.close(r));
  await gw?.close(1000);
  await proxy?.close();
  await market?.close();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

describe('a web page of another origin', () => {
  test('cannot run a paid request: its no-cors fetch and its text/plain form are both refused before any route (403)', async () => {
    const tab = await context.newPage();
    await tab.goto(`http://127.0.0.1:${(page.address() as AddressInfo).port}/`);
    expect(await tab.evaluate(() => (window as unknown as { done: Promise<string> }).done)).toBe('sent');
    await until('the gateway to see both requests', () => requests.filter((r) => r.method === 'POST').length >= 2, 15_000);
    const posts = requests.filter((r) => r.method === 'POST');
    expect(posts).toEqual([
      expect.objectContaining({ route: '/v1/chat/completions', status: 403 }),
      expect.objectContaining({ route: '/v1/chat/completions', status: 403 }),
    ]);
    // Nothing was asked of the market (a request let through would have asked it for a ticket, or at least its providers).
    expect(proxy.calls).toBe(0);
    await tab.close();
  });
});
