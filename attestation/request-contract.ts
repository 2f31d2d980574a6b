// Signed request contracts (marketplace-api.md, "Model": "signed request contracts (the attributes
// a model accepts beyond the common fields)"; Versioning 2: "The request contract of each model is
// signed and read from GET /models/by-id"). A provider signs, for the models it lists, each
// endpoint's common fields and every other attribute it accepts: its type, bounds, the values it
// takes, and what it does (applied to the answer, taken only at its default, or without effect).
// Like a price list, its version is derived from its contents.
import { utf8 } from './bytes.ts';
import { canonicalize } from './canonical-json.ts';
import { signEnvelope, type DsseEnvelope } from './dsse.ts';
import * as f from './fields.ts';
import { sha256Hex } from './hash.ts';
import type { VerifyResult } from './result.ts';
import { verifyProviderSigned } from './signed-payload.ts';

export const REQUEST_CONTRACT_PAYLOAD_TYPE = 'application/vnd.service.request-contract.v1+json';

/** The endpoints a request contract may describe. */
export const CONTRACT_ENDPOINTS = ['chat/completions', 'completions', 'responses', 'embeddings'] as const;
export type ContractEndpoint = (typeof CONTRACT_ENDPOINTS)[number];

const TYPES = ['string', 'number', 'integer', 'boolean', 'object', 'array'] as const;
export type AttributeType = (typeof TYPES)[number];
/** applied: changes the answer; default_only: only the values in `enum` are taken; no_effect: taken, never changes the answer. */
const USES = ['applied', 'default_only', 'no_effect'] as const;
export type AttributeUse = (typeof USES)[number];

export interface AttributeSpec {
  type: AttributeType | AttributeType[];
  use: AttributeUse;
  minimum?: number;
  maximum?: number;
  exclusive_minimum?: number;
  max_items?: number;
  /** The only values taken (JSON null, or the field left out, is always taken as "not given"). */
  enum?: unknown[];
  default?: unknown;
  note?: string;
}

export interface EndpointContract {
  /** The marketplace API's common fields of the endpoint (model, messages, …). */
  common: string[];
  /** Every other field the endpoint takes; any field in neither list is refused (400). */
  attributes: Record<string, AttributeSpec>;
  /**
   * Where the provider takes less of a common field than the marketplace API allows (roles, content
   * parts, list lengths, options): one note each, naming what it takes. A common field without a
   * note is taken as the API describes it.
   */
  common_notes?: Record<string, string>;
}

export interface RequestContractPayload {
  v: 1;
  provider: string;
  /** "c-" and 16 hex of SHA-256 over the canonical models and endpoints. */
  version: string;
  models: string[];
  endpoints: Partial<Record<ContractEndpoint, EndpointContract>>;
}

const NAME_RE = /^[a-z][a-z0-9_]{0,63}$/;
const SPEC_FIELDS = ['type', 'use', 'minimum', 'maximum', 'exclusive_minimum', 'max_items', 'enum', 'default', 'note'] as const;

/** "c-" + 16 hex of SHA-256 over the canonical models (sorted) and endpoints. */
export function contractVersion(models: readonly string[], endpoints: RequestContractPayload['endpoints']): string {
  return 'c-' + sha256Hex(canonicalize({ models: [...models].sort(), endpoints })).slice(0, 16);
}

function finite(v: unknown, field: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new f.FieldError(field, 'expected a finite number');
  return v;
}

function attribute(v: unknown, field: string): AttributeSpec {
  const s = f.object(v, field);
  f.keys(s, field, ['type', 'use'], SPEC_FIELDS);
  const types = Array.isArray(s.type) ? s.type : [s.type];
  if (types.length === 0 || types.length > TYPES.length) throw new f.FieldError(f.join(field, 'type'), `expected one or more of ${TYPES.join(', ')}`);
  types.forEach((t, i) => {
    const where = Array.isArray(s.type) ? `${field}.type[${i}]` : `${field}.type`;
    f.oneOf(t, where, TYPES);
    if (types.indexOf(t) !== i) throw new f.FieldError(where, `"${t}" is listed twice`);
  });
  const numeric = types.includes('number') || types.includes('integer');
  for (const k of ['minimum', 'maximum', 'exclusive_minimum'] as const) if (s[k] !== undefined && !numeric) throw new f.FieldError(f.join(field, k), 'only for a number or an integer');
  f.oneOf(s.use, f.join(field, 'use'), USES);
  for (const k of ['minimum', 'maximum', 'exclusive_minimum'] as const) if (s[k] !== undefined) finite(s[k], f.join(field, k));
  if (s.minimum !== undefined && s.maximum !== undefined && (s.minimum as number) > (s.maximum as number)) throw new f.FieldError(f.join(field, 'minimum'), 'is above maximum');
  if (s.exclusive_minimum !== undefined && s.maximum !== undefined && (s.exclusive_minimum as number) >= (s.maximum as number)) throw new f.FieldError(f.join(field, 'exclusive_minimum'), 'is not below maximum');
  if (s.max_items !== undefined) {
    f.uint(s.max_items, f.join(field, 'max_items'));
    if (!types.includes('array')) throw new f.FieldError(f.join(field, 'max_items'), 'only for an array');
  }
  /** Why a value the attribute names (an enum value, its default) is not one it takes, or undefined. */
  const unfit = (v: unknown): string | undefined => {
    if (v === null) return undefined;
    if (!types.some((t) => ofType(v, t as AttributeType))) return `is not of the attribute's type (${types.join(' or ')})`;
    if (typeof v === 'number') {
      if (typeof s.minimum === 'number' && v < s.minimum) return 'is below minimum';
      if (typeof s.maximum === 'number' && v > s.maximum) return 'is above maximum';
      if (typeof s.exclusive_minimum === 'number' && v <= s.exclusive_minimum) return 'is not above exclusive_minimum';
    }
    if (Array.isArray(v) && typeof s.max_items === 'number' && v.length > s.max_items) return 'has more than max_items items';
    return undefined;
  };
  if (s.enum !== undefined) {
    if (!Array.isArray(s.enum) || s.enum.length === 0 || s.enum.length > 16) throw new f.FieldError(f.join(field, 'enum'), 'expected 1 to 16 values');
    s.enum.forEach((e, i) => {
      small(e, `${field}.enum[${i}]`);
      const why = unfit(e);
      if (why) throw new f.FieldError(`${field}.enum[${i}]`, why);
    });
  }
  if (s.default !== undefined) {
    small(s.default, f.join(field, 'default'));
    const why = Array.isArray(s.enum) && !s.enum.some((e) => canonicalize(e) === canonicalize(s.default)) ? 'is not one of the values in enum' : unfit(s.default);
    if (why) throw new f.FieldError(f.join(field, 'default'), why);
  }
  if (s.use === 'default_only' && s.enum === undefined && s.note === undefined) throw new f.FieldError(f.join(field, 'enum'), 'a default_only attribute names the values it takes (enum, or a note)');
  if (s.note !== undefined) f.string(s.note, f.join(field, 'note'), 300);
  return s as unknown as AttributeSpec;
}

/** The largest value (canonical JSON characters) an enum entry or default may be. */
const MAX_VALUE_CHARS = 256;

/** A value of at most MAX_VALUE_CHARS canonical characters (nested at most 8 deep). */
function small(v: unknown, field: string): void {
  let text: string;
  try {
    text = depthAtMost(v, 8) ? canonicalize(v) : '';
  } catch {
    text = '';
  }
  if (text === '' || text.length > MAX_VALUE_CHARS) throw new f.FieldError(field, `expected a JSON value of at most ${MAX_VALUE_CHARS} characters, nested at most 8 deep`);
}

function depthAtMost(v: unknown, depth: number): boolean {
  if (v === null || typeof v !== 'object') return true;
  if (depth === 0) return false;
  return (Array.isArray(v) ? v : Object.values(v)).every((x) => depthAtMost(x, depth - 1));
}

function ofType(v: unknown, t: AttributeType): boolean {
  switch (t) {
    case 'integer':
      return Number.isSafeInteger(v);
    case 'number':
      return typeof v === 'number';
    case 'array':
      return Array.isArray(v);
    case 'object':
      return typeof v === 'object' && v !== null && !Array.isArray(v);
    default:
      return typeof v === t;
  }
}

function endpointContract(v: unknown, field: string): EndpointContract {
  const e = f.object(v, field);
  f.keys(e, field, ['common', 'attributes'], ['common_notes']);
  if (!Array.isArray(e.common) || e.common.length === 0 || e.common.length > 32) throw new f.FieldError(f.join(field, 'common'), 'expected 1 to 32 field names');
  const common = new Set<string>();
  e.common.forEach((c, i) => {
    const name = f.string(c, `${field}.common[${i}]`, 64, NAME_RE);
    if (common.has(name)) throw new f.FieldError(`${field}.common[${i}]`, `"${name}" is listed twice`);
    common.add(name);
  });
  const attrs = f.object(e.attributes, f.join(field, 'attributes'));
  const names = Object.keys(attrs);
  if (names.length > 128) throw new f.FieldError(f.join(field, 'attributes'), 'more than 128 attributes');
  for (const k of names) {
    const where = f.join(f.join(field, 'attributes'), k);
    f.string(k, where, 64, NAME_RE);
    if (common.has(k)) throw new f.FieldError(where, 'is a common field');
    attribute(attrs[k], where);
  }
  if (e.common_notes !== undefined) {
    const notes = f.object(e.common_notes, f.join(field, 'common_notes'));
    for (const k of Object.keys(notes)) {
      const where = f.join(f.join(field, 'common_notes'), k.slice(0, 64));
      if (!common.has(k)) throw new f.FieldError(where, 'is not one of the common fields listed');
      f.string(notes[k], where, 600);
    }
  }
  return e as unknown as EndpointContract;
}

/** Checks every field of a request contract; throws FieldError naming the first bad one. */
export function validateRequestContract(value: unknown): RequestContractPayload {
  const p = f.object(value, '');
  f.keys(p, '', ['v', 'provider', 'version', 'models', 'endpoints']);
  if (p.v !== 1) throw new f.FieldError('v', 'expected 1');
  f.hex32(p.provider, 'provider');
  f.string(p.version, 'version', 64, /^[A-Za-z0-9._:-]+$/);
  if (!Array.isArray(p.models) || p.models.length === 0 || p.models.length > 1000) throw new f.FieldError('models', 'expected 1 to 1000 model ids');
  const seen = new Set<string>();
  p.models.forEach((m, i) => {
    const id = f.string(m, `models[${i}]`, 256);
    if (seen.has(id)) throw new f.FieldError(`models[${i}]`, `"${id}" is listed twice`);
    seen.add(id);
  });
  const endpoints = f.object(p.endpoints, 'endpoints');
  const given = Object.keys(endpoints);
  if (given.length === 0) throw new f.FieldError('endpoints', 'expected at least one endpoint');
  for (const k of given) {
    f.oneOf(k, `endpoints.${k.slice(0, 64)}`, CONTRACT_ENDPOINTS);
    endpointContract(endpoints[k], `endpoints.${k}`);
  }
  const payload = p as unknown as RequestContractPayload;
  if (payload.version !== contractVersion(payload.models, payload.endpoints)) throw new f.FieldError('version', 'is not the version of this contract');
  return payload;
}

/** Signs a provider's request contract for `models` (keyid = provider id); validates it first. */
export function signRequestContract(seed: Uint8Array, provider: string, models: readonly string[], endpoints: RequestContractPayload['endpoints']): { payload: RequestContractPayload; envelope: DsseEnvelope } {
  const sorted = [...models].sort();
  const payload: RequestContractPayload = { v: 1, provider, version: contractVersion(sorted, endpoints), models: sorted, endpoints };
  validateRequestContract(payload);
  return { payload, envelope: signEnvelope(REQUEST_CONTRACT_PAYLOAD_TYPE, utf8(canonicalize(payload)), { keyid: provider, seed }) };
}

/** Verifies a provider's signed request contract (an envelope, or its JSON text). Never throws. */
export function verifyRequestContract(envelope: DsseEnvelope | string, opts: { provider: string }): VerifyResult<RequestContractPayload> {
  return verifyProviderSigned(envelope, opts, REQUEST_CONTRACT_PAYLOAD_TYPE, validateRequestContract, 'request contract');
}
