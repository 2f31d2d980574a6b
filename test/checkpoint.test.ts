import { describe, expect, it } from 'vitest';
import {
  formatCheckpoint,
  parseCheckpoint,
  receiptLogOrigin,
  signCheckpoint,
  verifyCheckpoint,
  type Checkpoint,
} from '../attestation/checkpoint.ts';
import { openNote, parseNote, signNote } from '../attestation/note.ts';
import { fromBase64, toBase64, toHex } from '../attestation/bytes.ts';
import { sha256 } from '../attestation/hash.ts';
import { ed25519PublicKey, ed25519RandomSeed } from '../attestation/ed25519.ts';

function errCode(r: { ok: boolean; error?: { code: string } }): string | undefined {
  return r.ok ? undefined : r.error?.code;
}

const seed = ed25519RandomSeed();
const publicKey = ed25519PublicKey(seed);
const origin = receiptLogOrigin(toHex(publicKey));
const root = sha256(new TextEncoder().encode('root'));
const ROOT_B64 = toBase64(root);

describe('receiptLogOrigin', () => {
  it('is "<provider id hex>/receipts"', () => {
    expect(origin).toBe(`${toHex(publicKey)}/receipts`);
  });
  it('refuses anything but 64 lowercase hex digits', () => {
    expect(() => receiptLogOrigin(toHex(publicKey).toUpperCase())).toThrow(TypeError);
    expect(() => receiptLogOrigin(toHex(publicKey).slice(2))).toThrow(TypeError);
    expect(() => receiptLogOrigin('')).toThrow(TypeError);
  });
});

describe('formatCheckpoint / parseCheckpoint', () => {
  it('formats the three lines exactly', () => {
    expect(formatCheckpoint({ origin: 'example.com/log', size: 20852163, rootHash: root })).toBe(`example.com/log\n20852163\n${ROOT_B64}\n`);
    expect(formatCheckpoint({ origin: 'o', size: 0, rootHash: root, extensions: ['x y', 'z'] })).toBe(`o\n0\n${ROOT_B64}\nx y\nz\n`);
  });

  it('round trips, with and without extension lines', () => {
    const cases: Checkpoint[] = [
      { origin, size: 0, rootHash: root },
      { origin, size: 1, rootHash: root },
      { origin: 'example.com/behind-the-sofa', size: Number.MAX_SAFE_INTEGER, rootHash: root, extensions: ['ext one', 'ext+two'] },
    ];
    for (const cp of cases) {
      const r = parseCheckpoint(formatCheckpoint(cp));
      expect(r.ok).toBe(true);
      if (!r.ok) continue;
      expect(r.value.origin).toBe(cp.origin);
      expect(r.value.size).toBe(cp.size);
      expect(toHex(r.value.rootHash)).toBe(toHex(cp.rootHash));
      expect(r.value.extensions).toEqual(cp.extensions ?? []);
    }
  });

  const good = `o\n5\n${ROOT_B64}\n`;
  const bad: [string, string][] = [
    ['leading zero in size', `o\n05\n${ROOT_B64}\n`],
    ['size 00', `o\n00\n${ROOT_B64}\n`],
    ['negative size', `o\n-5\n${ROOT_B64}\n`],
    ['plus sign in size', `o\n+5\n${ROOT_B64}\n`],
    ['fractional size', `o\n5.0\n${ROOT_B64}\n`],
    ['exponent size', `o\n5e3\n${ROOT_B64}\n`],
    ['hex size', `o\n0x5\n${ROOT_B64}\n`],
    ['space in size', `o\n 5\n${ROOT_B64}\n`],
    ['empty size', `o\n\n${ROOT_B64}\n`],
    ['size above 2^53 - 1', `o\n9007199254740992\n${ROOT_B64}\n`],
    ['31-byte root', `o\n5\n${toBase64(root.subarray(0, 31))}\n`],
    ['33-byte root', `o\n5\n${toBase64(new Uint8Array(33))}\n`],
    ['root not base64', `o\n5\n${ROOT_B64.replace(/=$/, '!')}\n`],
    ['root without padding', `o\n5\n${ROOT_B64.replace(/=$/, '')}\n`],
    ['hex root', `o\n5\n${toHex(root)}\n`],
    ['empty origin', `\n5\n${ROOT_B64}\n`],
    ['missing root line', `o\n5\n`],
    ['missing size and root', `o\n`],
    ['empty text', ''],
    ['no final newline', `o\n5\n${ROOT_B64}`],
    ['empty extension line', `o\n5\n${ROOT_B64}\n\next\n`],
    ['trailing empty line', `${good}\n`],
    ['CR line endings', `o\r\n5\r\n${ROOT_B64}\r\n`],
  ];
  it('control: the well-formed body parses', () => {
    expect(parseCheckpoint(good).ok).toBe(true);
  });
  for (const [label, text] of bad) {
    it(`strict: ${label} → checkpoint_malformed`, () => {
      expect(errCode(parseCheckpoint(text))).toBe('checkpoint_malformed');
    });
  }
  it('non-string input is checkpoint_malformed', () => {
    expect(errCode(parseCheckpoint(undefined as unknown as string))).toBe('checkpoint_malformed');
  });

  it('formatCheckpoint refuses invalid fields', () => {
    expect(() => formatCheckpoint({ origin: '', size: 1, rootHash: root })).toThrow(TypeError);
    expect(() => formatCheckpoint({ origin: 'a\nb', size: 1, rootHash: root })).toThrow(TypeError);
    expect(() => formatCheckpoint({ origin: 'o', size: -1, rootHash: root })).toThrow(TypeError);
    expect(() => formatCheckpoint({ origin: 'o', size: 1.5, rootHash: root })).toThrow(TypeError);
    expect(() => formatCheckpoint({ origin: 'o', size: 2 ** 53, rootHash: root })).toThrow(TypeError);
    expect(() => formatCheckpoint({ origin: 'o', size: 1, rootHash: root.subarray(1) })).toThrow(TypeError);
    expect(() => formatCheckpoint({ origin: 'o', size: 1, rootHash: root, extensions: [''] })).toThrow(TypeError);
  });
});

describe('signCheckpoint / verifyCheckpoint', () => {
  const cp: Checkpoint = { origin, size: 37, rootHash: root };
  const note = signCheckpoint(cp, { name: origin, seed });
  const key = { name: origin, publicKey, origin };

  it('produces a signed note whose text is the checkpoint body', () => {
    const p = parseNote(note);
    expect(p.ok && p.value.text).toBe(formatCheckpoint(cp));
    expect(p.ok && p.value.signatures.map((s) => s.name)).toEqual([origin]);
  });

  it('verifies, returning origin, size, root, text and note', () => {
    const r = verifyCheckpoint(note, key);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.origin).toBe(origin);
    expect(r.value.size).toBe(37);
    expect(toHex(r.value.rootHash)).toBe(toHex(root));
    expect(r.value.text).toBe(formatCheckpoint(cp));
    expect(r.value.note).toBe(note);
    // Without an expected origin, any origin is accepted.
    expect(verifyCheckpoint(note, { name: origin, publicKey }).ok).toBe(true);
  });

  it('origin mismatch is checkpoint_origin_mismatch', () => {
    const otherOrigin = receiptLogOrigin(toHex(ed25519PublicKey(ed25519RandomSeed())));
    expect(errCode(verifyCheckpoint(note, { ...key, origin: otherOrigin }))).toBe('checkpoint_origin_mismatch');
    // Signed by the right key but for another origin.
    const foreign = signCheckpoint({ ...cp, origin: otherOrigin }, { name: origin, seed });
    expect(errCode(verifyCheckpoint(foreign, key))).toBe('checkpoint_origin_mismatch');
  });

  it('wrong key or name: note_no_known_signature', () => {
    const other = ed25519PublicKey(ed25519RandomSeed());
    expect(errCode(verifyCheckpoint(note, { ...key, publicKey: other }))).toBe('note_no_known_signature');
    expect(errCode(verifyCheckpoint(note, { ...key, name: 'other/receipts' }))).toBe('note_no_known_signature');
    // No key at all checked nothing: the caller's mistake, named so.
    expect(errCode(verifyCheckpoint(note, undefined as unknown as typeof key))).toBe('options_invalid');
  });

  it('tampered size or root: signature_invalid', () => {
    expect(errCode(verifyCheckpoint(note.replace('\n37\n', '\n38\n'), key))).toBe('signature_invalid');
    const flipped = root.slice();
    flipped[0] = flipped[0]! ^ 1;
    expect(errCode(verifyCheckpoint(note.replace(ROOT_B64, toBase64(flipped)), key))).toBe('signature_invalid');
  });

  it('a validly signed but malformed body is checkpoint_malformed', () => {
    const n = signNote(`${origin}\n037\n${ROOT_B64}\n`, [{ name: origin, seed }]);
    expect(openNote(n, [{ name: origin, publicKey }]).ok).toBe(true);
    expect(errCode(verifyCheckpoint(n, key))).toBe('checkpoint_malformed');
  });

  it('a malformed note is note_malformed', () => {
    expect(errCode(verifyCheckpoint(note.replace('\n\n', '\n'), key))).toBe('note_malformed');
    expect(errCode(verifyCheckpoint('garbage', key))).toBe('note_malformed');
  });

  it('witness cosignatures by unknown keys are ignored', () => {
    const witness = { name: 'witness.example', seed: ed25519RandomSeed() };
    const cosigned = signNote(formatCheckpoint(cp), [{ name: origin, seed }, witness]);
    expect(verifyCheckpoint(cosigned, key).ok).toBe(true);
  });

  it('the signature bytes decode to key ID and a 64-byte Ed25519 signature', () => {
    const b64 = note.slice(note.lastIndexOf(' ') + 1, -1);
    expect(fromBase64(b64)?.length).toBe(68);
  });
});
