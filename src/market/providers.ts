// Providers: checking a registration (signed by the node's key, PeerId of that key, a price list
// the same key signed covering every model, recent), accepting heartbeats (the node's signed
// capacity snapshot), and deciding who is live.
import { fromHex, isHex } from '../../attestation/bytes.ts';
import { checkEnvelopeShape, verifyEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { MAX_MICRO, type Rates } from '../../attestation/money.ts';
import { contextWorstCase } from '../dispatch/routing.ts';
import { verifyPriceList } from '../../attestation/price-list.ts';
import { verifyRequestContract } from '../../attestation/request-contract.ts';
import { readPayload } from '../../attestation/signed-payload.ts';
import { peekShallow } from './peek-payload.ts';
import type { VerifyError } from '../../attestation/result.ts';
import { CAPACITY_PAYLOAD_TYPE, type CapacitySnapshot } from '../p2p/capacity-protocol.ts';
import { peerIdFromProviderId } from '../p2p/peer-id.ts';
import { validateCapacitySnapshot } from './capacity.ts';
import { MarketError } from './errors.ts';
import { REGISTRATION_PAYLOAD_TYPE, validateRegistrationPayload, type RegistrationPayload } from './registration-payload.ts';
import type { HeldCapacity, MarketStore, ProviderRecord } from './store.ts';
import { ratesFromWire, ratesToWire } from '../../attestation/receipt.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';

/** How far a registration's issued_at (or a heartbeat's at) may be from the market's clock. */
export const MAX_CLOCK_DIFFERENCE_MS = 5 * 60_000;
/** The largest queue figure of a heartbeat the market keeps (larger ones are kept as this). */
const MAX_QUEUE_FIGURE = 2 ** 32 - 1;
/** A provider is live while its last registration or heartbeat is this many intervals old at most. */
export const LIVE_INTERVALS = 3;

const SIGNATURE_CODES = new Set(['unknown_key', 'signature_invalid', 'signature_malformed']);

/**
 * The provider a signed body claims to come from, read before the signature is checked (the
 * signature is then checked against exactly that key). Undefined when it cannot be read.
 */
function claimedProvider(env: DsseEnvelope): string | undefined {
  const p = peekShallow(env)?.provider;
  return isHex(p, 32) ? p : undefined;
}

/** Shape, payload type, claimed provider and signature by that provider's key: the common start of both bodies. */
function verifySignedBody(body: unknown, payloadType: string, invalidCode: string, what: string): { provider: string; payload: Uint8Array } {
  const shaped = checkEnvelopeShape(body);
  if (!shaped.ok) throw new MarketError(400, invalidCode, `envelope: ${shaped.error.message}`);
  const env = shaped.value;
  if (env.payloadType !== payloadType) throw new MarketError(400, invalidCode, `payloadType: expected ${payloadType}`);
  const provider = claimedProvider(env);
  if (provider === undefined) throw new MarketError(400, invalidCode, `provider: the ${what} payload names no provider (64 lowercase hex characters)`);
  const v = verifyEnvelope(env, { payloadType, keys: [{ keyid: provider, publicKey: fromHex(provider) }] });
  if (!v.ok) {
    if (SIGNATURE_CODES.has(v.error.code)) {
      const why = v.error.code === 'unknown_key' ? `no signature by the key of provider ${provider} (keyid = provider id)` : v.error.message;
      throw new MarketError(401, 'signature_invalid', `${what}: ${why}`);
    }
    throw new MarketError(400, invalidCode, `envelope: ${v.error.message}`);
  }
  return { provider, payload: v.value.payload };
}

function payloadError(code: string, e: VerifyError): MarketError {
  // readPayload's messages start with "<what> <field>: …", which names the field.
  return new MarketError(400, code, e.message);
}

export interface VerifiedRegistration {
  payload: RegistrationPayload;
  rates: Map<string, Rates>;
  /** The request contracts as signed (checkRequestContracts). */
  contracts: DsseEnvelope[];
}

/**
 * Each request contract signed by the provider (under keyid = its id), valid, and covering only
 * registered models, none of them twice. Throws MarketError (400 registration_invalid) naming the
 * contract. What is kept of each is the signed envelope only: its DSSE fields and the provider's
 * signature (no other key or signature rides along with what buyers are shown as signed).
 */
function checkRequestContracts(p: RegistrationPayload, code: string): DsseEnvelope[] {
  const registered = new Set(p.models.map((m) => m.id));
  const covered = new Set<string>();
  return (p.request_contracts ?? []).map((env, i) => {
    const v = verifyRequestContract(env, { provider: p.provider });
    if (!v.ok) throw new MarketError(400, code, `request_contracts[${i}]: does not verify for provider ${p.provider} (${v.error.code}: ${v.error.message})`);
    const signature = env.signatures.find((s) => s.keyid === p.provider);
    if (!signature) throw new MarketError(400, code, `request_contracts[${i}]: has no signature under keyid = the provider id`);
    for (const id of v.value.models) {
      if (!registered.has(id)) throw new MarketError(400, code, `request_contracts[${i}]: covers "${id.slice(0, 100)}", which the registration does not list`);
      if (covered.has(id)) throw new MarketError(400, code, `request_contracts[${i}]: covers "${id.slice(0, 100)}", which another contract covers too`);
      covered.add(id);
    }
    return { payloadType: env.payloadType, payload: env.payload, signatures: [{ keyid: signature.keyid!, sig: signature.sig }] };
  });
}

/** Checks a registration envelope; throws MarketError (400 registration_invalid, 401 signature_invalid). */
function verifyRegistration(body: unknown, now: number): VerifiedRegistration {
  const code = 'registration_invalid';
  const { provider, payload: bytes } = verifySignedBody(body, REGISTRATION_PAYLOAD_TYPE, code, 'registration');
  const read = readPayload(bytes, validateRegistrationPayload, 'registration');
  if (!read.ok) throw payloadError(code, read.error);
  const p = read.value;
  const peerId = peerIdFromProviderId(provider).toString();
  if (p.peer_id !== peerId) throw new MarketError(400, code, `peer_id: ${p.peer_id.slice(0, 80)} is not the PeerId of provider ${provider} (${peerId})`);
  const prices = verifyPriceList(p.price_list, { provider });
  if (!prices.ok) throw new MarketError(400, code, `price_list: does not verify for provider ${provider} (${prices.error.code}: ${prices.error.message})`);
  if (prices.value.version !== p.price_version) throw new MarketError(400, code, `price_version: is ${p.price_version}, the price list's version is ${prices.value.version}`);
  const rates = new Map<string, Rates>();
  for (const e of prices.value.models) {
    // Every rate the list signs, per-unit ones too: a ticket states them and a receipt is checked against them.
    rates.set(e.model, ratesFromWire(e));
  }
  p.models.forEach((m, i) => {
    if (!rates.has(m.id)) throw new MarketError(400, code, `price_list: has no price for models[${i}] "${m.id.slice(0, 100)}"`);
    // A ticket without a cost cap holds the worst case at the model's context: it must fit a
    // ticket's hold, or every such ticket for the model would fail while this provider is picked.
    const worst = contextWorstCase(m.context, rates.get(m.id)!);
    if (worst > MAX_MICRO) throw new MarketError(400, code, `models[${i}].context: at this model's rates one request's worst case (context × the higher rate) is ${String(worst).length} digits of micro-USD, more than a ticket's hold can carry (${String(MAX_MICRO).length})`);
  });
  const contracts = checkRequestContracts(p, code);
  if (Math.abs(now - p.issued_at) > MAX_CLOCK_DIFFERENCE_MS) {
    throw new MarketError(400, code, `issued_at: ${p.issued_at} is more than 5 minutes from the market's clock (${now})`);
  }
  // Buyers route on the tier (X-Service-Min-Att-Tier): a claim above T1 needs evidence this market
  // does not verify yet, so it is refused rather than believed.
  if (p.attestation_tier !== 'T1') {
    throw new MarketError(400, code, `attestation_tier: ${p.attestation_tier} needs attestation evidence, which this market does not verify yet; register as T1`);
  }
  return { payload: p, rates, contracts };
}

/**
 * Registers (or re-registers) a provider. An older registration than the one in force is refused;
 * the one in force, sent again, is acknowledged and changes nothing (a replay must not bring a
 * silent or stopping provider back to life).
 */
export function register(store: MarketStore, body: unknown, now: number): ProviderRecord {
  const { payload: p, rates, contracts } = verifyRegistration(body, now);
  const old = store.providers.get(p.provider);
  // Older than the one in force is refused, but one in force from the future (a node whose clock
  // ran ahead, restarted after it was set right) does not lock its provider out until the market's
  // clock catches up: a registration of the last minute (by the market's clock) or later replaces
  // it (s23 h4).
  if (old && p.issued_at < (old.issued_at > now ? now - 60_000 : old.issued_at)) {
    throw new MarketError(400, 'registration_invalid', `issued_at: ${p.issued_at} is older than the registration in force (${old.issued_at})`);
  }
  if (old && p.issued_at === old.issued_at) {
    const same = (a: unknown, b: unknown): boolean => canonicalize(a ?? null) === canonicalize(b ?? null);
    if (old.price_version === p.price_version && same(old.models, p.models) && same(old.addresses, p.addresses) && same(old.request_contracts ?? [], contracts)) return old;
    throw new MarketError(400, 'registration_invalid', `issued_at: ${p.issued_at} is that of the registration in force, with other contents: a new registration needs a later issued_at`);
  }
  const record: ProviderRecord = {
    provider: p.provider,
    peer_id: p.peer_id,
    addresses: p.addresses,
    models: p.models,
    price_version: p.price_version,
    attestation_tier: p.attestation_tier,
    rates,
    issued_at: p.issued_at,
    // (Since when the market lists it: kept across its re-registrations.)
    registered_at: old?.registered_at ?? now,
    last_seen: now,
    last_ticket_at: old?.last_ticket_at ?? 0,
    ...(contracts.length ? { request_contracts: contracts } : {}),
  };
  store.putProvider(record, now); // 503 too_many_providers when the market's bounds leave no room
  return record;
}

/**
 * Takes a heartbeat (a signed capacity snapshot). 404 unknown_provider when the provider is not
 * registered here, or registered under another price version (it restarted with new prices), and
 * 409 heartbeat_stale when the snapshot is not newer than the last accepted one or older than the
 * registration in force: the node then registers again.
 */
export function heartbeat(store: MarketStore, body: unknown, now: number): ProviderRecord {
  const code = 'heartbeat_invalid';
  const { provider, payload: bytes } = verifySignedBody(body, CAPACITY_PAYLOAD_TYPE, code, 'heartbeat');
  const read = readPayload(bytes, validateCapacitySnapshot, 'capacity snapshot');
  if (!read.ok) throw payloadError(code, read.error);
  const snap: CapacitySnapshot = read.value;
  const record = store.providers.get(provider);
  if (!record) throw new MarketError(404, 'unknown_provider', `provider ${provider} is not registered here: register again`);
  if (snap.price_version !== record.price_version) {
    throw new MarketError(404, 'unknown_provider', `provider ${provider} is registered with price version ${record.price_version}, the heartbeat says ${snap.price_version}: register again`);
  }
  // The same bound as registration's, both ways: a node whose clock runs a little fast must not be
  // able to register and then have every heartbeat refused.
  if (Math.abs(now - snap.at) > MAX_CLOCK_DIFFERENCE_MS) throw new MarketError(400, code, `at: ${snap.at} is more than 5 minutes from the market's clock (${now})`);
  // A replayed or reordered older snapshot, or one from before the registration in force, neither
  // refreshes liveness nor replaces a newer one, and is refused as such (409 heartbeat_stale): a
  // node whose clock stepped back would otherwise be told all is well while the market stops
  // listing it live. The node registers again, with a later issued_at, and its heartbeats count.
  if (snap.at < record.issued_at) {
    throw new MarketError(409, 'heartbeat_stale', `at: ${snap.at} is older than the registration in force (issued_at ${record.issued_at}): not applied; register again`);
  }
  if (record.capacity && snap.at <= record.capacity.at) {
    throw new MarketError(409, 'heartbeat_stale', `at: ${snap.at} is not newer than the last accepted snapshot (at ${record.capacity.at}): not applied; register again`);
  }
  record.capacity = heldCapacity(record, snap);
  record.last_seen = now;
  return record;
}

/**
 * What the market keeps of a snapshot: `at`, `accepting` and the free slots and queue of the
 * models the provider registered. The snapshot may carry fields the market does not know and up to 1000
 * models; keeping it whole would let a heartbeat hold megabytes.
 */
function heldCapacity(record: ProviderRecord, snap: CapacitySnapshot): HeldCapacity {
  /** Registered model → its slots; taken out once its first entry is kept. */
  const registered = new Map(record.models.map((m) => [m.id, m.slots]));
  const models: HeldCapacity['models'] = [];
  for (const m of snap.models) {
    // Only registered models, and of each the first entry, as freeSlots reads it. Free slots are
    // at most the slots registered, a queue figure at most a 32-bit count: the catalog adds them
    // up across providers, and one provider's figure must not swamp the sum.
    const slots = registered.get(m.id);
    if (slots === undefined) continue;
    registered.delete(m.id);
    models.push({ id: m.id, free_slots: Math.min(m.free_slots, slots), queued: Math.min(m.queued, MAX_QUEUE_FIGURE), queue_limit: Math.min(m.queue_limit, MAX_QUEUE_FIGURE), ...(m.accepting === false ? { accepting: false as const } : {}) });
  }
  return { at: snap.at, accepting: snap.accepting, models };
}

export function isLive(p: ProviderRecord, now: number, heartbeatIntervalMs: number): boolean {
  return now - p.last_seen <= LIVE_INTERVALS * heartbeatIntervalMs;
}

/** The public view of a provider (GET /v1/providers); its request contracts only with `contracts`. */
export function providerView(p: ProviderRecord, now: number, heartbeatIntervalMs: number, contracts = false) {
  return {
    provider: p.provider,
    peer_id: p.peer_id,
    addresses: p.addresses,
    models: p.models,
    price_version: p.price_version,
    // From the provider's verified price list: micro-USD per million tokens, decimal strings.
    rates: Object.fromEntries([...p.rates].map(([id, r]) => [id, ratesToWire(r)])),
    attestation_tier: p.attestation_tier,
    registered_at: p.registered_at,
    last_seen: p.last_seen,
    live: isLive(p, now, heartbeatIntervalMs),
    accepting: p.capacity?.accepting ?? true,
    // The latest heartbeat's figures (none before the first).
    ...(p.capacity ? { capacity: { at: p.capacity.at, models: p.capacity.models } } : {}),
    ...(contracts && p.request_contracts ? { request_contracts: p.request_contracts } : {}),
  };
}
