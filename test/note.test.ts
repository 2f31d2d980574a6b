import { describe, expect, it } from 'vitest';
import { readVectorJson } from './helpers/vectors.ts';
import {
  formatSignerKey,
  formatVerifierKey,
  isValidKeyName,
  MAX_NOTE_BYTES,
  MAX_NOTE_SIGNATURES,
  noteKeyId,
  openNote,
  parseNote,
  parseSignerKey,
  parseVerifierKey,
  signNote,
  type NoteVerifier,
} from '../attestation/note.ts';
import { parseCheckpoint, verifyCheckpoint } from '../attestation/checkpoint.ts';
import { concatBytes, fromBase64, fromHex, toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { sha256 } from '../attestation/hash.ts';
import { ed25519PublicKey, ed25519RandomSeed, ed25519Sign } from '../attestation/ed25519.ts';

interface ExpectedSig {
  keyName: string;
  keyIdHex: string;
  knownKey: boolean;
  verifies: boolean | null;
}
interface NoteCase {
  id: string;
  signerKey_TEST_ONLY?: string;
  verifierKeys: string[];
  note: string;
  expect: string;
  signedText: string;
  expectedSignatures: ExpectedSig[];
}

const vectors = readVectorJson<{ cases: NoteCase[] }>('signed-note', 'signed_note_vectors.json');
const byId = (id: string): NoteCase => {
  const c = vectors.cases.find((x) => x.id === id);
  if (!c) throw new Error(`missing vector ${id}`);
  return c;
};

function verifiersOf(c: NoteCase): NoteVerifier[] {
  return c.verifierKeys.map((k) => {
    const r = parseVerifierKey(k);
    if (!r.ok) throw new Error(`vector key ${k}: ${r.error.message}`);
    return { name: r.value.name, publicKey: r.value.publicKey };
  });
}

function errCode(r: { ok: boolean; error?: { code: string } }): string | undefined {
  return r.ok ? undefined : r.error?.code;
}

const PETER = byId('golang-note-peterneumann-sign');
const PETER_KEYS = verifiersOf(PETER);
const SIG_LINE_START = PETER.note.indexOf('\u2014 ');

/** The Peter note with the decoded signature line bytes passed through `edit`. */
function withEditedSignature(edit: (raw: Uint8Array) => void): string {
  const line = PETER.note.slice(SIG_LINE_START, -1);
  const b64 = line.slice(line.lastIndexOf(' ') + 1);
  const raw = fromBase64(b64)!;
  edit(raw);
  return PETER.note.slice(0, SIG_LINE_START) + line.slice(0, line.lastIndexOf(' ') + 1) + toBase64(raw) + '\n';
}

describe('signed-note vectors', () => {
  it('has the expected cases', () => {
    expect(vectors.cases.length).toBeGreaterThanOrEqual(6);
  });

  for (const c of vectors.cases) {
    describe(c.id, () => {
      it('verifier keys parse and re-encode identically', () => {
        for (const k of c.verifierKeys) {
          const r = parseVerifierKey(k);
          expect(r.ok).toBe(true);
          if (!r.ok) return;
          expect(formatVerifierKey(r.value.name, r.value.publicKey)).toBe(k);
          expect(toHex(noteKeyId(r.value.name, r.value.publicKey))).toBe(r.value.keyIdHex);
        }
      });

      it('parses: text and signature lines as expected', () => {
        const p = parseNote(c.note);
        expect(p.ok).toBe(true);
        if (!p.ok) return;
        expect(p.value.text).toBe(c.signedText);
        expect(p.value.signatures.map((s) => [s.name, s.keyIdHex])).toEqual(c.expectedSignatures.map((s) => [s.keyName, s.keyIdHex]));
        // The same note as UTF-8 bytes parses the same.
        const pb = parseNote(utf8(c.note));
        expect(pb.ok && pb.value.text).toBe(c.signedText);
      });

      it('opens with the expected outcome', () => {
        const r = openNote(c.note, verifiersOf(c));
        const known = c.expectedSignatures.filter((s) => s.knownKey);
        const unknown = c.expectedSignatures.filter((s) => !s.knownKey);
        if (known.length === 0) {
          expect(errCode(r)).toBe('note_no_known_signature');
          return;
        }
        expect(known.every((s) => s.verifies === true)).toBe(true);
        expect(r.ok).toBe(true);
        if (!r.ok) return;
        expect(r.value.text).toBe(c.signedText);
        expect(r.value.verified.map((s) => [s.name, s.keyIdHex])).toEqual(known.map((s) => [s.keyName, s.keyIdHex]));
        expect(r.value.unverified.map((s) => [s.name, s.keyIdHex])).toEqual(unknown.map((s) => [s.keyName, s.keyIdHex]));
      });
    });
  }

  it('PeterNeumann: the test signer key reproduces the signature byte for byte', () => {
    const skey = PETER.signerKey_TEST_ONLY!;
    const s = parseSignerKey(skey);
    expect(s.ok).toBe(true);
    if (!s.ok) return;
    expect(s.value.name).toBe('PeterNeumann');
    expect(s.value.keyIdHex).toBe('c74f20a3');
    expect(toHex(s.value.publicKey)).toBe(toHex(PETER_KEYS[0]!.publicKey));
    expect(formatSignerKey(s.value.name, s.value.seed)).toBe(skey);
    expect(signNote(PETER.signedText, [{ name: s.value.name, seed: s.value.seed }])).toBe(PETER.note);
    // A signer that passes its public key (the receipt log does) signs the same bytes.
    expect(signNote(PETER.signedText, [{ name: s.value.name, seed: s.value.seed, publicKey: s.value.publicKey }])).toBe(PETER.note);
  });

  it('two signatures, both known: signing with both test keys is not needed, both verify', () => {
    const c = byId('golang-note-two-sigs-both-known');
    const r = openNote(c.note, verifiersOf(c));
    expect(r.ok && r.value.verified.length).toBe(2);
  });

  it('unknown-key signatures are ignored, whatever their bytes', () => {
    const c = byId('golang-note-two-sigs-one-known');
    // Corrupt the EnochRoot (unknown) signature: still valid, since it is never checked.
    const enoch = c.note.indexOf('\u2014 EnochRoot ');
    const b64Start = enoch + '\u2014 EnochRoot '.length;
    const raw = fromBase64(c.note.slice(b64Start, -1))!;
    raw[20] = raw[20]! ^ 1;
    const note = c.note.slice(0, b64Start) + toBase64(raw) + '\n';
    const r = openNote(note, verifiersOf(c));
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.unverified.map((s) => s.name)).toEqual(['EnochRoot']);
    // Known to the other configuration, the corrupted signature is rejected.
    expect(errCode(openNote(note, verifiersOf(byId('golang-note-two-sigs-both-known'))))).toBe('signature_invalid');
  });

  it('sum.golang.org checkpoint parses (size 15067302) and verifies with its vkey', () => {
    const c = byId('sumdb-real-checkpoint-15067302');
    const [key] = verifiersOf(c);
    const r = verifyCheckpoint(c.note, { name: key!.name, publicKey: key!.publicKey, origin: 'go.sum database tree' });
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.origin).toBe('go.sum database tree');
    expect(r.value.size).toBe(15067302);
    expect(toBase64(r.value.rootHash)).toBe('gJyioq6dwR9n+NjEWORfYmH+ubeYm3kH42BBQ0bTpYI=');
    expect(r.value.extensions).toEqual([]);
    const o = openNote(c.note, [key!]);
    expect(o.ok && o.value.unverified.map((s) => s.name)).toEqual(['test.example.com']);
  });

  it('the parse-only tlog-checkpoint example parses and is rejected without a known key', () => {
    const c = byId('c2sp-tlog-checkpoint-example-format-only');
    const p = parseNote(c.note);
    expect(p.ok).toBe(true);
    if (!p.ok) return;
    const cp = parseCheckpoint(p.value.text);
    expect(cp.ok).toBe(true);
    if (!cp.ok) return;
    expect(cp.value.origin).toBe('example.com/behind-the-sofa');
    expect(cp.value.size).toBe(20852163);
    expect(errCode(openNote(c.note, []))).toBe('note_no_known_signature');
    // A key with the same name but another key ID is not "known" either.
    const other = ed25519PublicKey(ed25519RandomSeed());
    expect(errCode(openNote(c.note, [{ name: 'example.com/behind-the-sofa', publicKey: other }]))).toBe('note_no_known_signature');
  });
});

describe('openNote: negative cases', () => {
  it('the unmodified note verifies (control for the cases below)', () => {
    expect(openNote(PETER.note, PETER_KEYS).ok).toBe(true);
  });

  it('a flipped signature bit is signature_invalid', () => {
    for (const bit of [0, 7, 100, 511]) {
      const note = withEditedSignature((raw) => {
        const i = 4 + (bit >> 3);
        raw[i] = raw[i]! ^ (1 << (bit & 7));
      });
      expect(errCode(openNote(note, PETER_KEYS))).toBe('signature_invalid');
    }
  });

  it('a flipped key ID bit makes the signature unknown: note_no_known_signature', () => {
    const note = withEditedSignature((raw) => {
      raw[0] = raw[0]! ^ 1;
    });
    expect(errCode(openNote(note, PETER_KEYS))).toBe('note_no_known_signature');
  });

  it('altered text is signature_invalid', () => {
    expect(errCode(openNote(PETER.note.replace('cryptography', 'cryptographY'), PETER_KEYS))).toBe('signature_invalid');
    expect(errCode(openNote('x' + PETER.note, PETER_KEYS))).toBe('signature_invalid');
  });

  it('a truncated signature from a known key is signature_invalid', () => {
    const sigB64 = PETER.note.slice(PETER.note.lastIndexOf(' ') + 1, -1);
    const raw = fromBase64(sigB64)!.subarray(0, 40);
    const note = PETER.note.slice(0, PETER.note.lastIndexOf(' ') + 1) + toBase64(raw) + '\n';
    expect(errCode(openNote(note, PETER_KEYS))).toBe('signature_invalid');
  });

  it('every signature by a known key is checked, not just the first', () => {
    const line = PETER.note.slice(SIG_LINE_START);
    const bad = withEditedSignature((raw) => {
      raw[10] = raw[10]! ^ 0x80;
    }).slice(SIG_LINE_START);
    expect(errCode(openNote(PETER.note + bad, PETER_KEYS))).toBe('signature_invalid');
    // The same valid line twice is fine and reported once.
    const twice = openNote(PETER.note + line, PETER_KEYS);
    expect(twice.ok && twice.value.verified.length).toBe(1);
  });

  it('no known key is note_no_known_signature', () => {
    expect(errCode(openNote(PETER.note, []))).toBe('note_no_known_signature');
    const other = ed25519PublicKey(ed25519RandomSeed());
    expect(errCode(openNote(PETER.note, [{ name: 'EnochRoot', publicKey: other }]))).toBe('note_no_known_signature');
    // Same public key under another name: different key ID and name, unknown.
    expect(errCode(openNote(PETER.note, [{ name: 'PeterNeumann2', publicKey: PETER_KEYS[0]!.publicKey }]))).toBe('note_no_known_signature');
  });

  const text = PETER.signedText;
  const sigLine = PETER.note.slice(SIG_LINE_START);
  const sigB64 = sigLine.slice(sigLine.lastIndexOf(' ') + 1, -1);
  const malformed: [string, string | Uint8Array][] = [
    ['missing blank line', text + sigLine],
    ['no final newline', PETER.note.slice(0, -1)],
    ['CR in text', text.replace('\n', '\r\n') + '\n' + sigLine],
    ['CRLF line ending on the signature', text + '\n' + sigLine.slice(0, -1) + '\r\n'],
    ['tab in text', text.replace(' ', '\t') + '\n' + sigLine],
    ['NUL byte', text + '\n' + sigLine + '\u0000'],
    ['bad base64 character', text + '\n' + sigLine.replace(sigB64, sigB64.slice(0, 10) + '!' + sigB64.slice(11))],
    ['base64 without padding', text + '\n' + sigLine.replace(sigB64, sigB64.replace(/=+$/, ''))],
    ['base64 with non-zero trailing bits', text + '\n' + sigLine.replace(sigB64, sigB64.slice(0, -2) + 'N=')],
    ['base64url alphabet', text + '\n' + sigLine.replace(sigB64, sigB64.replace(/\//g, '_'))],
    ['empty signature', text + '\n\u2014 PeterNeumann \n'],
    ['missing signature', text + '\n\u2014 PeterNeumann\n'],
    ['signature shorter than 5 bytes', text + '\n\u2014 PeterNeumann AAAAAA==\n'],
    ['en dash instead of em dash', text + '\n' + sigLine.replace('\u2014', '\u2013')],
    ['hyphen instead of em dash', text + '\n' + sigLine.replace('\u2014', '-')],
    ['two hyphens instead of em dash', text + '\n' + sigLine.replace('\u2014', '--')],
    ['no space after the dash', text + '\n' + sigLine.replace('\u2014 ', '\u2014')],
    ['two spaces after the name', text + '\n' + sigLine.replace('PeterNeumann ', 'PeterNeumann  ')],
    ['plus in key name', text + '\n' + sigLine.replace('PeterNeumann', 'Peter+Neumann')],
    ['no-break space in key name', text + '\n' + sigLine.replace('PeterNeumann', 'Peter\u00a0Neumann')],
    ['empty signature block', text + '\n'],
    ['trailing blank line after signatures', PETER.note + '\n'],
    ['trailing garbage line', PETER.note + 'garbage\n'],
    ['empty input', ''],
    ['invalid UTF-8 bytes', concatBytes(utf8(text), Uint8Array.of(0xff), utf8('\n' + sigLine))],
    ['overlong UTF-8 encoding', concatBytes(Uint8Array.of(0xc0, 0xaf), utf8(text + '\n' + sigLine))],
    ['lone surrogate', text.replace('answer', 'answer\ud800') + '\n' + sigLine],
    ['too many signatures', text + '\n' + sigLine.repeat(MAX_NOTE_SIGNATURES + 1)],
    ['too large', 'a'.repeat(MAX_NOTE_BYTES) + '\n\n' + sigLine],
  ];
  for (const [label, note] of malformed) {
    it(`malformed: ${label} → note_malformed`, () => {
      expect(errCode(openNote(note, PETER_KEYS))).toBe('note_malformed');
      expect(errCode(parseNote(note))).toBe('note_malformed');
    });
  }

  it('a leading byte order mark is part of the text, for bytes as for strings', () => {
    const withBom = concatBytes(Uint8Array.of(0xef, 0xbb, 0xbf), utf8(PETER.note));
    expect(errCode(openNote(withBom, PETER_KEYS))).toBe('signature_invalid');
    expect(errCode(openNote('\ufeff' + PETER.note, PETER_KEYS))).toBe('signature_invalid');
    const p = parseNote(withBom);
    expect(p.ok && p.value.text).toBe('\ufeff' + PETER.signedText);
  });

  it('accepts exactly MAX_NOTE_SIGNATURES signatures', () => {
    expect(openNote(text + '\n' + sigLine.repeat(MAX_NOTE_SIGNATURES), PETER_KEYS).ok).toBe(true);
  });

  it('non-string, non-bytes input is note_malformed, never a throw', () => {
    for (const bad of [undefined, null, 42, {}, []]) {
      expect(errCode(openNote(bad as unknown as string, PETER_KEYS))).toBe('note_malformed');
    }
    expect(errCode(openNote(PETER.note, undefined as unknown as NoteVerifier[]))).toBe('note_no_known_signature');
  });

  it('two different configured keys with the same name and key ID are refused', () => {
    // Duplicates of the same key are harmless.
    expect(openNote(PETER.note, [...PETER_KEYS, ...PETER_KEYS]).ok).toBe(true);
    // Find two 32-byte strings whose key IDs collide under one name (birthday search, deterministic).
    const name = 'example.com/collide';
    const seen = new Map<string, Uint8Array>();
    let pair: [Uint8Array, Uint8Array, string] | undefined;
    for (let i = 0; !pair && i < 1_000_000; i++) {
      const pub = sha256(utf8(`key ${i}`));
      const id = toHex(noteKeyId(name, pub));
      const prev = seen.get(id);
      if (prev) pair = [prev, pub, id];
      else seen.set(id, pub);
    }
    expect(pair).toBeDefined();
    const [k1, k2, id] = pair!;
    const note = `hi\n\n\u2014 ${name} ${toBase64(concatBytes(fromHex(id), new Uint8Array(64)))}\n`;
    const one = openNote(note, [{ name, publicKey: k1 }]);
    expect(errCode(one)).toBe('signature_invalid');
    expect(one.ok || one.error.message).not.toMatch(/ambiguous/);
    const both = openNote(note, [
      { name, publicKey: k1 },
      { name, publicKey: k2 },
    ]);
    expect(errCode(both)).toBe('signature_invalid');
    expect(both.ok || both.error.message).toMatch(/ambiguous/);
  });
});

describe('notes with blank lines in the text (allowed by the spec when opening)', () => {
  it('splits at the last blank line', () => {
    const seed = ed25519RandomSeed();
    const pub = ed25519PublicKey(seed);
    const t = 'para one\n\npara two\n';
    const sig = concatBytes(noteKeyId('example.com/k', pub), ed25519Sign(seed, utf8(t)));
    const note = `${t}\n\u2014 example.com/k ${toBase64(sig)}\n`;
    const r = openNote(note, [{ name: 'example.com/k', publicKey: pub }]);
    expect(r.ok && r.value.text).toBe(t);
  });
});

describe('signNote', () => {
  it('round trip with several signers; any subset of keys verifies', () => {
    const a = { name: 'example.com/a', seed: ed25519RandomSeed() };
    const b = { name: 'example.com/b', seed: ed25519RandomSeed() };
    const note = signNote('hello\nworld \u00e9\u2603\n', [a, b]);
    const va = { name: a.name, publicKey: ed25519PublicKey(a.seed) };
    const vb = { name: b.name, publicKey: ed25519PublicKey(b.seed) };
    const both = openNote(note, [va, vb]);
    expect(both.ok && both.value.verified.map((v) => v.name)).toEqual([a.name, b.name]);
    const onlyB = openNote(note, [vb]);
    expect(onlyB.ok && onlyB.value.verified.map((v) => v.name)).toEqual([b.name]);
    expect(onlyB.ok && onlyB.value.unverified.map((v) => v.name)).toEqual([a.name]);
    expect(onlyB.ok && onlyB.value.text).toBe('hello\nworld \u00e9\u2603\n');
  });

  it('refuses texts and signers it must not sign', () => {
    const s = { name: 'example.com/a', seed: ed25519RandomSeed() };
    expect(() => signNote('no newline', [s])).toThrow(TypeError);
    expect(() => signNote('blank\n\nline\n', [s])).toThrow(TypeError);
    expect(() => signNote('\nleading blank\n', [s])).toThrow(TypeError);
    expect(() => signNote('cr\r\n', [s])).toThrow(TypeError);
    expect(() => signNote('ok\n', [])).toThrow(TypeError);
    expect(() => signNote('ok\n', [{ name: 'bad name', seed: s.seed }])).toThrow(TypeError);
    expect(() => signNote('ok\n', [{ name: 'bad+name', seed: s.seed }])).toThrow(TypeError);
    expect(() => signNote('ok\n', [{ name: 'a', seed: new Uint8Array(31) }])).toThrow();
  });
});

describe('keys', () => {
  const peterV = PETER.verifierKeys[0]!;

  it('key names follow the spec', () => {
    expect(isValidKeyName('example.com/foo')).toBe(true);
    expect(isValidKeyName('\u00e9t\u00e9')).toBe(true);
    for (const bad of ['', 'a b', 'a+b', 'a\u2003b', 'a\u3000b', 'a\u0085b', 'a\nb', 'a\u0001b', 'a\ud800b']) {
      expect(isValidKeyName(bad)).toBe(false);
    }
  });

  it('parseVerifierKey rejects malformed keys', () => {
    const [name, hash, b64] = [peterV.slice(0, 12), peterV.slice(13, 21), peterV.slice(22)];
    expect(`${name}+${hash}+${b64}`).toBe(peterV);
    const raw = fromBase64(b64)!;
    const alg2 = raw.slice();
    alg2[0] = 2;
    const bad = [
      '',
      name,
      `${name}+${hash}`,
      `${name}+${hash}+`,
      `${name}+00000000+${b64}`,
      `${name}+${hash.slice(1)}+${b64}`,
      `${name}+${hash}0+${b64}`,
      `Peter Neumann+${hash}+${b64}`,
      `+${hash}+${b64}`,
      `${name}+${hash}+${toBase64(alg2)}`,
      `${name}+${hash}+${toBase64(raw.subarray(0, 32))}`,
      `${name}+${hash}+${toBase64(concatBytes(raw, Uint8Array.of(0)))}`,
      `${name}+${hash}+${b64.slice(0, -1)}`,
      `OtherName+${hash}+${b64}`,
    ];
    for (const k of bad) expect(errCode(parseVerifierKey(k)), k).toBe('note_malformed');
    expect(errCode(parseVerifierKey(42 as unknown as string))).toBe('note_malformed');
    // Go parses the hash with strconv.ParseUint, so upper-case hex is accepted too.
    expect(parseVerifierKey(`${name}+${hash.toUpperCase()}+${b64}`).ok).toBe(true);
  });

  it('parseSignerKey rejects malformed keys', () => {
    const skey = PETER.signerKey_TEST_ONLY!;
    expect(parseSignerKey(skey).ok).toBe(true);
    for (const k of [
      skey.slice('PRIVATE+'.length),
      skey.replace('PRIVATE+KEY', 'PUBLIC+KEY'),
      skey.replace('c74f20a3', 'c74f20a4'),
      skey.replace('PeterNeumann', 'EnochRoot'),
      PETER.verifierKeys[0]!,
      'PRIVATE+KEY+PeterNeumann+c74f20a3+' + PETER.verifierKeys[0]!.slice(22),
    ]) {
      expect(errCode(parseSignerKey(k)), k).toBe('note_malformed');
    }
  });

  it('format and parse round trip for fresh keys', () => {
    const seed = ed25519RandomSeed();
    const pub = ed25519PublicKey(seed);
    const name = 'abc/receipts';
    const v = parseVerifierKey(formatVerifierKey(name, pub));
    const s = parseSignerKey(formatSignerKey(name, seed));
    expect(v.ok && toHex(v.value.publicKey)).toBe(toHex(pub));
    expect(s.ok && toHex(s.value.seed)).toBe(toHex(seed));
    expect(v.ok && s.ok && v.value.keyIdHex === s.value.keyIdHex).toBe(true);
    expect(() => formatVerifierKey('bad name', pub)).toThrow(TypeError);
    expect(() => formatVerifierKey(name, pub.subarray(0, 31))).toThrow(TypeError);
  });
});
