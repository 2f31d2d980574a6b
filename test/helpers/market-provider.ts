// A provider as the development market sees it, for tests that talk to the market directly: a key,
// its PeerId, a signed price list, the models it registers; signed registrations and heartbeats;
// JSON calls to the market's HTTP API; the node's own registration client for such a provider.
import { canonicalize } from '../../attestation/canonical-json.ts';
import { utf8 } from '../../attestation/bytes.ts';
import { signEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { signPriceList } from '../../attestation/price-list.ts';
import { signRequestContract } from '../../attestation/request-contract.ts';
import { TEXT_REQUEST_CONTRACT } from '../../src/serve/request-contract.ts';
import { REGISTRATION_PAYLOAD_TYPE, type RegisteredModel, type RegistrationPayload } from '../../src/market/registration-payload.ts';
import { signCapacity } from '../../src/p2p/capacity-protocol.ts';
import { peerIdFromSeed } from '../../src/p2p/peer-id.ts';
import { createLogger } from '../../src/ops/logger.ts';
import { startRegistration, type Registration, type RegistrationOptions } from '../../src/registration.ts';
import { testKey, type TestKey } from './receipts.ts';

export const TINY: RegisteredModel = { id: 'tiny/llama', quantization: 'f32', context: 512, slots: 1, tokens_per_second: 1000 };
export const TINY_PRICE = { model: 'tiny/llama', input_per_mtok: '150000', output_per_mtok: '600000' };

export interface Provider {
  key: TestKey;
  peerId: string;
  prices: ReturnType<typeof signPriceList>;
  models: RegisteredModel[];
}

export function provider(opts: { key?: TestKey; models?: RegisteredModel[]; prices?: (typeof TINY_PRICE)[] } = {}): Provider {
  const key = opts.key ?? testKey();
  return { key, peerId: peerIdFromSeed(key.seed).toString(), prices: signPriceList(key.seed, key.id, opts.prices ?? [TINY_PRICE]), models: opts.models ?? [TINY] };
}

/** A signed registration (issued now unless `over` says otherwise), by the provider's key unless `signer` is given. */
export function registration(p: Provider, over: Partial<Record<keyof RegistrationPayload, unknown>> = {}, signer: TestKey = p.key): DsseEnvelope {
  const payload = {
    v: 1,
    provider: p.key.id,
    peer_id: p.peerId,
    addresses: ['/ip4/127.0.0.1/tcp/4101'],
    price_version: p.prices.payload.version,
    price_list: p.prices.envelope,
    models: p.models,
    attestation_tier: 'T1',
    issued_at: Date.now(),
    ...over,
  };
  return signEnvelope(REGISTRATION_PAYLOAD_TYPE, utf8(canonicalize(payload)), { keyid: p.key.id, seed: signer.seed });
}

/** The provider's signed request contract (the node's own) for its models, or for `models`, signed by `signer`. */
export function contractOf(p: Provider, over: { models?: string[]; signer?: TestKey } = {}): DsseEnvelope {
  return signRequestContract((over.signer ?? p.key).seed, p.key.id, over.models ?? p.models.map((m) => m.id), TEXT_REQUEST_CONTRACT).envelope;
}

/** A signed capacity snapshot (a heartbeat body), taken now unless `at` is given. */
export function heartbeatOf(p: Provider, over: { accepting?: boolean; free_slots?: number; price_version?: string; at?: number } = {}): DsseEnvelope {
  return signCapacity(
    { seed: p.key.seed, providerId: p.key.id },
    {
      price_version: over.price_version ?? p.prices.payload.version,
      attestation_tier: 'T1',
      accepting: over.accepting ?? true,
      models: p.models.map((m) => ({ id: m.id, context: m.context, quantization: m.quantization, tokens_per_second: m.tokens_per_second, slots: m.slots, free_slots: over.free_slots ?? m.slots, queued: 0, queue_limit: 4 })),
    },
    over.at,
  );
}

/** One JSON call: the status and the parsed body. */
export async function call(base: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(base + path, { method, ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }) });
  return { status: res.status, body: await res.json() };
}

/** A JSON log line of the node. */
export interface LogLine {
  level: number;
  msg: string;
  [k: string]: unknown;
}

/**
 * The node's registration client (startRegistration) for provider `p` with the market at
 * `marketUrl`, logging into `lines`; its heartbeats are p's snapshots at the time the client
 * stamps. The caller stops it (reg.stop()).
 */
export function registeringNode(marketUrl: string, p: Provider, over: Partial<RegistrationOptions> = {}): { reg: Registration; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = createLogger({ level: 'debug', destination: { write: (s: string) => void lines.push(JSON.parse(s) as LogLine) } });
  const reg = startRegistration({
    marketUrl,
    seed: p.key.seed,
    providerId: p.key.id,
    peerId: p.peerId,
    addresses: ['/ip4/127.0.0.1/tcp/4101'],
    priceList: { envelope: p.prices.envelope, version: p.prices.payload.version },
    models: p.models,
    tier: 'T1',
    capacity: (at) => heartbeatOf(p, { at }),
    logger,
    ...over,
  });
  return { reg, lines };
}
