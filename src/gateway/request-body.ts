// What the gateway reads of a buyer's request before a ticket: the exact body bytes, the model it
// names and its Idempotency-Key. The node checks the whole contract.
import type { FastifyRequest } from 'fastify';
import { invalid } from './errors.ts';
import { MAX_JSON_DEPTH, nestsDeeperThan } from '../json-depth.ts';

export const isObj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The exact body bytes (the content-type parser hands every body over untouched). */
export function bodyBytes(req: FastifyRequest): Buffer {
  return Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
}

/**
 * A body's JSON value, read as the node reads one (UTF-8, a leading BOM dropped); undefined when it
 * is not UTF-8 JSON. A body nested more than MAX_JSON_DEPTH deep is refused (400) unparsed.
 */
export function decodeJson(body: Uint8Array): { value: unknown } | undefined {
  if (nestsDeeperThan(body)) throw invalid('body', `nests objects and arrays more than ${MAX_JSON_DEPTH} deep`);
  try {
    return { value: JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body)) };
  } catch {
    return undefined;
  }
}

/** The model a body names: enough to ask for a ticket. */
export function peekModel(body: Uint8Array): string {
  const decoded = decodeJson(body);
  if (!decoded) throw invalid('body', 'expected UTF-8 JSON');
  const value = decoded.value;
  if (!isObj(value)) throw invalid('body', 'expected a JSON object');
  if (typeof value.model !== 'string' || value.model.length === 0 || value.model.length > 256) throw invalid('model', 'expected a model id');
  return value.model;
}

/**
 * The Idempotency-Key of a request, from its headers as sent (`headersDistinct`): Node.js joins a
 * repeated header's values with ", ", and "K" sent twice would be the key "K, K" (s30 review).
 */
export function idempotencyKey(raw: Pick<FastifyRequest['raw'], 'headersDistinct'>): string | undefined {
  const values = raw.headersDistinct['idempotency-key'];
  if (values === undefined) return undefined;
  if (values.length !== 1) throw invalid('Idempotency-Key', 'given more than once');
  const v = values[0]!;
  if (v.length === 0 || v.length > 256) throw invalid('Idempotency-Key', 'expected 1 to 256 characters');
  return v;
}
