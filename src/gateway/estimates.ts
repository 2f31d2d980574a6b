// POST /v1/estimates: what a request would cost, without a hold or a charge. The gateway checks
// the body against the same contract as execution, picks a live provider under the same routing
// controls, counts the input with that provider's own tokenizer, and prices it at the provider's
// signed rates. An estimate lives ten minutes; a request that carries its id (X-Service-Estimate)
// must be the same request, and its hold is capped at the estimate's maximum, so a higher live
// maximum is refused before any hold.
import crypto from 'node:crypto';
import { canonicalBytes, canonicalize } from '../../attestation/canonical-json.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import type { RoutingControls } from './routing-headers.ts';

const ESTIMATE_TTL_MS = 10 * 60_000;
/** The most live estimates kept: beyond it the oldest is forgotten (a request citing it gets 400, as for an expired one). */
export const MAX_ESTIMATES = 50_000;

/** The marketplace API's endpoint names for estimates, and the paths this gateway serves them at. */
export const ESTIMATE_ENDPOINTS: Record<string, string> = {
  CHAT: 'chat/completions',
  COMPLETIONS: 'completions',
  RESPONSES: 'responses',
  EMBEDDINGS: 'embeddings',
};

export interface Estimate {
  estimateId: string;
  endpoint: string;
  model: string;
  /** SHA-256 of the body's canonical JSON (RFC 8785): the same request however its JSON is spaced or ordered. */
  bodySha256: string;
  /** The routing controls the estimate was made under, canonical JSON: execution must ask the same. */
  routing: string;
  /** The API key it was made under (KeyPolicy.id; null without keys): execution must use the same (the spec: "this key"). */
  keyId: string | null;
  provider: string;
  priceVersion: string;
  inputTokens: number;
  maxOutputTokens: number;
  expectedMicroUsd: bigint;
  maxHoldMicroUsd: bigint;
  expiresAt: number;
}

/** SHA-256 of a JSON body's canonical form (RFC 8785), what an estimate is keyed on; a body that is not JSON hashes as its bytes. */
export function canonicalBodySha256(body: Uint8Array): string {
  try {
    return sha256Hex(canonicalBytes(JSON.parse(Buffer.from(body).toString('utf8'))));
  } catch {
    return sha256Hex(body);
  }
}

/** The routing controls an estimate is bound to, as one string (the cap and the estimate id aside). */
export function routingKey(c: RoutingControls): string {
  const { max_cost_micro_usd: _cap, ...routing } = c.routing;
  return canonicalize({ routing, preferred: c.preferredProviders ?? null });
}

export class EstimateStore {
  /** In the order they were made, which is also the order they expire in (one TTL for all). */
  private readonly byId = new Map<string, Estimate>();
  private readonly now: () => number;
  private readonly max: number;

  constructor(now: () => number = Date.now, max = MAX_ESTIMATES) {
    this.now = now;
    this.max = max;
  }

  add(e: Omit<Estimate, 'estimateId' | 'expiresAt'>): Estimate {
    this.prune();
    const est: Estimate = { ...e, estimateId: `est_${crypto.randomBytes(12).toString('hex')}`, expiresAt: this.now() + ESTIMATE_TTL_MS };
    this.byId.set(est.estimateId, est);
    return est;
  }

  /** The live estimate with this id, or undefined (unknown or expired). */
  get(id: string): Estimate | undefined {
    const e = this.byId.get(id);
    if (e && e.expiresAt <= this.now()) {
      this.byId.delete(id);
      return undefined;
    }
    return e;
  }

  /** Drops the expired ones, oldest first, stopping at the first live one (no scan of them all), and the oldest beyond `max`. */
  private prune(): void {
    const now = this.now();
    for (const [id, e] of this.byId) {
      if (e.expiresAt > now && this.byId.size < this.max) break;
      this.byId.delete(id);
    }
  }
}
