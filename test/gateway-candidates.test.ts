// Which listed providers the gateway asks for free requests and estimates: the listing judged by
// the node's own checkOffer, so that a control means the same at the gateway, market and node.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, test } from 'vitest';
import { createGateway } from '../src/gateway/gateway.ts';
import { candidates, fitProvidersOf, listingUnmet, notSellingFor } from '../src/gateway/candidates.ts';
import { GatewayError } from '../src/gateway/errors.ts';
import type { ProviderEntry } from '../src/gateway/market-client.ts';
import type { RoutingControls } from '../src/gateway/routing-headers.ts';

const MODEL = 'tiny/llama';

function entry(id: string, over: Partial<ProviderEntry> = {}, model: Partial<ProviderEntry['models'][number]> = {}): ProviderEntry {
  return {
    provider: id.repeat(64).slice(0, 64),
    peer_id: `peer-${id}`,
    addresses: [],
    models: [{ id: MODEL, quantization: 'Q4_K_M', context: 2048, slots: 2, tokens_per_second: 1000, ...model }],
    price_version: 'v1',
    rates: { [MODEL]: { input_per_mtok: '150000', output_per_mtok: '600000' } },
    attestation_tier: 'T1',
    live: true,
    accepting: true,
    ...over,
  };
}
const controls = (routing: RoutingControls['routing'], preferredProviders?: string[]): RoutingControls => ({ routing, ...(preferredProviders ? { preferredProviders } : {}) });
const ids = (list: ProviderEntry[], c: RoutingControls) => candidates(list, MODEL, c).map((x) => x.provider.provider[0]);
function refusal(list: ProviderEntry[], c: RoutingControls): [number, string] {
  try {
    candidates(list, MODEL, c);
  } catch (e) {
    if (e instanceof GatewayError) return [e.status, e.code];
    throw e;
  }
  throw new Error('expected a refusal');
}

describe('gateway candidates', () => {
  test('a provider over a price ceiling is passed over for one under it', () => {
    const dear = entry('a', { rates: { [MODEL]: { input_per_mtok: '900000', output_per_mtok: '900000' } } });
    const cheap = entry('b');
    expect(ids([dear, cheap], controls({ max_input_price_micro_usd_per_mtok: '200000' }))).toEqual(['b']);
    expect(ids([dear, cheap], controls({ max_request_price_micro_usd: '750' }))).toEqual(['b']);
    expect(ids([dear, cheap], controls({}))).toEqual(['a', 'b']);
  });
  test('every live provider over the ceiling: 403 price_ceiling_exceeded; refused for other reasons too: 503 no_provider', () => {
    const dear = entry('a', { rates: { [MODEL]: { input_per_mtok: '900000', output_per_mtok: '900000' } } });
    expect(refusal([dear], controls({ max_output_price_micro_usd_per_mtok: '600000' }))).toEqual([403, 'price_ceiling_exceeded']);
    const small = entry('b', {}, { context: 512 });
    expect(refusal([dear, small], controls({ max_output_price_micro_usd_per_mtok: '600000', min_context: 1024 }))).toEqual([503, 'no_provider']);
    expect(refusal([entry('c', { live: false })], controls({}))).toEqual([503, 'no_provider']);
  });
  test('a provider that is stopping is a reason of its own: over the ceiling and stopping is 503, as the marketplace answers', () => {
    const dear = entry('a', { rates: { [MODEL]: { input_per_mtok: '900000', output_per_mtok: '900000' } } });
    const stopping = entry('b', { accepting: false });
    expect(refusal([dear, stopping], controls({ max_input_price_micro_usd_per_mtok: '200000' }))).toEqual([503, 'no_provider']);
    expect(ids([dear, stopping, entry('c')], controls({}))).toEqual(['a', 'c']);
  });
  test('preferred providers and a price ceiling: the first preferred one under it', () => {
    const [a, b, c] = [entry('a', { rates: { [MODEL]: { input_per_mtok: '900000', output_per_mtok: '900000' } } }), entry('b'), entry('c')];
    expect(ids([a, b, c], controls({ max_input_price_micro_usd_per_mtok: '200000' }, [a.provider, c.provider, b.provider]))).toEqual(['c', 'b']);
    expect(refusal([a, b, c], controls({ max_input_price_micro_usd_per_mtok: '200000' }, [a.provider]))).toEqual([403, 'price_ceiling_exceeded']);
  });
  test('an unknown model is 404 model_not_found', () => {
    expect(() => candidates([entry('a')], 'other/model', controls({}))).toThrow(expect.objectContaining({ status: 404, code: 'model_not_found' }));
  });
  test('attestation tiers are ranked as the node ranks them; a listing without a tier meets no minimum tier', () => {
    const t1 = entry('a', { attestation_tier: 'T1' });
    const t3 = entry('b', { attestation_tier: 'T3' });
    const none = entry('c', { attestation_tier: undefined });
    const bogus = entry('d', { attestation_tier: 'T9' });
    expect(ids([t1, t3, none, bogus], controls({ min_attestation_tier: 'T2' }))).toEqual(['b']);
    expect(ids([t1, t3, none, bogus], controls({ min_attestation_tier: 'T1' }))).toEqual(['a', 'b']);
    expect(ids([t1, t3, none, bogus], controls({}))).toEqual(['a', 'b', 'c', 'd']);
    expect(listingUnmet(none, none.models[0]!, { min_attestation_tier: 'T1' })?.message).toMatch(/attestation tier/);
  });
  test('a listing without (valid) rates meets no price ceiling, and is no reason to refuse without one', () => {
    const unpriced = entry('a', { rates: undefined });
    const garbled = entry('b', { rates: { [MODEL]: { input_per_mtok: 'lots', output_per_mtok: '1' } } });
    expect(ids([unpriced, garbled], controls({}))).toEqual(['a', 'b']);
    expect(refusal([unpriced, garbled], controls({ max_input_price_micro_usd_per_mtok: '1000000' }))).toEqual([503, 'no_provider']);
  });
  test('context, quantization bucket and throughput as listed', () => {
    const list = [entry('a', {}, { context: 1024, quantization: 'q8_0' }), entry('b', {}, { tokens_per_second: 10 }), entry('c', {}, { quantization: undefined })];
    expect(ids(list, controls({ min_context: 2048 }))).toEqual(['b', 'c']);
    expect(ids(list, controls({ quantization: 'Q8-0' }))).toEqual(['a']);
    expect(ids(list, controls({ min_tokens_per_second: 100 }))).toEqual(['a', 'c']);
  });
  test('X-Service-Prefer-Providers: only those, in its order', () => {
    const [a, b, c] = [entry('a'), entry('b'), entry('c')];
    expect(ids([a, b, c], controls({}, [c.provider, a.provider]))).toEqual(['c', 'a']);
    expect(refusal([a, b], controls({}, [c.provider]))).toEqual([503, 'no_provider']);
  });

  test('where a hedge or a failover may go: live, accepting providers of the model sold for the endpoint whose listing fits, in the market\'s order, but for those tried', () => {
    const list = [
      entry('a'),
      entry('b', {}, { context: 512 }),
      entry('c', { live: false }),
      entry('d', { accepting: false }),
      entry('e', { models: [{ id: 'other/model', quantization: 'Q4_K_M', context: 2048, slots: 1, tokens_per_second: 1000 }] }),
      entry('f', { rates: { [MODEL]: { input_per_mtok: '900000', output_per_mtok: '900000' } } }),
      entry('g'),
      entry('h', {}, { endpoints: ['completions', 'embeddings'] }), // (no chat template)
    ];
    const fit = (routing: RoutingControls['routing'], except: string[] = [], endpoint = 'chat/completions') => fitProvidersOf(list, MODEL, endpoint, routing, except).map((p) => p[0]);
    expect(fit({})).toEqual(['a', 'b', 'f', 'g']);
    expect(fit({}, [], 'completions')).toEqual(['a', 'b', 'f', 'g', 'h']);
    expect([...notSellingFor(list, MODEL, 'responses')]).toEqual([list[7]!.provider]);
    expect([...notSellingFor(list, MODEL, 'embeddings')]).toEqual([]);
    expect(fit({ min_context: 1000 })).toEqual(['a', 'f', 'g']);
    expect(fit({ max_input_price_micro_usd_per_mtok: '500000' })).toEqual(['a', 'b', 'g']);
    expect(fit({ min_context: 1000 }, [list[0]!.provider])).toEqual(['f', 'g']);
  });
});

describe('POST /v1/estimates against a listing that cannot run it', () => {
  /** A gateway on a market whose listing is `listing` (no provider can be dialled). */
  async function estimate(listing: unknown[], body: object, headers: Record<string, string> = {}): Promise<[number, { code: string; message: string }]> {
    const market = http.createServer((req, res) => {
      if (req.method === 'GET' && req.url === '/v1/providers') {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(listing));
        return;
      }
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'not_found', message: 'no' } }));
    });
    await new Promise<void>((r) => market.listen(0, '127.0.0.1', r));
    const gw = await createGateway({ market: `http://127.0.0.1:${(market.address() as AddressInfo).port}`, port: 0 });
    try {
      const r = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
      return [r.status, ((await r.json()) as { error: { code: string; message: string } }).error];
    } finally {
      await gw.close(1000);
      await new Promise((r) => market.close(r));
    }
  }
  const chat = { endpoint: 'CHAT', body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }] } };

  test('fit providers that publish no (well-formed) price for the model: 503 no_provider, before anyone is dialled', async () => {
    // Fit providers of the model, their rates absent or not micro-USD decimals. (Neither can be
    // dialled: asking one to count would end in provider_unreachable.)
    const [status, e] = await estimate([{ ...entry('a'), rates: undefined }, { ...entry('b'), rates: { [MODEL]: { input_per_mtok: '0.15', output_per_mtok: '600000' } } }], chat);
    expect([status, e.code]).toEqual([503, 'no_provider']);
    expect(e.message).toMatch(/publishes a price for this model/);
  });

  test('providers that sell the model for completions and embeddings only (no chat template): a chat estimate is 404 model_not_found, as its request would be, before anyone is dialled', async () => {
    const [status, e] = await estimate([entry('a', {}, { endpoints: ['completions', 'embeddings'] })], chat);
    expect([status, e.code]).toEqual([404, 'model_not_found']);
    expect(e.message).toBe(`no provider sells "${MODEL}" for chat/completions`);
    // Sold for chat by another that the controls rule out: the controls' refusal, as the market's (not a 404).
    const [s2, e2] = await estimate([entry('a', {}, { endpoints: ['completions', 'embeddings'] }), entry('b', {}, { context: 16 })], { ...chat, body: { ...chat.body } }, { 'x-service-min-ctx': '1000' });
    expect([s2, e2.code]).toEqual([503, 'no_provider']);
  });
});
