// The model catalog (GET /v1/models, marketplace-api.md "Catalog"): the marketplace's provider
// listing merged by model id, its query filters checked (400 for an invalid, repeated or
// incompatible one) and applied route by route, sorted and paged with an opaque cursor.
//
// Prices are in micro-USD ("_au": the spec does not name its unit; this project's money is
// integer micro-USD): per million tokens for the token prices, and for the representative request
// (1,000 input + 1,000 output tokens) its cost. Each of a model's three prices is the lowest any of
// its routes asks (docs/decisions.md); under a query, of the routes its filters leave.
import { isHex } from '../../attestation/bytes.ts';
import { parseUsd, type Rates } from '../../attestation/money.ts';
import { ATTESTATION_TIERS, ratesFromWire } from '../../attestation/receipt.ts';
import { quantizationBucket, representativePrice } from '../dispatch/routing.ts';
import { invalid } from './errors.ts';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import { verifyRequestContract, type ContractEndpoint, type RequestContractPayload } from '../../attestation/request-contract.ts';
import { modelServes } from '../market/registration-payload.ts';
import { acceptsModel, type ModelCapacity, type ProviderEntry } from './market-client.ts';

/** The endpoint families of the models sold through these nodes: the text endpoints (embedded llama.cpp); a model without a chat template is sold for completions and embeddings only. */
const ENDPOINT_FAMILIES = ['CHAT', 'COMPLETIONS', 'RESPONSES', 'EMBEDDINGS'] as const;
const ALL_FAMILIES = ['CHAT', 'COMPLETIONS', 'RESPONSES', 'EMBEDDINGS', 'DECISIONS', 'IMAGES', 'VIDEOS', 'AUDIO_SPEECH', 'AUDIO_TRANSCRIPTIONS', 'AUDIO_GENERATIONS', 'MUSIC', 'WORKFLOWS'];
const MODALITIES = ['text', 'embedding'] as const;
const ALL_MODALITIES = ['text', 'embedding', 'decision', 'image', 'video', 'audio', 'music', 'workflow'];
const SORTS = ['id', 'providers', 'input_price', 'output_price', 'request_price', 'context', 'listed'] as const;
const QUANT_RE = /^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$/;
const PAGE_DEFAULT = 50;
const PAGE_MAX = 100;

/** One route of a model: a provider's listed offer. */
interface Route {
  provider: string;
  live: boolean;
  context: number;
  quantization: string | undefined;
  tier: string | undefined;
  rates: Rates | undefined;
  seen: number | undefined;
  slots: number;
  tokensPerSecond: number | undefined;
  capacity: ModelCapacity | undefined;
  /** The provider's signed request contract covering the model, verified. */
  contract: { envelope: DsseEnvelope; payload: RequestContractPayload } | undefined;
  /** The endpoint families the route is sold for (all four but when its registration names fewer). */
  families: readonly (typeof ENDPOINT_FAMILIES)[number][];
  /** What those produce: text (chat, completions, responses), embeddings, or both. */
  modalities: readonly (typeof MODALITIES)[number][];
}

/** The catalog's endpoint families, by the contract's endpoint names. */
const FAMILY_OF: Record<ContractEndpoint, (typeof ENDPOINT_FAMILIES)[number]> = { 'chat/completions': 'CHAT', completions: 'COMPLETIONS', responses: 'RESPONSES', embeddings: 'EMBEDDINGS' };

/**
 * Contracts verified before, by provider and signature, with the payload they were verified with:
 * the listing is read again for every catalog call, and a signature is checked once. Room for
 * every contract a full market holds (1,000 providers, 4 each); beyond it the oldest goes.
 */
const verifiedContracts = new Map<string, { payload: string; verified: RequestContractPayload | null }>();
const VERIFIED_CONTRACTS_KEPT = 4096;

/**
 * The provider's listed contracts that verify under its key, as the market keeps them: DSSE's
 * three fields and one signature, the provider's. Anything else (a forged, broken or padded
 * envelope) is left out.
 */
function providerContracts(p: ProviderEntry): { envelope: DsseEnvelope; payload: RequestContractPayload }[] {
  const out: { envelope: DsseEnvelope; payload: RequestContractPayload }[] = [];
  for (const env of p.request_contracts ?? []) {
    const e = signedAlone(env, p.provider);
    if (!e) continue;
    const key = `${p.provider} ${e.signatures[0]!.sig}`;
    let known = verifiedContracts.get(key);
    if (known?.payload !== e.payload) {
      const v = verifyRequestContract(e, { provider: p.provider });
      known = { payload: e.payload, verified: v.ok ? v.value : null };
      if (verifiedContracts.size >= VERIFIED_CONTRACTS_KEPT) verifiedContracts.delete(verifiedContracts.keys().next().value!);
      verifiedContracts.set(key, known);
    }
    if (known.verified) out.push({ envelope: e, payload: known.verified });
  }
  return out;
}

/** `v` as an envelope of DSSE's fields alone with one signature, under keyid `provider`; else undefined. */
function signedAlone(v: unknown, provider: string): DsseEnvelope | undefined {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return undefined;
  const e = v as Record<string, unknown>;
  if (Object.keys(e).length !== 3 || typeof e.payload !== 'string' || typeof e.payloadType !== 'string' || !Array.isArray(e.signatures) || e.signatures.length !== 1) return undefined;
  const s = e.signatures[0] as Record<string, unknown> | null;
  if (s === null || typeof s !== 'object' || Object.keys(s).length !== 2 || s.keyid !== provider || typeof s.sig !== 'string' || s.sig.length > 200) return undefined;
  return { payloadType: e.payloadType, payload: e.payload, signatures: [{ keyid: provider, sig: s.sig }] };
}

interface Model {
  id: string;
  routes: Route[];
}

export interface CatalogQuery {
  live: boolean;
  endpointFamily?: string;
  modality?: string;
  tier?: number;
  minTier?: number;
  maxInput?: bigint;
  maxOutput?: bigint;
  maxRequest?: bigint;
  minContext?: number;
  quantization?: string;
  tools?: boolean;
  structuredOutput?: boolean;
  provider?: string;
  promptConfidential?: boolean;
  sort: (typeof SORTS)[number];
  order: 'asc' | 'desc';
  limit: number;
  offset: number;
}

/** The listing as models, each with its routes, by id. */
function models(listing: readonly ProviderEntry[]): Model[] {
  const byId = new Map<string, Model>();
  for (const p of listing) {
    const contracts = providerContracts(p);
    for (const m of p.models) {
      let rates: Rates | undefined;
      const wire = p.rates?.[m.id];
      try {
        rates = wire ? ratesFromWire(wire) : undefined;
      } catch {
        rates = undefined; // a malformed price is no price
      }
      const route: Route = {
        provider: p.provider,
        // (A node that said it is stopping, accepting nothing, or nothing for this model, is no live
        // route: the market tickets it no more.)
        live: p.live !== false && acceptsModel(p, m.id),
        context: typeof m.context === 'number' ? m.context : 0,
        quantization: m.quantization === undefined ? undefined : quantizationBucket(m.quantization),
        tier: ATTESTATION_TIERS.find((t) => t === p.attestation_tier),
        rates,
        // When the route was first listed (a market without registered_at: its last heartbeat).
        seen: typeof p.registered_at === 'number' ? p.registered_at : typeof p.last_seen === 'number' ? p.last_seen : undefined,
        slots: typeof m.slots === 'number' ? m.slots : 0,
        tokensPerSecond: m.tokens_per_second,
        capacity: p.capacity?.get(m.id),
        contract: contracts.find((c) => c.payload.models.includes(m.id)),
        ...familiesOf(m),
      };
      const e = byId.get(m.id) ?? { id: m.id, routes: [] };
      e.routes.push(route);
      byId.set(m.id, e);
    }
  }
  return [...byId.values()];
}

const min = (xs: bigint[]): bigint | undefined => (xs.length === 0 ? undefined : xs.reduce((a, b) => (b < a ? b : a)));
const tierNumber = (t: string | undefined): number | undefined => (t === undefined ? undefined : Number(t.slice(1)));

/**
 * What the model's live routes can take now: slots, free slots and queue as their latest
 * heartbeats say (a route not heard from yet: all its slots free), and the fastest route's
 * measured tokens a second.
 */
function capacity(routes: readonly Route[]): Record<string, number | null> {
  const live = routes.filter((r) => r.live);
  const sum = (f: (r: Route) => number): number => live.reduce((a, r) => a + f(r), 0);
  const tps = live.flatMap((r) => (r.tokensPerSecond === undefined ? [] : [r.tokensPerSecond]));
  return {
    slots: sum((r) => r.slots),
    free_slots: sum((r) => r.capacity?.free_slots ?? r.slots),
    queued: sum((r) => r.capacity?.queued ?? 0),
    queue_limit: sum((r) => r.capacity?.queue_limit ?? 0),
    tokens_per_second: tps.length ? Math.max(...tps) : null,
  };
}

/** An endpoint's common fields a request cannot leave out: not parameters a buyer chooses. */
const REQUIRED_FIELDS: Record<ContractEndpoint, readonly string[]> = { 'chat/completions': ['model', 'messages'], completions: ['model', 'prompt'], responses: ['model', 'input'], embeddings: ['model', 'input'] };

/**
 * The optional fields that change the answer, by endpoint family: the endpoint's optional common
 * fields (max_tokens, stream, …) and the attributes its signed contract marks "applied". A family
 * is listed only when every route sold for it has a verified contract for it, and then with what
 * all of them take, so any route a request is sent to takes them.
 */
function supportedParameters(routes: readonly Route[]): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [endpoint, family] of Object.entries(FAMILY_OF) as [ContractEndpoint, (typeof ENDPOINT_FAMILIES)[number]][]) {
    let shared: Set<string> | undefined;
    for (const r of routes.filter((x) => x.families.includes(family))) {
      const e = r.contract?.payload.endpoints[endpoint];
      if (!e) {
        shared = undefined;
        break;
      }
      const taken = [...e.common.filter((k) => !REQUIRED_FIELDS[endpoint].includes(k)), ...Object.entries(e.attributes).flatMap(([k, s]) => (s.use === 'applied' ? [k] : []))];
      shared = shared ? new Set(taken.filter((k) => shared!.has(k))) : new Set(taken);
    }
    if (shared) out[family] = [...shared].sort();
  }
  return out;
}

/** A model's catalog entry, from the routes that count (all of them, or those a query's filters leave). */
function entry(m: Model, routes: Route[]): Record<string, unknown> & { _sort: Record<string, bigint | number | string> } {
  const priced = routes.flatMap((r) => (r.rates ? [r.rates] : []));
  const input = min(priced.map((r) => r.input_per_mtok));
  const output = min(priced.map((r) => r.output_per_mtok));
  const request = min(priced.map((r) => representativePrice(r)));
  const seen = routes.flatMap((r) => (r.seen === undefined ? [] : [r.seen]));
  const created = seen.length ? Math.floor(Math.min(...seen) / 1000) : 0;
  const context = Math.max(0, ...routes.map((r) => r.context));
  const tiers = [...new Set(routes.flatMap((r) => (r.tier ? [r.tier] : [])))].sort();
  const providers = new Set(routes.map((r) => r.provider)).size;
  return {
    id: m.id,
    object: 'model',
    created,
    owned_by: m.id.includes('/') ? m.id.split('/')[0] : 'service',
    context_length: context,
    quantizations: [...new Set(routes.flatMap((r) => (r.quantization ? [r.quantization] : [])))].sort(),
    providers,
    live_providers: new Set(routes.filter((r) => r.live).map((r) => r.provider)).size,
    attestation_tiers: tiers,
    endpoint_families: ENDPOINT_FAMILIES.filter((f) => routes.some((r) => r.families.includes(f))),
    modalities: MODALITIES.filter((x) => routes.some((r) => r.modalities.includes(x))),
    tools: false,
    structured_output: false,
    prompt_confidential: false,
    pricing: {
      prompt_per_million_au: input?.toString() ?? null,
      completion_per_million_au: output?.toString() ?? null,
      representative_request_au: request?.toString() ?? null,
    },
    supported_parameters: supportedParameters(routes),
    capacity: capacity(routes),
    _sort: { id: m.id, providers, input_price: input ?? -1n, output_price: output ?? -1n, request_price: request ?? -1n, context, listed: created },
  };
}

/** Whether one route meets every route-level filter. */
function routeFits(r: Route, q: CatalogQuery): boolean {
  const tier = tierNumber(r.tier);
  if (q.tier !== undefined && tier !== q.tier) return false;
  if (q.minTier !== undefined && (tier === undefined || tier < q.minTier)) return false;
  if (q.maxInput !== undefined && (!r.rates || r.rates.input_per_mtok > q.maxInput)) return false;
  if (q.maxOutput !== undefined && (!r.rates || r.rates.output_per_mtok > q.maxOutput)) return false;
  if (q.maxRequest !== undefined && (!r.rates || representativePrice(r.rates) > q.maxRequest)) return false;
  if (q.minContext !== undefined && r.context < q.minContext) return false;
  if (q.quantization !== undefined && r.quantization !== q.quantization) return false;
  if (q.provider !== undefined && r.provider !== q.provider) return false;
  if (q.endpointFamily !== undefined && !(r.families as readonly string[]).includes(q.endpointFamily)) return false;
  if (q.modality !== undefined && !(r.modalities as readonly string[]).includes(q.modality)) return false;
  return true;
}

/** The endpoint families a listed model is sold for, and the modalities they produce. */
function familiesOf(m: { readonly endpoints?: readonly string[] }): Pick<Route, 'families' | 'modalities'> {
  const families = (Object.entries(FAMILY_OF) as [ContractEndpoint, (typeof ENDPOINT_FAMILIES)[number]][]).flatMap(([e, family]) => (modelServes(m, e) ? [family] : []));
  const modalities = [...(families.some((f) => f !== 'EMBEDDINGS') ? (['text'] as const) : []), ...(families.includes('EMBEDDINGS') ? (['embedding'] as const) : [])];
  return { families, modalities };
}

/** Whether the model's own features meet the model-level filters. */
function modelFits(q: CatalogQuery): boolean {
  if (q.tools === true || q.structuredOutput === true || q.promptConfidential === true) return false;
  return true;
}

/** One page of the catalog under the query, and the cursor of the next page (null on the last). */
export function catalogPage(listing: readonly ProviderEntry[], q: CatalogQuery): { data: Record<string, unknown>[]; next_cursor: string | null; has_more: boolean } {
  const fits = modelFits(q);
  const matched = models(listing).flatMap((m) => {
    // The entry describes the routes the query leaves (its prices, context, capacity are what a
    // request under the same controls can be routed to), as `live=true` counts live routes only.
    const routes = m.routes.filter((r) => (!q.live || r.live) && routeFits(r, q));
    if (!fits || routes.length === 0) return [];
    return [entry(m, routes)];
  });
  const dir = q.order === 'desc' ? -1 : 1;
  matched.sort((a, b) => {
    const x = a._sort[q.sort]!;
    const y = b._sort[q.sort]!;
    const c = x < y ? -1 : x > y ? 1 : 0;
    const [i, j] = [a._sort.id as string, b._sort.id as string];
    return c !== 0 ? c * dir : i < j ? -1 : i > j ? 1 : 0; // ties by id, always ascending: a stable page order
  });
  const page = matched.slice(q.offset, q.offset + q.limit).map(({ _sort, ...e }) => e);
  const more = q.offset + q.limit < matched.length;
  return { data: page, next_cursor: more ? encodeCursor(q.offset + q.limit) : null, has_more: more };
}

/**
 * The catalog entry of one model (every route counts), or undefined. It carries the routes' signed
 * request contracts (a buyer verifies each with verifyRequestContract and the provider's key).
 */
export function catalogEntry(listing: readonly ProviderEntry[], id: string): Record<string, unknown> | undefined {
  const m = models(listing).find((e) => e.id === id);
  if (!m) return undefined;
  const { _sort, ...e } = entry(m, m.routes);
  const contracts = m.routes.flatMap((r) => (r.contract ? [{ provider: r.provider, version: r.contract.payload.version, contract: r.contract.envelope }] : []));
  return { ...e, request_contracts: contracts.sort((a, b) => (a.provider < b.provider ? -1 : a.provider > b.provider ? 1 : 0)) };
}

// An opaque cursor: the offset of the next page, base64url, tagged so a made-up one is refused.
const encodeCursor = (offset: number): string => Buffer.from(`c1:${offset}`).toString('base64url');
function decodeCursor(s: string): number {
  const m = /^c1:([0-9]{1,9})$/.exec(Buffer.from(s, 'base64url').toString('utf8'));
  if (!m || encodeCursor(Number(m[1])) !== s) throw invalid('cursor', 'expected a cursor from a previous page');
  return Number(m[1]);
}

/**
 * The query of GET /v1/models, checked: each parameter at most once and of its type and bounds,
 * attestation_tier and min_attestation_tier not together; anything else is 400 naming it.
 */
export function parseCatalogQuery(query: Record<string, unknown>): CatalogQuery {
  const q: CatalogQuery = { live: false, sort: 'id', order: 'asc', limit: PAGE_DEFAULT, offset: 0 };
  const known = new Set(['live', 'endpoint_family', 'modality', 'attestation_tier', 'min_attestation_tier', 'max_input_price_per_million_usd', 'max_output_price_per_million_usd', 'max_representative_request_price_usd', 'min_context_tokens', 'quantization', 'tools', 'structured_output', 'provider', 'prompt_confidential', 'sort', 'order', 'limit', 'cursor']);
  for (const [k, v] of Object.entries(query)) {
    if (!known.has(k)) throw invalid(k.slice(0, 64), 'not a catalog filter');
    if (typeof v !== 'string') throw invalid(k, 'given more than once');
  }
  const str = (k: string): string | undefined => query[k] as string | undefined;
  const bool = (k: string): boolean | undefined => {
    const v = str(k);
    if (v === undefined) return undefined;
    if (v !== 'true' && v !== 'false') throw invalid(k, 'expected true or false');
    return v === 'true';
  };
  const int = (k: string, lo: number, hi: number): number | undefined => {
    const v = str(k);
    if (v === undefined) return undefined;
    if (!/^[0-9]{1,10}$/.test(v) || Number(v) < lo || Number(v) > hi) throw invalid(k, `expected an integer from ${lo} to ${hi}`);
    return Number(v);
  };
  const usd = (k: string): bigint | undefined => {
    const v = str(k);
    if (v === undefined) return undefined;
    const micro = parseUsd(v);
    if (micro === undefined) throw invalid(k, 'expected a USD decimal like "0.15" (at most 6 decimals)');
    return micro;
  };
  const oneOf = <T extends string>(k: string, values: readonly T[]): T | undefined => {
    const v = str(k);
    if (v !== undefined && !values.includes(v as T)) throw invalid(k, `expected one of ${values.join(', ')}`);
    return v as T | undefined;
  };
  const tier = int('attestation_tier', 1, 4);
  const minTier = int('min_attestation_tier', 1, 4);
  if (tier !== undefined && minTier !== undefined) throw invalid('attestation_tier', 'cannot be combined with min_attestation_tier');
  const quant = str('quantization');
  if (quant !== undefined && !QUANT_RE.test(quant)) throw invalid('quantization', 'expected 1 to 32 letters, digits, "_" or "-", starting with a letter or digit');
  const provider = str('provider')?.toLowerCase(); // (hex in either case, as X-Service-Prefer-Providers)
  if (provider !== undefined && !isHex(provider, 32)) throw invalid('provider', 'expected 64 hex characters');
  const given: Partial<CatalogQuery> = {
    live: bool('live'),
    endpointFamily: oneOf('endpoint_family', ALL_FAMILIES),
    modality: oneOf('modality', ALL_MODALITIES),
    tier,
    minTier,
    maxInput: usd('max_input_price_per_million_usd'),
    maxOutput: usd('max_output_price_per_million_usd'),
    maxRequest: usd('max_representative_request_price_usd'),
    minContext: int('min_context_tokens', 1, 4294967295),
    quantization: quant === undefined ? undefined : quantizationBucket(quant),
    tools: bool('tools'),
    structuredOutput: bool('structured_output'),
    promptConfidential: bool('prompt_confidential'),
    provider,
  } as Partial<CatalogQuery>;
  for (const [k, v] of Object.entries(given)) if (v !== undefined) (q as unknown as Record<string, unknown>)[k] = v;
  q.sort = oneOf('sort', SORTS) ?? 'id';
  q.order = oneOf('order', ['asc', 'desc'] as const) ?? 'asc';
  q.limit = int('limit', 1, PAGE_MAX) ?? PAGE_DEFAULT;
  const cursor = str('cursor');
  if (cursor !== undefined) q.offset = decodeCursor(cursor);
  return q;
}
