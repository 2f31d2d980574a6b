// /service/capacity/1.0.0: a signed live snapshot of what the node can take right now (models,
// free slots, queue, context, quantization, measured throughput, price version), so the
// marketplace routes on facts the node stands behind. Answer: one DATA frame holding a DSSE
// envelope (payload type application/vnd.service.capacity.v1+json) and an empty trailer.
import { utf8 } from '../../attestation/bytes.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';
import { signEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import type { Host } from './host.ts';
import { handleRequests, type RequestServer } from './request-stream.ts';
import { OPEN_REQUEST_BYTES_BUDGET } from './request-server.ts';

export const CAPACITY_PROTOCOL = '/service/capacity/1.0.0';
export const CAPACITY_PAYLOAD_TYPE = 'application/vnd.service.capacity.v1+json';

export interface CapacityModel {
  id: string;
  context: number;
  quantization: string;
  tokens_per_second: number;
  slots: number;
  free_slots: number;
  queued: number;
  queue_limit: number;
  /** False while the node takes no paid work for this model (its file changed under it); left out when it does. */
  accepting?: false;
  /** The paid endpoints it is sold for, when fewer than all (no chat template: completions and embeddings). */
  endpoints?: string[];
}

export interface CapacitySnapshot {
  v: 1;
  provider: string;
  at: number;
  price_version: string;
  attestation_tier: string;
  accepting: boolean;
  models: CapacityModel[];
}

/** A signed capacity snapshot: served on /service/capacity/1.0.0 and sent as heartbeats. */
export function signCapacity(signer: { seed: Uint8Array; providerId: string }, snapshot: Omit<CapacitySnapshot, 'v' | 'provider' | 'at'>, at = Date.now()): DsseEnvelope {
  const payload: CapacitySnapshot = { v: 1, provider: signer.providerId, at, ...snapshot };
  return signEnvelope(CAPACITY_PAYLOAD_TYPE, utf8(canonicalize(payload)), { keyid: signer.providerId, seed: signer.seed });
}

export function serveCapacity(host: Host, signer: { seed: Uint8Array; providerId: string }, snapshot: () => Omit<CapacitySnapshot, 'v' | 'provider' | 'at'>): Promise<RequestServer> {
  return handleRequests(host, CAPACITY_PROTOCOL, async (_req, res) => {
    const env = signCapacity(signer, snapshot());
    await res.head({ status: 200, headers: { 'content-type': 'application/json' } });
    await res.data(utf8(JSON.stringify(env)));
    await res.trailer({});
  }, { maxBodyBytes: 64 << 10, budget: OPEN_REQUEST_BYTES_BUDGET }); // (nothing is read: no body of size is taken; none paid for)
}
