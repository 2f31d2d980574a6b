// The heartbeat body: the node's signed capacity snapshot (docs/protocol.md §/service/capacity).
// Checked for the fields the market routes on; fields it does not know are tolerated, so a node
// may add to its snapshot without breaking older markets.
import * as f from '../../attestation/fields.ts';
import { ATTESTATION_TIERS } from '../../attestation/receipt.ts';
import type { CapacitySnapshot } from '../p2p/capacity-protocol.ts';

export function validateCapacitySnapshot(value: unknown): CapacitySnapshot {
  const p = f.object(value, '');
  f.keys(p, '', ['v', 'provider', 'at', 'price_version', 'attestation_tier', 'accepting', 'models'], Object.keys(p));
  if (p.v !== 1) throw new f.FieldError('v', 'expected 1');
  f.hex32(p.provider, 'provider');
  f.uint(p.at, 'at');
  f.string(p.price_version, 'price_version', 64, /^[A-Za-z0-9._:-]+$/);
  f.oneOf(p.attestation_tier, 'attestation_tier', ATTESTATION_TIERS);
  if (typeof p.accepting !== 'boolean') throw new f.FieldError('accepting', 'expected a boolean');
  if (!Array.isArray(p.models) || p.models.length > 1000) throw new f.FieldError('models', 'expected at most 1000 entries');
  p.models.forEach((m, i) => {
    const where = `models[${i}]`;
    const o = f.object(m, where);
    f.string(o.id, `${where}.id`, 256);
    for (const k of ['slots', 'free_slots', 'queued', 'queue_limit', 'context'] as const) f.uint(o[k], `${where}.${k}`);
    if (o.accepting !== undefined && typeof o.accepting !== 'boolean') throw new f.FieldError(`${where}.accepting`, 'expected a boolean');
  });
  return p as unknown as CapacitySnapshot;
}
