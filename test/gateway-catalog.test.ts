// The model catalog's query (marketplace-api.md, "Catalog (no key)"): filters checked and applied
// route by route, prices from the cheapest route, sorting and an opaque cursor. Pure functions over
// a listing; the HTTP route is exercised in gateway.test.ts.
import crypto from 'node:crypto';
import { describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { signRequestContract, verifyRequestContract } from '../attestation/request-contract.ts';
import { TEXT_REQUEST_CONTRACT } from '../src/serve/request-contract.ts';
import { catalogEntry, catalogPage, parseCatalogQuery, type CatalogQuery } from '../src/gateway/catalog.ts';
import { GatewayError } from '../src/gateway/errors.ts';
import type { ProviderEntry } from '../src/gateway/market-client.ts';

const A = 'aa'.repeat(32);
const B = 'bb'.repeat(32);
const provider = (id: string, over: Partial<ProviderEntry>, models: ProviderEntry['models'], rates: Record<string, { input_per_mtok: string; output_per_mtok: string }>): ProviderEntry => ({
  provider: id, peer_id: 'p', addresses: [], models, rates, live: true, attestation_tier: 'T1', last_seen: 1_700_000_000_000, ...over,
});
const listing: ProviderEntry[] = [
  provider(A, { capacity: new Map([['tiny/llama', { free_slots: 1, queued: 3, queue_limit: 8 }]]) }, [{ id: 'tiny/llama', context: 512, quantization: 'F32', slots: 2, tokens_per_second: 100 }, { id: 'big/model', context: 8192, quantization: 'Q4_K_M', slots: 1 }], {
    'tiny/llama': { input_per_mtok: '150000', output_per_mtok: '600000' },
    'big/model': { input_per_mtok: '2000000', output_per_mtok: '8000000' },
  }),
  provider(B, { live: false, attestation_tier: 'T2' }, [{ id: 'tiny/llama', context: 2048, quantization: 'f32', slots: 4, tokens_per_second: 900 }], { 'tiny/llama': { input_per_mtok: '100000', output_per_mtok: '700000' } }),
];
const page = (query: Record<string, unknown>) => catalogPage(listing, parseCatalogQuery(query));
const ids = (query: Record<string, unknown>) => page(query).data.map((m) => m.id);
const refusal = (query: Record<string, unknown>): string => {
  try {
    parseCatalogQuery(query);
  } catch (e) {
    expect(e).toBeInstanceOf(GatewayError);
    expect((e as GatewayError).status).toBe(400);
    return (e as GatewayError).message;
  }
  return 'accepted';
};

describe('catalog entries', () => {
  test('merged by id: the widest context, every quantization and tier, the cheapest route\'s prices in micro-USD', () => {
    expect(catalogEntry(listing, 'tiny/llama')).toEqual({
      id: 'tiny/llama', object: 'model', created: 1_700_000_000, owned_by: 'tiny', context_length: 2048, quantizations: ['f32'],
      providers: 2, live_providers: 1, attestation_tiers: ['T1', 'T2'], endpoint_families: ['CHAT', 'COMPLETIONS', 'RESPONSES', 'EMBEDDINGS'], modalities: ['text', 'embedding'],
      tools: false, structured_output: false, prompt_confidential: false,
      // input 0.10 (B), output 0.60 (A); the representative request (1,000 + 1,000 tokens) is cheapest at A: 150 + 600 = 750
      pricing: { prompt_per_million_au: '100000', completion_per_million_au: '600000', representative_request_au: '750' },
      // No route has a signed request contract.
      supported_parameters: {},
      request_contracts: [],
      // Live routes only (B is not live): A's slots, and its latest heartbeat's free slots and queue.
      capacity: { slots: 2, free_slots: 1, queued: 3, queue_limit: 8, tokens_per_second: 100 },
    });
    expect(catalogEntry(listing, 'nobody/nothing')).toBeUndefined();
    // A route not heard from since it registered counts all its slots free.
    expect(catalogEntry(listing, 'big/model')).toMatchObject({ capacity: { slots: 1, free_slots: 1, queued: 0, queue_limit: 0, tokens_per_second: null } });
  });
});

describe('signed request contracts in the catalog', () => {
  const key = () => {
    const seed = crypto.randomBytes(32);
    return { seed, id: toHex(ed25519PublicKey(seed)) };
  };
  const [p1, p2, p3] = [key(), key(), key()];
  const narrower: Partial<typeof TEXT_REQUEST_CONTRACT> & Pick<typeof TEXT_REQUEST_CONTRACT, 'chat/completions'> = structuredClone(TEXT_REQUEST_CONTRACT);
  delete narrower['chat/completions'].attributes.min_p;
  delete narrower.embeddings;
  const c1 = signRequestContract(p1.seed, p1.id, ['tiny/llama'], TEXT_REQUEST_CONTRACT);
  const c2 = signRequestContract(p2.seed, p2.id, ['tiny/llama', 'other/model'], narrower);
  // p3 lists a contract p1 signed: it does not verify under p3's key and is left out.
  const forged = signRequestContract(p1.seed, p1.id, ['tiny/llama'], TEXT_REQUEST_CONTRACT);
  const rates = { 'tiny/llama': { input_per_mtok: '1', output_per_mtok: '1' } };
  const withContracts = [
    provider(p1.id, { request_contracts: [c1.envelope] }, [{ id: 'tiny/llama', context: 512 }], rates),
    provider(p2.id, { request_contracts: [c2.envelope] }, [{ id: 'tiny/llama', context: 512 }, { id: 'other/model', context: 512 }], rates),
    provider(p3.id, { request_contracts: [forged.envelope, { not: 'an envelope' }] }, [{ id: 'tiny/llama', context: 512 }], rates),
  ];

  test('by id: each route\'s verified contract; the parameters every route takes, by family, only when every route has a contract for it', () => {
    const e = catalogEntry(withContracts, 'tiny/llama') as { request_contracts: { provider: string; version: string; contract: unknown }[]; supported_parameters: Record<string, string[]> };
    expect(e.request_contracts.map((c) => c.provider)).toEqual([p1.id, p2.id].sort());
    for (const c of e.request_contracts) {
      const v = verifyRequestContract(c.contract as never, { provider: c.provider });
      expect(v.ok).toBe(true);
      expect(c.version).toBe(v.ok ? v.value.version : '');
    }
    // p3's route has no contract that verifies: nothing is promised for any family.
    expect(e.supported_parameters).toEqual({});
    const honest = withContracts.slice(0, 2);
    const s = (catalogEntry(honest, 'tiny/llama') as { supported_parameters: Record<string, string[]> }).supported_parameters;
    const applied = (endpoint: keyof typeof TEXT_REQUEST_CONTRACT, optional: string[]) => [...optional, ...Object.entries(TEXT_REQUEST_CONTRACT[endpoint].attributes).filter(([, x]) => x.use === 'applied').map(([k]) => k)].sort();
    expect(s.CHAT).toEqual(applied('chat/completions', ['max_tokens', 'stream', 'stream_options']).filter((k) => k !== 'min_p'));
    expect(s.CHAT).toEqual(expect.arrayContaining(['seed', 'max_tokens', 'stream']));
    expect(s.COMPLETIONS).toEqual(applied('completions', ['max_tokens', 'stream', 'stream_options']));
    expect(s.RESPONSES).toEqual(applied('responses', []));
    // p2's contract has no embeddings: none promised.
    expect(s.EMBEDDINGS).toBeUndefined();
    expect((catalogEntry(honest.slice(0, 1), 'tiny/llama') as { supported_parameters: Record<string, string[]> }).supported_parameters.EMBEDDINGS).toEqual(['encoding_format']);
    // The list page carries the parameters, not the envelopes.
    const listed = catalogPage(honest, parseCatalogQuery({})).data.find((m) => m.id === 'tiny/llama')!;
    expect(listed.supported_parameters).toEqual(s);
    expect(listed.request_contracts).toBeUndefined();
    expect(catalogEntry(honest, 'other/model')).toMatchObject({ supported_parameters: { CHAT: s.CHAT }, request_contracts: [{ provider: p2.id }] });
  });

  test('an envelope padded with another key or signature is left out, whatever it holds', () => {
    const padded = [{ ...c1.envelope, endorsed_by: 'x' }, { ...c1.envelope, signatures: [...c1.envelope.signatures, { keyid: 'note', sig: 'AAAA' }] }, { ...c1.envelope, signatures: [{ ...c1.envelope.signatures[0]!, note: 1 }] }];
    for (const env of padded) expect(catalogEntry([provider(p1.id, { request_contracts: [env] }, [{ id: 'tiny/llama', context: 512 }], rates)], 'tiny/llama'), JSON.stringify(Object.keys(env))).toMatchObject({ request_contracts: [] });
  });

  test('a contract verified before and listed again with another payload under the same signature is left out', () => {
    expect(catalogEntry(withContracts, 'tiny/llama')).toMatchObject({ request_contracts: [{}, {}] });
    const payload = JSON.parse(Buffer.from(c1.envelope.payload, 'base64').toString('utf8')) as { endpoints: Record<string, unknown> };
    delete payload.endpoints.embeddings;
    const tampered = { ...c1.envelope, payload: Buffer.from(JSON.stringify(payload)).toString('base64') };
    const listing = [provider(p1.id, { request_contracts: [tampered] }, [{ id: 'tiny/llama', context: 512 }], rates)];
    expect(catalogEntry(listing, 'tiny/llama')).toMatchObject({ request_contracts: [], supported_parameters: {} });
    // And the genuine one again is still taken.
    expect(catalogEntry(withContracts.slice(0, 1), 'tiny/llama')).toMatchObject({ request_contracts: [{ provider: p1.id }] });
  });
});

describe('a model no route prices', () => {
  test('has null prices, and any price filter leaves it out', () => {
    const unpriced = [provider(A, {}, [{ id: 'free/form', context: 128 }], {})];
    expect(catalogEntry(unpriced, 'free/form')).toMatchObject({ pricing: { prompt_per_million_au: null, completion_per_million_au: null, representative_request_au: null }, quantizations: [] });
    expect(catalogPage(unpriced, parseCatalogQuery({})).data.map((m) => m.id)).toEqual(['free/form']);
    for (const q of [{ max_input_price_per_million_usd: '1000' }, { max_output_price_per_million_usd: '1000' }, { max_representative_request_price_usd: '1000' }]) {
      expect(catalogPage(unpriced, parseCatalogQuery(q)).data, JSON.stringify(q)).toEqual([]);
    }
  });
});

describe('GET /v1/models query', () => {
  test('no query: every model, sorted by id, one page', () => {
    expect(page({})).toMatchObject({ next_cursor: null, has_more: false });
    expect(ids({})).toEqual(['big/model', 'tiny/llama']);
  });

  test('filters are judged route by route, and an entry describes the routes they leave; live=true counts live routes only', () => {
    expect(ids({ max_input_price_per_million_usd: '0.1' })).toEqual(['tiny/llama']); // B's route
    expect(ids({ max_input_price_per_million_usd: '0.1', live: 'true' })).toEqual([]); // B is not live
    expect(ids({ min_context_tokens: '1000' })).toEqual(['big/model', 'tiny/llama']);
    expect(ids({ min_context_tokens: '1000', live: 'true' })).toEqual(['big/model']);
    // One route must meet them all: A is cheap but narrow, B wide but dear.
    expect(ids({ min_context_tokens: '1000', max_output_price_per_million_usd: '0.6' })).toEqual([]);
    // The listed prices are each the lowest any route asks (input B's 0.10, output A's 0.60): ceilings
    // at both find no one route (docs/decisions.md); under the ceilings, the entry is the routes that fit (A).
    expect(ids({ max_input_price_per_million_usd: '0.1', max_output_price_per_million_usd: '0.6' })).toEqual([]);
    expect(page({ max_input_price_per_million_usd: '0.15', max_output_price_per_million_usd: '0.6' }).data).toMatchObject([{ id: 'tiny/llama', pricing: { prompt_per_million_au: '150000', completion_per_million_au: '600000' } }]);
    expect(ids({ max_representative_request_price_usd: '0.00075' })).toEqual(['tiny/llama']);
    expect(ids({ max_representative_request_price_usd: '0.000749' })).toEqual([]);
    expect(ids({ attestation_tier: '2' })).toEqual(['tiny/llama']);
    expect(ids({ min_attestation_tier: '2', live: 'true' })).toEqual([]);
    expect(ids({ quantization: 'Q4_K_M' })).toEqual(['big/model']);
    expect(ids({ provider: B })).toEqual(['tiny/llama']);
    expect(page({ provider: B }).data).toMatchObject([{ id: 'tiny/llama', providers: 1, live_providers: 0, context_length: 2048, pricing: { prompt_per_million_au: '100000', completion_per_million_au: '700000' } }]);
    expect(ids({ provider: B.toUpperCase() })).toEqual(['tiny/llama']); // hex in either case
    expect(page({ live: 'true', provider: A }).data.find((m) => m.id === 'tiny/llama')).toMatchObject({ providers: 1, context_length: 512, pricing: { prompt_per_million_au: '150000' } });
    expect(ids({ endpoint_family: 'EMBEDDINGS', modality: 'text' })).toEqual(['big/model', 'tiny/llama']);
    for (const q of [{ endpoint_family: 'IMAGES' }, { modality: 'image' }, { tools: 'true' }, { structured_output: 'true' }, { prompt_confidential: 'true' }]) expect(ids(q), JSON.stringify(q)).toEqual([]);
    expect(ids({ tools: 'false', prompt_confidential: 'false' })).toEqual(['big/model', 'tiny/llama']);
  });

  test('a route sold for some endpoints only (a model without a chat template): the entry lists the families and modalities its routes are sold for; endpoint_family and modality judged route by route', () => {
    const C = 'cc'.repeat(32);
    const rates = { 'base/model': { input_per_mtok: '1', output_per_mtok: '1' }, 'tiny/llama': { input_per_mtok: '1', output_per_mtok: '1' } };
    const mixed = [
      ...listing,
      provider(C, {}, [{ id: 'base/model', context: 512, endpoints: ['completions', 'embeddings'] }, { id: 'tiny/llama', context: 4096, endpoints: ['embeddings'] }], rates),
    ];
    const q = (query: Record<string, unknown>) => catalogPage(mixed, parseCatalogQuery(query)).data;
    expect(catalogEntry(mixed, 'base/model')).toMatchObject({ endpoint_families: ['COMPLETIONS', 'EMBEDDINGS'], modalities: ['text', 'embedding'] });
    expect(q({ endpoint_family: 'CHAT' }).map((m) => m.id)).toEqual(['big/model', 'tiny/llama']);
    expect(q({ endpoint_family: 'COMPLETIONS' }).map((m) => m.id)).toEqual(['base/model', 'big/model', 'tiny/llama']);
    // tiny/llama's 4096 context is C's, sold for embeddings only: asked for chat, the entry is of the other routes.
    expect(q({ endpoint_family: 'CHAT' }).find((m) => m.id === 'tiny/llama')).toMatchObject({ context_length: 2048, providers: 2, endpoint_families: ['CHAT', 'COMPLETIONS', 'RESPONSES', 'EMBEDDINGS'] });
    expect(q({ provider: C })).toMatchObject([
      { id: 'base/model', endpoint_families: ['COMPLETIONS', 'EMBEDDINGS'], modalities: ['text', 'embedding'] },
      { id: 'tiny/llama', context_length: 4096, endpoint_families: ['EMBEDDINGS'], modalities: ['embedding'] },
    ]);
    expect(q({ provider: C, modality: 'text' }).map((m) => m.id)).toEqual(['base/model']);
  });

  test('a provider that said it is stopping (accepting: false) is listed but not a live route', () => {
    const stopping = [provider(A, { accepting: false }, [{ id: 'x/m', context: 512 }], {}), provider(B, {}, [{ id: 'x/m', context: 512 }], {})];
    expect(catalogEntry(stopping, 'x/m')).toMatchObject({ providers: 2, live_providers: 1 });
    expect(catalogEntry([stopping[0]!], 'x/m')).toMatchObject({ providers: 1, live_providers: 0 });
  });

  test('`created` is when the model was first listed (its routes\' registered_at), not their latest heartbeat; a market without it falls back to last_seen', () => {
    const at = (registered: number, seen: number) => [provider(A, { registered_at: registered, last_seen: seen }, [{ id: 'x/m', context: 512 }], {}), provider(B, { registered_at: registered + 5000, last_seen: seen + 9000 }, [{ id: 'x/m', context: 512 }], {})];
    expect(catalogEntry(at(1_700_000_000_000, 1_700_000_300_000), 'x/m')?.created).toBe(1_700_000_000);
    expect(catalogEntry(at(1_700_000_000_000, 1_700_000_900_000), 'x/m')?.created).toBe(1_700_000_000); // (heartbeats later: the same)
    expect(catalogEntry([provider(A, { last_seen: 1_700_000_300_000 }, [{ id: 'x/m', context: 512 }], {})], 'x/m')?.created).toBe(1_700_000_300);
  });

  test('sort and order; ties by id', () => {
    expect(ids({ sort: 'input_price' })).toEqual(['tiny/llama', 'big/model']);
    expect(ids({ sort: 'context', order: 'desc' })).toEqual(['big/model', 'tiny/llama']);
    expect(ids({ sort: 'providers', order: 'desc' })).toEqual(['tiny/llama', 'big/model']);
    expect(ids({ sort: 'listed' })).toEqual(['big/model', 'tiny/llama']);
  });

  test('pages: limit and an opaque cursor to the next page', () => {
    const first = page({ limit: '1' });
    expect(first.data.map((m) => m.id)).toEqual(['big/model']);
    expect(first.has_more).toBe(true);
    const second = page({ limit: '1', cursor: first.next_cursor });
    expect(second).toMatchObject({ data: [{ id: 'tiny/llama' }], next_cursor: null, has_more: false });
    expect(refusal({ cursor: 'not-a-cursor' })).toMatch(/^cursor: /);
    expect(refusal({ cursor: Buffer.from('c1:01').toString('base64url') })).toMatch(/^cursor: /); // made up: not one this gateway wrote
  });

  test('invalid, repeated, unknown and incompatible filters are 400 naming the filter', () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ limit: '0' }, /^limit: expected an integer from 1 to 100/],
      [{ limit: '101' }, /^limit: /],
      [{ limit: ['1', '2'] }, /^limit: given more than once/],
      [{ attestation_tier: '1', min_attestation_tier: '1' }, /^attestation_tier: cannot be combined with min_attestation_tier/],
      [{ attestation_tier: '5' }, /^attestation_tier: /],
      [{ sort: 'bogus' }, /^sort: expected one of id, providers/],
      [{ order: 'up' }, /^order: /],
      [{ live: 'yes' }, /^live: expected true or false/],
      [{ modality: 'smell' }, /^modality: /],
      [{ endpoint_family: 'chat' }, /^endpoint_family: /],
      [{ max_input_price_per_million_usd: '1e3' }, /^max_input_price_per_million_usd: expected a USD decimal/],
      [{ min_context_tokens: '0' }, /^min_context_tokens: /],
      [{ quantization: '-q4' }, /^quantization: /],
      [{ provider: 'AG'.repeat(32) }, /^provider: expected 64 hex/],
      [{ color: 'blue' }, /^color: not a catalog filter/],
    ];
    for (const [q, message] of cases) expect(refusal(q), JSON.stringify(q)).toMatch(message);
    const ok: CatalogQuery = parseCatalogQuery({ live: 'true', sort: 'request_price', order: 'desc', limit: '100', min_context_tokens: '4294967295' });
    expect(ok).toMatchObject({ live: true, sort: 'request_price', order: 'desc', limit: 100, minContext: 4294967295, offset: 0 });
  });
});
