// C2SP transparency-log checkpoints (https://c2sp.org/tlog-checkpoint): a signed note whose text is
//
//   <origin>\n<tree size, decimal, no leading zeros>\n<base64 of the 32-byte RFC 6962 root>\n[<extension line>\n]*
//
// All lines non-empty. In this project a provider's receipt log has origin and key name
// "<provider id>/receipts", the provider id being the lowercase hex of its Ed25519 public key.
// Sizes are JavaScript numbers, so a checkpoint above 2^53 - 1 leaves is refused as malformed.
// No `node:` imports: the verifier runs in browsers.
import { fromBase64, fromHex, isHex, toBase64 } from './bytes.ts';
import { openNote, signNote, type NoteSigner } from './note.ts';
import { fail, guarded, isOptions, ok, unknownOption, unsetOption, type VerifyResult } from './result.ts';

export interface Checkpoint {
  origin: string;
  /** Number of leaves in the tree (a safe integer). */
  size: number;
  /** RFC 6962 Merkle tree hash at `size`, 32 bytes. */
  rootHash: Uint8Array;
  /** Opaque extension lines (without newlines); absent or empty when there are none. */
  extensions?: string[];
}

export interface VerifiedCheckpoint {
  origin: string;
  size: number;
  rootHash: Uint8Array;
  extensions: string[];
  /** The checkpoint body (the note text). */
  text: string;
  /** The signed note as given. */
  note: string;
}

export interface CheckpointKey {
  /** The log's key name (in this project equal to the origin). */
  name: string;
  publicKey: Uint8Array;
  /** Expected origin; when given, any other origin is 'checkpoint_origin_mismatch'. */
  origin?: string;
}

const SIZE_RE = /^(?:0|[1-9][0-9]*)$/;
const BAD_CONTROL = /[\u0000-\u0009\u000b-\u001f]/;
const LONE_SURROGATE = /\p{Cs}/u;

/** "<providerIdHex>/receipts": the origin and log key name of a provider's receipt log. */
export function receiptLogOrigin(providerIdHex: string): string {
  if (!isHex(providerIdHex, 32)) throw new TypeError('provider id is the lowercase hex of a 32-byte Ed25519 public key');
  return `${providerIdHex}/receipts`;
}

/** The key a provider's receipt-log checkpoints verify under (name and origin `<id>/receipts`); undefined for an id that is not 64 lowercase hex. */
export function receiptLogKey(providerIdHex: string): Required<CheckpointKey> | undefined {
  if (!isHex(providerIdHex, 32)) return undefined;
  const origin = `${providerIdHex}/receipts`;
  return { name: origin, origin, publicKey: fromHex(providerIdHex) };
}

function validLine(line: unknown): line is string {
  return typeof line === 'string' && line.length > 0 && !line.includes('\n') && !BAD_CONTROL.test(line) && !LONE_SURROGATE.test(line);
}

/** The checkpoint body. Throws TypeError on an invalid origin, size, root or extension line. */
export function formatCheckpoint(cp: Checkpoint): string {
  if (!validLine(cp.origin)) throw new TypeError('checkpoint origin must be a non-empty single line');
  if (!Number.isSafeInteger(cp.size) || cp.size < 0) throw new TypeError('checkpoint size must be a non-negative safe integer');
  if (!(cp.rootHash instanceof Uint8Array) || cp.rootHash.length !== 32) throw new TypeError('checkpoint root hash must be 32 bytes');
  let out = `${cp.origin}\n${cp.size}\n${toBase64(cp.rootHash)}\n`;
  for (const ext of cp.extensions ?? []) {
    if (!validLine(ext)) throw new TypeError('checkpoint extension lines must be non-empty single lines');
    out += ext + '\n';
  }
  return out;
}

/** Strict parse of a checkpoint body (a note text, ending in "\n"). Errors are 'checkpoint_malformed'. */
export function parseCheckpoint(text: string): VerifyResult<Checkpoint & { extensions: string[] }> {
  if (typeof text !== 'string' || !text.endsWith('\n')) return fail('checkpoint_malformed', 'checkpoint text must end with a newline');
  if (BAD_CONTROL.test(text) || LONE_SURROGATE.test(text)) return fail('checkpoint_malformed', 'checkpoint contains a control character or invalid Unicode');
  const lines = text.slice(0, -1).split('\n');
  if (lines.length < 3) return fail('checkpoint_malformed', 'checkpoint needs origin, size and root hash lines');
  if (lines.some((l) => l.length === 0)) return fail('checkpoint_malformed', 'checkpoint lines must be non-empty');
  const [origin, sizeStr, rootStr, ...extensions] = lines as [string, string, string, ...string[]];
  if (!SIZE_RE.test(sizeStr)) return fail('checkpoint_malformed', 'tree size must be a decimal number without leading zeros');
  const size = Number(sizeStr);
  if (!Number.isSafeInteger(size)) return fail('checkpoint_malformed', 'tree size too large');
  const rootHash = fromBase64(rootStr);
  if (!rootHash || rootHash.length !== 32) return fail('checkpoint_malformed', 'root hash must be strict base64 of 32 bytes');
  return ok({ origin, size, rootHash, extensions });
}

/** Signs the checkpoint body with one key and returns the signed note. Throws on invalid input. */
export function signCheckpoint(cp: Checkpoint, signer: NoteSigner): string {
  return signNote(formatCheckpoint(cp), [signer]);
}

/**
 * Verifies a signed checkpoint: the note must carry a valid signature by `key` (name and public
 * key; other signatures, such as witness cosignatures, are ignored), its text must be a
 * well-formed checkpoint, and its origin must equal `key.origin` when that is given.
 * Never throws.
 */
export function verifyCheckpoint(note: string, key: CheckpointKey): VerifyResult<VerifiedCheckpoint> {
  // The key is read once, first, under its own name: a key that cannot be used checked nothing.
  const read = guarded('options_invalid', 'the checkpoint key', () => readCheckpointKey(key));
  if (!read.ok) return read;
  return guarded('checkpoint_malformed', 'the checkpoint', () => checkCheckpoint(note, read.value));
}

function readCheckpointKey(key: unknown): VerifyResult<CheckpointKey> {
  if (!isOptions(key) || unknownOption(key, ['name', 'publicKey', 'origin']) !== undefined) return fail('options_invalid', 'the checkpoint key must be an object { name, publicKey, origin? }');
  const { name, publicKey, origin } = key;
  // (an origin given as undefined, from an unset variable, must not quietly pin nothing: s28 review)
  if (unsetOption(key, ['origin']) !== undefined) return fail('options_invalid', 'the checkpoint key\'s origin is given as undefined: give it, or leave it out');
  if (typeof name !== 'string' || !(publicKey instanceof Uint8Array) || (origin !== undefined && typeof origin !== 'string')) {
    return fail('options_invalid', 'the checkpoint key needs name (a string), publicKey (32 bytes) and, optionally, origin (a string)');
  }
  return ok({ name, publicKey, ...(origin !== undefined ? { origin } : {}) });
}

function checkCheckpoint(note: string, key: CheckpointKey): VerifyResult<VerifiedCheckpoint> {
  const opened = openNote(note, [{ name: key.name, publicKey: key.publicKey }]);
  if (!opened.ok) return opened;
  const text = opened.value.text;
  const cp = parseCheckpoint(text);
  if (!cp.ok) return cp;
  if (key.origin !== undefined && cp.value.origin !== key.origin) {
    return fail('checkpoint_origin_mismatch', `checkpoint origin ${JSON.stringify(cp.value.origin.slice(0, 200))} is not the expected ${JSON.stringify(key.origin)}`);
  }
  return ok({ ...cp.value, text, note });
}
