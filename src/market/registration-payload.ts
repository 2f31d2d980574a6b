// The registration a node signs and the marketplace verifies (docs/market-api.md §Providers): who
// the provider is, where to dial it, what it sells and at which signed prices. Shared by the node
// (src/registration.ts signs it) and the market (providers.ts checks it), so both agree on every
// field.
import { multiaddr } from '@multiformats/multiaddr';
import { utf8 } from '../../attestation/bytes.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';
import { checkEnvelopeShape, signEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import * as f from '../../attestation/fields.ts';
import { ATTESTATION_TIERS, type AttestationTier } from '../../attestation/receipt.ts';
import { PAID_ENDPOINTS, type PaidEndpoint } from '../serve/contract.ts';

export const REGISTRATION_PAYLOAD_TYPE = 'application/vnd.service.registration.v1+json';

export interface RegisteredModel {
  id: string;
  /** Canonical bucket: lowercase, "_" → "-". */
  quantization: string;
  context: number;
  slots: number;
  tokens_per_second: number;
  /** The paid endpoints the model is sold for; absent: all of them (modelServes). */
  endpoints?: PaidEndpoint[];
}

/** Whether a registered model is sold for an endpoint (one without `endpoints` is sold for every one). */
export function modelServes(m: { readonly endpoints?: readonly string[] }, endpoint: string): boolean {
  return m.endpoints === undefined || m.endpoints.includes(endpoint);
}

export interface RegistrationPayload {
  v: 1;
  provider: string;
  peer_id: string;
  addresses: string[];
  price_version: string;
  price_list: DsseEnvelope;
  models: RegisteredModel[];
  /** The provider's signed request contracts (each names the models it covers); optional. */
  request_contracts?: DsseEnvelope[];
  attestation_tier: AttestationTier;
  issued_at: number;
}

const ID_RE = /^[A-Za-z0-9._:-]+$/;
/** A model id as buyers name it ("vendor/model"): printable ASCII, no spaces; starts with a letter or digit. */
export const MODEL_ID_RE = /^[A-Za-z0-9][A-Za-z0-9._:@+/-]*$/;
export const MODEL_ID_MAX = 256;
/** A quantization bucket: lowercase, "_" written "-" (q4-k-m, f16). */
export const QUANT_RE = /^[a-z0-9][a-z0-9.-]*$/;
export const QUANT_MAX = 32;
/** Bounds on what a provider claims, so that sums over providers stay exact and one claim cannot swamp them. */
export const MAX_SLOTS = 65_535;
export const MAX_TOKENS_PER_SECOND = 1e9;
const FIELDS = ['v', 'provider', 'peer_id', 'addresses', 'price_version', 'price_list', 'models', 'attestation_tier', 'issued_at'] as const;
const MODEL_FIELDS = ['id', 'quantization', 'context', 'slots', 'tokens_per_second'] as const;
/** A provider signs one contract for the models that share it (one a runtime adapter, at most). */
export const MAX_REQUEST_CONTRACTS = 4;
/** The largest request contract payload (base64 characters): a node's own is ~10 KiB. */
export const MAX_REQUEST_CONTRACT_CHARS = 64 * 1024;

/** Checks every field of a registration payload; throws FieldError naming the first bad one. */
export function validateRegistrationPayload(value: unknown): RegistrationPayload {
  const p = f.object(value, '');
  f.keys(p, '', FIELDS, ['request_contracts']);
  if (p.v !== 1) throw new f.FieldError('v', 'expected 1');
  f.hex32(p.provider, 'provider');
  f.string(p.peer_id, 'peer_id', 128, /^[A-Za-z0-9]+$/);
  if (!Array.isArray(p.addresses) || p.addresses.length === 0 || p.addresses.length > 32) throw new f.FieldError('addresses', 'expected 1 to 32 multiaddrs');
  p.addresses.forEach((a, i) => {
    f.string(a, `addresses[${i}]`, 512);
    let names: { name: string; value?: string }[];
    try {
      names = multiaddr(a as string).getComponents();
    } catch (e) {
      throw new f.FieldError(`addresses[${i}]`, `not a multiaddr (${(e as Error).message})`);
    }
    // Where a buyer's gateway dials this node: TCP to an IP or DNS name, optionally this node's own
    // /p2p/ id (a socket on the gateway's host, or another peer's id, is not this node).
    const [host, tcp, p2p, ...more] = names;
    const ok = host !== undefined && ['ip4', 'ip6', 'dns', 'dns4', 'dns6'].includes(host.name) && tcp?.name === 'tcp' && more.length === 0 && (p2p === undefined || (p2p.name === 'p2p' && p2p.value === p.peer_id));
    if (!ok) throw new f.FieldError(`addresses[${i}]`, 'expected /ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT, optionally /p2p/ with this peer_id');
  });
  f.string(p.price_version, 'price_version', 64, ID_RE);
  const shaped = checkEnvelopeShape(p.price_list);
  if (!shaped.ok) throw new f.FieldError('price_list', shaped.error.message);
  if (!Array.isArray(p.models) || p.models.length === 0 || p.models.length > 1000) throw new f.FieldError('models', 'expected 1 to 1000 entries');
  const seen = new Set<string>();
  p.models.forEach((m, i) => {
    const where = `models[${i}]`;
    const o = f.object(m, where);
    f.keys(o, where, MODEL_FIELDS, ['endpoints']);
    const id = f.string(o.id, `${where}.id`, MODEL_ID_MAX, MODEL_ID_RE);
    if (seen.has(id)) throw new f.FieldError(`${where}.id`, `"${id}" is listed twice`);
    seen.add(id);
    f.string(o.quantization, `${where}.quantization`, QUANT_MAX, QUANT_RE);
    const context = f.uint(o.context, `${where}.context`);
    if (context < 1 || context > 4294967295) throw new f.FieldError(`${where}.context`, 'expected 1 to 4294967295');
    const slots = f.uint(o.slots, `${where}.slots`);
    if (slots < 1 || slots > MAX_SLOTS) throw new f.FieldError(`${where}.slots`, `expected 1 to ${MAX_SLOTS}`);
    const tps = o.tokens_per_second;
    if (typeof tps !== 'number' || !Number.isFinite(tps) || tps < 0 || tps > MAX_TOKENS_PER_SECOND) throw new f.FieldError(`${where}.tokens_per_second`, `expected a number from 0 to ${MAX_TOKENS_PER_SECOND}`);
    if (o.endpoints !== undefined) {
      const e = o.endpoints;
      const ok = Array.isArray(e) && e.length >= 1 && e.every((x, j) => (PAID_ENDPOINTS as readonly unknown[]).includes(x) && e.indexOf(x) === j);
      if (!ok) throw new f.FieldError(`${where}.endpoints`, `expected 1 to ${PAID_ENDPOINTS.length} of ${PAID_ENDPOINTS.join(', ')}, none twice`);
    }
  });
  if (p.request_contracts !== undefined) {
    if (!Array.isArray(p.request_contracts)) throw new f.FieldError('request_contracts', 'expected a list of signed request contract envelopes');
    if (p.request_contracts.length > MAX_REQUEST_CONTRACTS) throw new f.FieldError('request_contracts', `expected at most ${MAX_REQUEST_CONTRACTS} envelopes (one for each set of models that share a contract), got ${p.request_contracts.length}`);
    p.request_contracts.forEach((e, i) => {
      const shaped = checkEnvelopeShape(e);
      if (!shaped.ok) throw new f.FieldError(`request_contracts[${i}]`, shaped.error.message);
      if (shaped.value.payload.length > MAX_REQUEST_CONTRACT_CHARS) throw new f.FieldError(`request_contracts[${i}]`, `a payload of more than ${MAX_REQUEST_CONTRACT_CHARS} base64 characters`);
    });
  }
  f.oneOf(p.attestation_tier, 'attestation_tier', ATTESTATION_TIERS);
  f.uint(p.issued_at, 'issued_at');
  return p as unknown as RegistrationPayload;
}

/** Signs a registration with the node's key (keyid = provider id); validates it first. */
export function signRegistration(seed: Uint8Array, payload: RegistrationPayload): DsseEnvelope {
  validateRegistrationPayload(payload);
  return signEnvelope(REGISTRATION_PAYLOAD_TYPE, utf8(canonicalize(payload)), { keyid: payload.provider, seed });
}
