// The payload of a signed body the market has not verified yet, read only to find the key to
// verify it with (the provider it claims, the ticket it names). A payload that nests deeply is not
// read: JSON.parse of a few MiB of nesting costs a quarter second, and anyone may post one (s29
// review: three senders of such unsigned bodies held the market's answers ~270 ms each). No honest
// registration, heartbeat or receipt nests more than a few levels.
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import { payloadBytes, peekPayloadBytes } from '../../attestation/signed-payload.ts';
import { nestsDeeperThan } from '../json-depth.ts';

/** How deeply an unverified payload may nest and still be read for its claims. */
export const PEEK_MAX_DEPTH = 32;

/** The unverified payload as an object, or undefined (unreadable, or nested deeper than PEEK_MAX_DEPTH). */
export function peekShallow(env: Pick<DsseEnvelope, 'payload'>): Record<string, unknown> | undefined {
  const bytes = payloadBytes(env);
  return bytes && !nestsDeeperThan(bytes, PEEK_MAX_DEPTH) ? peekPayloadBytes(bytes) : undefined;
}
