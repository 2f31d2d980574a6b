// verifyReceipt reads a canonical one-signature log line without JSON.parse (parseEnvelopeLine).
// That shortcut must never change an answer: every line, valid or damaged, gets the result the
// general path gives (JSON.parse, then the envelope object), error code included.
import { describe, expect, test } from 'vitest';
import { parseEnvelopeLine, serializeEnvelope } from '../attestation/dsse.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

const key = testKey();
const line = serializeEnvelope(signReceipt(key, receiptPayload(key, 7)));

/** The general path's answer: a line that is not JSON is envelope_not_json, anything else is verified as an object. */
function reference(text: string, chain: boolean): string {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return 'envelope_not_json';
  }
  const r = verifyReceipt(value as never, { provider: key.id });
  if (!r.ok) return r.error.code;
  // As an object there is no line to compare; the line must be the envelope's canonical JSON, of
  // DSSE's fields only (verifyReceipt answers envelope_malformed for what cannot be canonicalised at all).
  if (!chain) return 'ok';
  const e = r.value.envelope;
  const dsseOnly = { payload: e.payload, payloadType: e.payloadType, signatures: e.signatures.map((g) => (g.keyid === undefined ? { sig: g.sig } : { keyid: g.keyid, sig: g.sig })) };
  try {
    // (and the provider's own line: one signature, its keyid the provider id)
    return serializeEnvelope(dsseOnly) === text && e.signatures.length === 1 && e.signatures[0]!.keyid === key.id ? 'ok' : 'envelope_not_canonical';
  } catch {
    return 'envelope_malformed';
  }
}

function answer(text: string, chain: boolean): string {
  const r = verifyReceipt(text, { provider: key.id, chain });
  return r.ok ? 'ok' : r.error.code;
}

describe('verifyReceipt on log lines: the line shortcut answers as the general path does', () => {
  test('a valid line verifies, and its leaf is the hash of the line itself', () => {
    const r = verifyReceipt(line, { provider: key.id, chain: true });
    if (!r.ok) throw new Error(r.error.message);
    const viaObject = verifyReceipt(JSON.parse(line) as never, { provider: key.id, chain: true });
    if (!viaObject.ok) throw new Error(viaObject.error.message);
    expect(Buffer.from(r.value.leafHash!).equals(Buffer.from(viaObject.value.leafHash!))).toBe(true);
    expect(r.value.payloadSha256).toBe(viaObject.value.payloadSha256);
    expect(r.value.envelope).toEqual(JSON.parse(line));
  });

  test('parseEnvelopeLine reads only lines JSON.parse reads the same way, and those lines are canonical', () => {
    const cases = [
      line,
      line.replace('"keyid":"', '"keyid":"\\u0041'), // an escape: not the shortcut's business
      line.replace('{"payload"', '{ "payload"'),
      line.replace('"}]}', '"},{"sig":"AA=="}]}'),
      line.replace('"keyid":"' + key.id + '",', ''),
      line + ' ',
      line.slice(0, -1),
    ];
    for (const text of cases) {
      const quick = parseEnvelopeLine(text);
      if (quick === undefined) continue;
      expect(quick).toEqual(JSON.parse(text));
      expect(serializeEnvelope(quick)).toBe(text);
    }
    expect(parseEnvelopeLine(line)).toBeDefined();
  });

  test('a raw control character inside the payload or the signature is envelope_not_json, as JSON.parse says', () => {
    const inPayload = line.replace('{"payload":"', '{"payload":"\u0001');
    const inSig = line.replace('","sig":"', '","sig":"\u0007');
    // With a second fault that fails the envelope before its payload or signature is decoded.
    const otherType = inPayload.replace('"payloadType":"application/', '"payloadType":"text/');
    const otherKey = inSig.replace(`"keyid":"${key.id}"`, `"keyid":"${'0'.repeat(64)}"`);
    expect(otherType).not.toBe(inPayload);
    expect(otherKey).not.toBe(inSig);
    for (const text of [inPayload, inSig, otherType, otherKey]) {
      expect(answer(text, false)).toBe('envelope_not_json');
      expect(reference(text, false)).toBe('envelope_not_json');
    }
  });

  test('every one-character change of a line gets the general path\'s answer (with and without chain)', () => {
    // Characters that matter to JSON, to the shortcut's pieces, to base64 and to UTF-16.
    const replacements = ['"', '\\', '\u0001', '\u001f', ' ', '}', ']', ',', ':', 'A', '/', '=', '-', '\u00e9', '\u{1F600}', '\ud800'];
    // Every position near the fixed pieces, and a spread through the payload and the signature.
    const positions = new Set<number>();
    for (const piece of ['"payload":"', '","payloadType":"', '","signatures":[{"keyid":"', '","sig":"', '"}]}']) {
      const at = line.indexOf(piece);
      for (let i = at - 2; i < at + piece.length + 2; i++) if (i >= 0 && i < line.length) positions.add(i);
    }
    for (let i = 0; i < line.length; i += 97) positions.add(i);
    positions.add(line.length - 1);
    let compared = 0;
    for (const at of positions) {
      for (const c of replacements) {
        for (const text of [line.slice(0, at) + c + line.slice(at + 1), line.slice(0, at) + c + line.slice(at)]) {
          for (const chain of [false, true]) {
            expect({ at, c, chain, code: answer(text, chain) }).toEqual({ at, c, chain, code: reference(text, chain) });
            compared++;
          }
        }
      }
    }
    expect(compared).toBeGreaterThan(2000);
  });
});

describe('a log line is the provider\'s own: the unsigned keyid names the provider', () => {
  test('a copy of a line under another keyid (or none) verifies as a receipt, but is not a log line (chain)', () => {
    for (const other of [line.replace(`"keyid":"${key.id}"`, '"keyid":"not-the-provider"'), line.replace(`"keyid":"${key.id}"`, '"keyid":""')]) {
      expect(verifyReceipt(other, { provider: key.id }).ok).toBe(true);
      const r = verifyReceipt(other, { provider: key.id, chain: true });
      expect(r.ok ? 'ok' : r.error.code).toBe('envelope_not_canonical');
    }
    expect(verifyReceipt(line, { provider: key.id, chain: true }).ok).toBe(true);
  });
});
