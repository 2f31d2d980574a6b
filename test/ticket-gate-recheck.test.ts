// The ticket gate's signature checks at a bounded cost (s25 review: forged tickets each cost up to
// 16 signatures × every key of noble's ~1 ms re-check, and 56 a second took the whole CPU).
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as ed from '@noble/ed25519';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, test, vi } from 'vitest';
import { toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { pae, type DsseEnvelope } from '../attestation/dsse.ts';
import * as ed25519 from '../attestation/ed25519.ts';
import { sha256 } from '../attestation/hash.ts';
import { TICKET_PAYLOAD_TYPE } from '../attestation/ticket.ts';
import { TICKET_SIGNATURE_CHECKS, TicketGate } from '../src/dispatch/ticket-gate.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ticket-recheck-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const provider = testKey();
const body = utf8('{"model":"tiny/llama","messages":[]}');
const expectation = { endpoint: 'chat/completions', model: 'tiny/llama', priceVersion: 'p1', body };
const fresh = () => ticketPayload(provider.id, { body_sha256: toHex(sha256(body)) });

const L = 2n ** 252n + 27742317777372353535851937790883648493n;
const le = (n: bigint) => {
  const out = new Uint8Array(32);
  for (let i = 0; i < 32; i++) out[i] = Number((n >> BigInt(8 * i)) & 255n);
  return out;
};
const fromLe = (b: Uint8Array) => b.reduceRight((acc, x) => (acc << 8n) | BigInt(x), 0n);

/** A forgery: the market's keyid, a signature of random bytes (well formed: S < L). */
function forged(keyid: string, signatures = 1): DsseEnvelope {
  const payload = utf8(canonicalize(fresh()));
  return {
    payload: toBase64(payload),
    payloadType: TICKET_PAYLOAD_TYPE,
    signatures: Array.from({ length: signatures }, (_, i) => {
      const sig = new Uint8Array(crypto.randomBytes(64));
      sig[63] = 0; // S < L
      return { ...(i === 0 || signatures === 1 ? { keyid } : {}), sig: toBase64(sig) };
    }),
  };
}

describe('the ticket gate bounds what a forged signature costs', () => {
  test('the slow re-check (noble, after OpenSSL says no) runs at most the budget a second; past it a forgery gets 503 ticket_check_busy, and a genuine ticket still passes', () => {
    const market = testKey();
    let clock = 1_000_000;
    vi.spyOn(performance, 'now').mockImplementation(() => clock);
    const noble = vi.spyOn(ed25519, 'ed25519VerifyNoble');
    try {
      const db = new Database(path.join(dir, 'busy.db'));
      const gate = new TicketGate({ db, marketplaceKeys: [{ publicKey: market.id }], providerId: provider.id, rechecksPerSecond: 3 });
      const answers = Array.from({ length: 8 }, () => gate.admit(forged(market.id), expectation));
      expect(answers.slice(0, 3).map((a) => !a.ok && [a.status, a.code])).toEqual(Array(3).fill([401, 'ticket_invalid']));
      expect(answers.slice(3).map((a) => !a.ok && [a.status, a.code])).toEqual(Array(5).fill([503, 'ticket_check_busy']));
      expect(noble).toHaveBeenCalledTimes(3);
      // The marketplace's own signature needs no re-check: admitted while the budget is spent.
      expect(gate.admit(signTicket(market, fresh()), expectation)).toMatchObject({ ok: true });
      // A second later the budget is back.
      clock += 1000;
      expect(gate.admit(forged(market.id), expectation)).toMatchObject({ ok: false, status: 401, code: 'ticket_invalid' });
      expect(noble).toHaveBeenCalledTimes(4);
      db.close();
    } finally {
      vi.restoreAllMocks();
    }
  });

  test(`a forgery with many signatures costs ${TICKET_SIGNATURE_CHECKS} checks at most, whatever its count and the keys trusted`, () => {
    const keys = [testKey(), testKey(), testKey()];
    const fast = vi.spyOn(ed25519, 'ed25519VerifyFast');
    try {
      const db = new Database(path.join(dir, 'many.db'));
      const gate = new TicketGate({ db, marketplaceKeys: keys.map((k) => ({ publicKey: k.id })), providerId: provider.id });
      const env = forged('', 16);
      env.signatures = env.signatures.map((s) => ({ sig: s.sig })); // all keyless: each tried under every key
      const a = gate.admit(env, expectation);
      expect(a).toMatchObject({ ok: false, status: 401, code: 'ticket_invalid' });
      expect(!a.ok && a.message).toContain(`first ${TICKET_SIGNATURE_CHECKS} checks`);
      expect(fast).toHaveBeenCalledTimes(TICKET_SIGNATURE_CHECKS);
      // A genuine keyless signature within the checks (here the first: tried under each key in turn) still verifies.
      const good = signTicket(keys[2]!, fresh());
      const keyless = { ...good, signatures: [{ sig: good.signatures[0]!.sig }, { sig: forged('').signatures[0]!.sig }] };
      expect(gate.admit(keyless, expectation)).toMatchObject({ ok: true });
      // After a forged one it would be checks 5 to 6: not made.
      const late = signTicket(keys[2]!, fresh());
      const after = { ...late, signatures: [{ sig: forged('').signatures[0]!.sig }, { sig: late.signatures[0]!.sig }] };
      expect(gate.admit(after, expectation)).toMatchObject({ ok: false, status: 401, code: 'ticket_invalid' });
      db.close();
    } finally {
      vi.restoreAllMocks();
    }
  });

  test('a signature only the cofactored rule accepts (a mixed-order market key) is still accepted while the budget allows: the gate answers as ed25519Verify', () => {
    // A = [a]B + T (T of order 8): an honest signer's R = [r]B fails OpenSSL's cofactorless check
    // whenever k·T ≠ 0, and passes the cofactored rule always.
    const T = ed.Point.fromHex('26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05');
    const a = 123456789123456789n;
    const A = ed.Point.BASE.multiply(a).add(T).toBytes();
    const signMixed = (payload: object): DsseEnvelope => {
      const bytes = utf8(canonicalize(payload));
      const m = pae(TICKET_PAYLOAD_TYPE, bytes);
      for (let r = 1000n; ; r++) {
        const R = ed.Point.BASE.multiply(r).toBytes();
        const k = fromLe(crypto.createHash('sha512').update(R).update(A).update(m).digest()) % L;
        const sig = new Uint8Array(64);
        sig.set(R);
        sig.set(le((r + k * a) % L), 32);
        if (ed25519.ed25519VerifyFast(sig, m, A) === undefined) return { payload: toBase64(bytes), payloadType: TICKET_PAYLOAD_TYPE, signatures: [{ keyid: toHex(A), sig: toBase64(sig) }] };
      }
    };
    const db = new Database(path.join(dir, 'mixed.db'));
    let clock = 5_000_000;
    vi.spyOn(performance, 'now').mockImplementation(() => clock);
    try {
      const gate = new TicketGate({ db, marketplaceKeys: [{ publicKey: toHex(A) }], providerId: provider.id, rechecksPerSecond: 1 });
      const t1 = signMixed(fresh());
      expect(ed25519.ed25519Verify(ed25519Sig(t1), pae(TICKET_PAYLOAD_TYPE, Buffer.from(t1.payload, 'base64')), A)).toBe(true);
      expect(gate.admit(t1, expectation)).toMatchObject({ ok: true });
      // The budget spent: the same kind of ticket is not refused as invalid, only not checked now.
      expect(gate.admit(signMixed(fresh()), expectation)).toMatchObject({ ok: false, status: 503, code: 'ticket_check_busy' });
      clock += 1000;
      expect(gate.admit(signMixed(fresh()), expectation)).toMatchObject({ ok: true });
    } finally {
      vi.restoreAllMocks();
      db.close();
    }
  });
});

function ed25519Sig(env: DsseEnvelope): Uint8Array {
  return new Uint8Array(Buffer.from(env.signatures[0]!.sig, 'base64'));
}
