// C2SP signed notes (https://c2sp.org/signed-note) with Ed25519 keys (signature type 0x01), the
// envelope of transparency-log checkpoints. No `node:` imports: the verifier runs in browsers.
//
// A signed note is: text (ending in "\n"), a blank line, then one or more lines
// "— <key name> base64(key ID[4] || signature)\n". The text is split from the signatures at the
// LAST blank line; signatures cover the UTF-8 text including its final newline, not the blank line.
//
// Opening rules (spec plus golang.org/x/mod/sumdb/note):
//   - the whole note is valid UTF-8 with no control character other than "\n" (so no "\r");
//   - every signature line starts with U+2014 EM DASH and a space, names a valid key name, and
//     carries strict padded base64 of at least 5 bytes;
//   - signatures whose (name, key ID) pair matches no known key are ignored (reported as
//     unverified; identical repeated lines once), even if the name or the ID alone matches;
//   - every signature whose (name, key ID) matches a known key is verified (unlike Go, which only
//     checks the first one per key): one failure rejects the whole note ('signature_invalid');
//   - at least one signature must verify ('note_no_known_signature').
// Malformed input is reported before any signature is checked, so the answer does not depend on
// the order of the lines.
import { bytesEqual, concatBytes, fromBase64, fromUtf8, toBase64, toHex, utf8 } from './bytes.ts';
import { ed25519PublicKey, ed25519Sign, ed25519Verify } from './ed25519.ts';
import { sha256 } from './hash.ts';
import { fail, ok, type VerifyResult } from './result.ts';

/** Signature type byte of Ed25519 in the signed-note key ID and key encodings. */
export const NOTE_ALG_ED25519 = 0x01;
/** Largest note accepted, in UTF-8 bytes. Generous: a checkpoint with 100 signatures is < 16 KiB. */
export const MAX_NOTE_BYTES = 1 << 20;
/** Most signature lines accepted in one note (the spec asks for at least 16; Go allows 100). */
export const MAX_NOTE_SIGNATURES = 100;

const EM_DASH_PREFIX = '\u2014 ';
const SIGNER_KEY_PREFIX = 'PRIVATE+KEY+';

/** A key that may verify note signatures. */
export interface NoteVerifier {
  name: string;
  publicKey: Uint8Array;
}

/** A key that signs notes: its name and 32-byte Ed25519 seed. */
export interface NoteSigner {
  name: string;
  seed: Uint8Array;
  /** The seed's public key, when the caller holds it already (else it is derived, per note). */
  publicKey?: Uint8Array;
}

/** One signature line of a note, parsed but not verified. */
export interface NoteSignature {
  name: string;
  /** The 4-byte key ID as an unsigned 32-bit integer (big-endian). */
  keyId: number;
  /** The key ID as 8 lowercase hex digits. */
  keyIdHex: string;
  /** The signature bytes after the key ID (64 bytes for Ed25519, other lengths for other types). */
  signature: Uint8Array;
}

export interface ParsedNote {
  /** The signed text, including its final newline. */
  text: string;
  signatures: NoteSignature[];
}

export interface OpenedNote {
  text: string;
  /** Known keys whose signatures verified, once per key. */
  verified: { name: string; keyId: number; keyIdHex: string }[];
  /** Signatures by keys that are not known; ignored, listed for information (e.g. cosignatures). */
  unverified: NoteSignature[];
}

const WHITE_SPACE = /\p{White_Space}/u;
const LONE_SURROGATE = /\p{Cs}/u;
// Control characters below U+0020 except "\n".
const BAD_CONTROL = /[\u0000-\u0009\u000b-\u001f]/;

/**
 * A valid key name: non-empty, well-formed Unicode, no Unicode white space (Go's unicode.IsSpace),
 * no "+". Control characters are refused too, since a note may not contain them.
 */
export function isValidKeyName(name: unknown): name is string {
  return (
    typeof name === 'string' &&
    name.length > 0 &&
    !name.includes('+') &&
    !WHITE_SPACE.test(name) &&
    !LONE_SURROGATE.test(name) &&
    !BAD_CONTROL.test(name)
  );
}

/** The 4-byte key ID: SHA-256(name || 0x0A || 0x01 || publicKey)[:4]. */
export function noteKeyId(name: string, publicKey: Uint8Array): Uint8Array {
  return sha256(concatBytes(utf8(name), Uint8Array.of(0x0a, NOTE_ALG_ED25519), publicKey)).subarray(0, 4);
}

function keyIdNumber(id: Uint8Array): number {
  return ((id[0]! << 24) | (id[1]! << 16) | (id[2]! << 8) | id[3]!) >>> 0;
}

/** "name+hash+base64(0x01 || publicKey)", the encoded verifier key. Throws on a bad name or key size. */
export function formatVerifierKey(name: string, publicKey: Uint8Array): string {
  if (!isValidKeyName(name)) throw new TypeError('invalid note key name');
  if (!(publicKey instanceof Uint8Array) || publicKey.length !== 32) throw new TypeError('an Ed25519 public key is 32 bytes');
  const enc = concatBytes(Uint8Array.of(NOTE_ALG_ED25519), publicKey);
  return `${name}+${toHex(noteKeyId(name, publicKey))}+${toBase64(enc)}`;
}

const HASH8 = /^[0-9a-fA-F]{8}$/;

/** Splits at the first `sep`; after is undefined when absent. */
function chop(s: string, sep: string): [string, string | undefined] {
  const i = s.indexOf(sep);
  return i < 0 ? [s, undefined] : [s.slice(0, i), s.slice(i + sep.length)];
}

/** Decodes "hash+base64(0x01 || key32)" after the name; undefined if malformed. */
function decodeKeyTail(tail: string | undefined): { hash: number; key: Uint8Array } | undefined {
  if (tail === undefined) return undefined;
  // The base64 may itself contain "+": split at the first "+" only.
  const [hash16, key64] = chop(tail, '+');
  if (!HASH8.test(hash16) || key64 === undefined) return undefined;
  const raw = fromBase64(key64);
  if (!raw || raw.length !== 33 || raw[0] !== NOTE_ALG_ED25519) return undefined;
  return { hash: parseInt(hash16, 16) >>> 0, key: raw.slice(1) };
}

/**
 * Parses an encoded verifier key "name+hash+base64(0x01 || publicKey)": valid name, 8 hex digits,
 * strict base64 of the Ed25519 type byte and a 32-byte key, and a hash that matches the key ID.
 * Errors are 'note_malformed' (there is no dedicated code for keys).
 */
export function parseVerifierKey(vkey: string): VerifyResult<NoteVerifier & { keyIdHex: string }> {
  if (typeof vkey !== 'string') return fail('note_malformed', 'verifier key is not a string');
  const [name, tail] = chop(vkey, '+');
  if (!isValidKeyName(name)) return fail('note_malformed', 'verifier key has an invalid name');
  const dec = decodeKeyTail(tail);
  if (!dec) return fail('note_malformed', 'verifier key is malformed or not an Ed25519 key');
  const id = noteKeyId(name, dec.key);
  if (keyIdNumber(id) !== dec.hash) return fail('note_malformed', 'verifier key hash does not match the key');
  return ok({ name, publicKey: dec.key, keyIdHex: toHex(id) });
}

/** "PRIVATE+KEY+name+hash+base64(0x01 || seed)", the encoded signer key. Keep it secret. */
export function formatSignerKey(name: string, seed: Uint8Array): string {
  if (!isValidKeyName(name)) throw new TypeError('invalid note key name');
  const pub = ed25519PublicKey(seed); // throws unless 32 bytes
  const enc = concatBytes(Uint8Array.of(NOTE_ALG_ED25519), seed);
  return `${SIGNER_KEY_PREFIX}${name}+${toHex(noteKeyId(name, pub))}+${toBase64(enc)}`;
}

/** Parses an encoded signer key; the hash must match the public key derived from the seed. */
export function parseSignerKey(skey: string): VerifyResult<NoteSigner & { publicKey: Uint8Array; keyIdHex: string }> {
  if (typeof skey !== 'string' || !skey.startsWith(SIGNER_KEY_PREFIX)) return fail('note_malformed', 'signer key does not start with PRIVATE+KEY+');
  const [name, tail] = chop(skey.slice(SIGNER_KEY_PREFIX.length), '+');
  if (!isValidKeyName(name)) return fail('note_malformed', 'signer key has an invalid name');
  const dec = decodeKeyTail(tail);
  if (!dec) return fail('note_malformed', 'signer key is malformed or not an Ed25519 key');
  const publicKey = ed25519PublicKey(dec.key);
  const id = noteKeyId(name, publicKey);
  if (keyIdNumber(id) !== dec.hash) return fail('note_malformed', 'signer key hash does not match the key');
  return ok({ name, seed: dec.key, publicKey, keyIdHex: toHex(id) });
}

/** Checks a would-be note text for signing: ends in "\n", no blank line, allowed characters. */
function checkSignableText(text: string): string | undefined {
  if (typeof text !== 'string' || !text.endsWith('\n')) return 'note text must end with a newline';
  if (text.startsWith('\n') || text.includes('\n\n')) return 'note text must not contain a blank line';
  if (BAD_CONTROL.test(text) || LONE_SURROGATE.test(text)) return 'note text contains a control character or is not valid Unicode';
  return undefined;
}

/**
 * Signs `text` with each signer (in order) and returns the signed note. The text must end in a
 * newline and contain no blank line (this package never signs texts that rely on the
 * last-blank-line rule). Throws TypeError on invalid input; signing is not a verification path.
 */
export function signNote(text: string, signers: NoteSigner[]): string {
  const problem = checkSignableText(text);
  if (problem) throw new TypeError(problem);
  if (!Array.isArray(signers) || signers.length === 0) throw new TypeError('at least one signer is required');
  if (signers.length > MAX_NOTE_SIGNATURES) throw new TypeError('too many signers');
  const msg = utf8(text);
  if (msg.length > MAX_NOTE_BYTES) throw new TypeError('note text too large');
  let out = text + '\n';
  for (const s of signers) {
    if (!isValidKeyName(s.name)) throw new TypeError('invalid note key name');
    const id = noteKeyId(s.name, s.publicKey ?? ed25519PublicKey(s.seed));
    const sig = ed25519Sign(s.seed, msg);
    out += `${EM_DASH_PREFIX}${s.name} ${toBase64(concatBytes(id, sig))}\n`;
  }
  return out;
}

/** Turns the input into a string after the size and UTF-8 checks, or gives the reason it cannot. */
function decodeNoteInput(note: string | Uint8Array, maxBytes: number): { s: string } | { error: string } {
  if (note instanceof Uint8Array) {
    if (note.length > maxBytes) return { error: 'note too large' };
    const s = fromUtf8(note);
    if (s === undefined) return { error: 'note is not valid UTF-8' };
    return { s };
  }
  if (typeof note !== 'string') return { error: 'note is not a string' };
  // UTF-8 never takes fewer bytes than UTF-16 code units, so this bounds work before encoding.
  if (note.length > maxBytes) return { error: 'note too large' };
  if (LONE_SURROGATE.test(note)) return { error: 'note is not valid Unicode' };
  if (utf8(note).length > maxBytes) return { error: 'note too large' };
  return { s: note };
}

/**
 * Parses a signed note without verifying anything. Errors are 'note_malformed'.
 * Accepts a string or the note's UTF-8 bytes.
 */
export function parseNote(note: string | Uint8Array): VerifyResult<ParsedNote> {
  const dec = decodeNoteInput(note, MAX_NOTE_BYTES);
  if ('error' in dec) return fail('note_malformed', dec.error);
  const s = dec.s;
  if (BAD_CONTROL.test(s)) return fail('note_malformed', 'note contains a control character other than newline');
  const split = s.lastIndexOf('\n\n');
  if (split < 0) return fail('note_malformed', 'note has no blank line before its signatures');
  const text = s.slice(0, split + 1);
  const block = s.slice(split + 2);
  if (block.length === 0 || !block.endsWith('\n')) return fail('note_malformed', 'signature block is empty or lacks a final newline');
  const lines = block.slice(0, -1).split('\n');
  if (lines.length > MAX_NOTE_SIGNATURES) return fail('note_malformed', `more than ${MAX_NOTE_SIGNATURES} signatures`);
  const signatures: NoteSignature[] = [];
  for (const line of lines) {
    if (!line.startsWith(EM_DASH_PREFIX)) return fail('note_malformed', 'signature line does not start with an em dash and a space');
    const [name, b64] = chop(line.slice(EM_DASH_PREFIX.length), ' ');
    if (!isValidKeyName(name)) return fail('note_malformed', 'signature line has an invalid key name');
    if (b64 === undefined || b64 === '') return fail('note_malformed', 'signature line has no signature');
    const raw = fromBase64(b64);
    if (!raw || raw.length < 5) return fail('note_malformed', 'signature is not strict base64 of at least 5 bytes');
    const id = raw.subarray(0, 4);
    signatures.push({ name, keyId: keyIdNumber(id), keyIdHex: toHex(id), signature: raw.slice(4) });
  }
  return ok({ text, signatures });
}

/**
 * Parses and verifies a signed note against the known keys. A known key is matched by name and
 * key ID together. See the rules at the top of this file. Never throws.
 */
export function openNote(note: string | Uint8Array, verifiers: readonly NoteVerifier[]): VerifyResult<OpenedNote> {
  const parsed = parseNote(note);
  if (!parsed.ok) return parsed;
  const { text, signatures } = parsed.value;

  // Index the known keys by name and key ID.
  const known = new Map<string, Uint8Array[]>();
  for (const v of Array.isArray(verifiers) ? verifiers : []) {
    if (!v || typeof v.name !== 'string' || !(v.publicKey instanceof Uint8Array)) continue;
    const k = `${v.name}\n${toHex(noteKeyId(v.name, v.publicKey))}`;
    const list = known.get(k);
    if (!list) known.set(k, [v.publicKey]);
    else if (!list.some((p) => bytesEqual(p, v.publicKey))) list.push(v.publicKey);
  }

  const msg = utf8(text);
  const verified: OpenedNote['verified'] = [];
  const verifiedKeys = new Set<string>();
  const unverified: NoteSignature[] = [];
  const seenUnverified = new Set<string>();
  for (const sig of signatures) {
    const k = `${sig.name}\n${sig.keyIdHex}`;
    const keys = known.get(k);
    if (!keys) {
      const line = `${k}\n${toBase64(sig.signature)}`;
      if (!seenUnverified.has(line)) {
        seenUnverified.add(line);
        unverified.push(sig);
      }
      continue;
    }
    if (keys.length > 1) {
      // Two different configured keys share a name and key ID: the configuration is suspect.
      return fail('signature_invalid', `ambiguous known keys for ${sig.name}+${sig.keyIdHex}`);
    }
    if (!ed25519Verify(sig.signature, msg, keys[0]!)) {
      return fail('signature_invalid', `signature by known key ${sig.name}+${sig.keyIdHex} does not verify`);
    }
    if (!verifiedKeys.has(k)) {
      verifiedKeys.add(k);
      verified.push({ name: sig.name, keyId: sig.keyId, keyIdHex: sig.keyIdHex });
    }
  }
  if (verified.length === 0) return fail('note_no_known_signature', 'no signature by a known key');
  return ok({ text, verified, unverified });
}
