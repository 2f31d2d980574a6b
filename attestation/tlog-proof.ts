// C2SP transparency-log proofs (https://c2sp.org/tlog-proof): an offline-verifiable proof that an
// entry is in a log, as text:
//
//   c2sp.org/tlog-proof@v1\n
//   [extra <base64 of opaque extra data>\n]      optional, omitted when there is no extra data
//   index <zero-based leaf index, decimal, no leading zeros>\n
//   [<base64 of one 32-byte RFC 6962 inclusion-proof hash>\n]*   leaf's sibling first, up to the root's child
//   \n
//   <the checkpoint signed note, verbatim>
//
// The spec leaves "extra" to the application and says it is not authenticated. In this project it
// carries the logged entry itself (the receipt envelope's canonical JSON bytes), so a bundle can be
// self-contained: its inclusion under the signed checkpoint is what authenticates it. When the
// caller supplies the leaf data and the bundle also carries extra data, the two must be equal.
// No `node:` imports: the verifier runs in browsers.
import { bytesEqual, fromBase64, fromUtf8, toBase64 } from './bytes.ts';
import { verifyCheckpoint, type VerifiedCheckpoint } from './checkpoint.ts';
import { leafHash, verifyInclusion } from './merkle.ts';
import { parseNote } from './note.ts';
import { fail, ok, type VerifyResult } from './result.ts';

export const TLOG_PROOF_HEADER = 'c2sp.org/tlog-proof@v1';
/** Largest bundle accepted: UTF-8 bytes, or UTF-16 code units for a string (the extra line may carry a receipt envelope). */
export const MAX_PROOF_BUNDLE_BYTES = 8 << 20;
/** Most inclusion-proof hashes accepted (a tree of 2^53 leaves needs 53). */
export const MAX_PROOF_HASHES = 64;

export interface ProofBundle {
  /** Zero-based index of the entry in the log. */
  index: number;
  /** Inclusion proof, lowest sibling first. */
  proof: Uint8Array[];
  /** The checkpoint signed note, verbatim. */
  checkpointNote: string;
  /** Opaque extra data; in this project the logged leaf data (receipt envelope bytes). */
  extra?: Uint8Array;
}

export interface ProofBundleKey {
  /** The log's key name. */
  name: string;
  publicKey: Uint8Array;
  /** The log's origin; any other origin in the checkpoint is 'checkpoint_origin_mismatch'. */
  origin: string;
}

export interface VerifiedProofBundle {
  index: number;
  /** The leaf data whose inclusion was proven (the caller's, or the bundle's extra data). */
  leafData: Uint8Array;
  leafHash: Uint8Array;
  /** The bundle's extra data, if any (equal to leafData when present). */
  extra?: Uint8Array;
  /** The verified checkpoint the proof leads to. */
  checkpoint: VerifiedCheckpoint;
}

const INDEX_RE = /^index (0|[1-9][0-9]*)$/;
const EXTRA_PREFIX = 'extra ';

/** The proof text. Throws TypeError on invalid input. */
export function formatProofBundle(bundle: ProofBundle): string {
  const { index, proof, checkpointNote, extra } = bundle;
  if (!Number.isSafeInteger(index) || index < 0) throw new TypeError('index must be a non-negative safe integer');
  if (!Array.isArray(proof) || proof.length > MAX_PROOF_HASHES) throw new TypeError('proof must be an array of at most 64 hashes');
  if (!parseNote(checkpointNote).ok) throw new TypeError('checkpointNote is not a well-formed signed note');
  let out = TLOG_PROOF_HEADER + '\n';
  if (extra !== undefined) {
    if (!(extra instanceof Uint8Array)) throw new TypeError('extra must be bytes');
    if (extra.length > 0) out += EXTRA_PREFIX + toBase64(extra) + '\n';
  }
  out += `index ${index}\n`;
  for (const h of proof) {
    if (!(h instanceof Uint8Array) || h.length !== 32) throw new TypeError('proof hashes must be 32 bytes');
    out += toBase64(h) + '\n';
  }
  return out + '\n' + checkpointNote;
}

/**
 * Strict parse of a proof text (string or UTF-8 bytes). Layout errors are 'bundle_malformed'; a
 * checkpoint part that is not a well-formed signed note is 'note_malformed'. Verifies nothing.
 */
export function parseProofBundle(text: string | Uint8Array): VerifyResult<ProofBundle> {
  let s: string;
  if (text instanceof Uint8Array) {
    if (text.length > MAX_PROOF_BUNDLE_BYTES) return fail('bundle_malformed', 'proof too large');
    const d = fromUtf8(text);
    if (d === undefined) return fail('bundle_malformed', 'proof is not valid UTF-8');
    s = d;
  } else if (typeof text === 'string') {
    if (text.length > MAX_PROOF_BUNDLE_BYTES) return fail('bundle_malformed', 'proof too large');
    s = text;
  } else {
    return fail('bundle_malformed', 'proof is not text');
  }

  let pos = 0;
  /** The next line without its "\n", or undefined at the end or on a line without a newline. */
  const nextLine = (): string | undefined => {
    const nl = s.indexOf('\n', pos);
    if (nl < 0) return undefined;
    const line = s.slice(pos, nl);
    pos = nl + 1;
    return line;
  };

  if (nextLine() !== TLOG_PROOF_HEADER) return fail('bundle_malformed', `first line must be ${TLOG_PROOF_HEADER}`);
  let line = nextLine();
  let extra: Uint8Array | undefined;
  if (line !== undefined && line.startsWith(EXTRA_PREFIX)) {
    const raw = fromBase64(line.slice(EXTRA_PREFIX.length));
    if (!raw || raw.length === 0) return fail('bundle_malformed', 'extra line must hold non-empty strict base64');
    extra = raw;
    line = nextLine();
  }
  const m = line === undefined ? null : INDEX_RE.exec(line);
  if (!m) return fail('bundle_malformed', 'expected "index <decimal without leading zeros>"');
  const index = Number(m[1]);
  if (!Number.isSafeInteger(index)) return fail('bundle_malformed', 'index too large');

  const proof: Uint8Array[] = [];
  for (;;) {
    line = nextLine();
    if (line === undefined) return fail('bundle_malformed', 'missing blank line before the checkpoint');
    if (line === '') break;
    if (proof.length >= MAX_PROOF_HASHES) return fail('bundle_malformed', `more than ${MAX_PROOF_HASHES} proof hashes`);
    const h = fromBase64(line);
    if (!h || h.length !== 32) return fail('bundle_malformed', 'proof lines must be strict base64 of 32 bytes');
    proof.push(h);
  }

  const checkpointNote = s.slice(pos);
  if (checkpointNote.length === 0) return fail('bundle_malformed', 'missing checkpoint');
  const note = parseNote(checkpointNote);
  if (!note.ok) return note;
  return ok(extra === undefined ? { index, proof, checkpointNote } : { index, proof, checkpointNote, extra });
}

/**
 * Verifies a proof offline: the checkpoint must be signed by `key` with origin `key.origin`, and
 * leafHash(leafData) must be included at the bundle's index in the checkpointed tree. When
 * `leafData` is undefined the bundle's extra data is the leaf data (a self-contained bundle).
 *
 * Error codes: bundle_malformed (layout, no leaf data, or extra data that differs from leafData),
 * note_malformed / signature_invalid / note_no_known_signature (checkpoint signature),
 * checkpoint_malformed / checkpoint_origin_mismatch (checkpoint body), and from the inclusion
 * check proof_index_out_of_range / proof_size_mismatch / proof_root_mismatch. Never throws.
 */
export function verifyProofBundle(
  text: string | Uint8Array,
  leafData: Uint8Array | undefined,
  key: ProofBundleKey,
): VerifyResult<VerifiedProofBundle> {
  const parsed = parseProofBundle(text);
  if (!parsed.ok) return parsed;
  const { index, proof, checkpointNote, extra } = parsed.value;
  if (!key || typeof key.origin !== 'string') return fail('checkpoint_origin_mismatch', 'no expected origin given');
  const cp = verifyCheckpoint(checkpointNote, key);
  if (!cp.ok) return cp;

  let data: Uint8Array;
  if (leafData !== undefined) {
    if (!(leafData instanceof Uint8Array)) return fail('bundle_malformed', 'leaf data must be bytes');
    if (extra !== undefined && !bytesEqual(extra, leafData)) return fail('bundle_malformed', 'the bundle\'s extra data is not the given leaf data');
    data = leafData;
  } else {
    if (extra === undefined) return fail('bundle_malformed', 'no leaf data given and the bundle carries none');
    data = extra;
  }

  const lh = leafHash(data);
  const inc = verifyInclusion(index, cp.value.size, lh, proof, cp.value.rootHash);
  if (!inc.ok) return inc;
  const value: VerifiedProofBundle = { index, leafData: data, leafHash: lh, checkpoint: cp.value };
  if (extra !== undefined) value.extra = extra;
  return ok(value);
}
