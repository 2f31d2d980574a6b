// A receipt's offline proof: a C2SP tlog-proof bundle whose extra data is the receipt envelope.
// Verifying it proves the receipt is valid on its own AND that the provider committed to it in a
// signed checkpoint of its log, at the position its seq names.
import { fromUtf8 } from './bytes.ts';
import { parseCheckpoint, receiptLogKey, type VerifiedCheckpoint } from './checkpoint.ts';
import { guarded, fail, isOptions, ok, unknownOption, type VerifyResult } from './result.ts';
import { verifyReceipt, type VerifiedReceipt } from './receipt-verify.ts';
import { parseProofBundle, verifyProofBundle } from './tlog-proof.ts';
import { parseNote } from './note.ts';

export interface VerifiedReceiptProof {
  receipt: VerifiedReceipt;
  checkpoint: VerifiedCheckpoint;
  index: number;
}

/**
 * Verifies a receipt proof bundle. `provider` pins the expected provider; without it the provider
 * is read from the checkpoint's origin (`<provider id>/receipts`), which is self-certifying: the
 * provider id is the public key that must have signed both the checkpoint and the receipt.
 */
export function verifyReceiptProof(text: string, opts: { provider?: string } = {}): VerifyResult<VerifiedReceiptProof> {
  return guarded('bundle_malformed', 'the bundle', () => verifyReceiptProofUnsafe(text, opts ?? {}));
}

function verifyReceiptProofUnsafe(text: string, opts: { provider?: string }): VerifyResult<VerifiedReceiptProof> {
  // A pin that is not given as asked (a misspelt key, `provider: undefined` from an unset variable)
  // must not quietly become "whichever provider the bundle names".
  if (!isOptions(opts) || unknownOption(opts, ['provider']) !== undefined) return fail('options_invalid', 'options must be an object { provider? }');
  if ('provider' in opts && typeof opts.provider !== 'string') return fail('options_invalid', 'provider must be a provider id (64 lowercase hex characters), or left out');
  const pinned = opts.provider;
  const pinnedKey = pinned === undefined ? undefined : receiptLogKey(pinned);
  if (pinned !== undefined && !pinnedKey) return fail('unknown_key', 'provider must be 64 lowercase hex characters');
  const parsed = parseProofBundle(text);
  if (!parsed.ok) return parsed;
  const note = parseNote(parsed.value.checkpointNote);
  const cp = note.ok ? parseCheckpoint(note.value.text) : undefined;
  const origin = cp?.ok ? cp.value.origin : '';
  const m = /^([0-9a-f]{64})\/receipts$/.exec(origin);
  if (pinned !== undefined && m && m[1] !== pinned) return fail('provider_mismatch', `the bundle is from provider ${m[1]}, not ${pinned}`);
  if (pinned === undefined && !m) {
    // (A note or checkpoint that does not parse is named as such, not as the wrong origin: s23 h3.)
    if (!note.ok) return note;
    if (cp && !cp.ok) return cp;
    return fail('checkpoint_origin_mismatch', 'the checkpoint origin is not "<provider id>/receipts"');
  }
  const provider = pinned ?? m![1]!;
  const key = pinnedKey ?? receiptLogKey(provider)!; // (an origin's id is 64 lowercase hex: a key)
  const b = verifyProofBundle(text, undefined, key);
  if (!b.ok) return b;
  const line = fromUtf8(b.value.leafData);
  if (line === undefined) return fail('bundle_malformed', 'the bundle\'s receipt is not UTF-8');
  // The leaf is a line of the log: it must be its envelope's canonical form, as the audit requires.
  const r = verifyReceipt(line, { provider, chain: true });
  if (!r.ok) return r;
  if (r.value.payload.seq !== String(b.value.index)) {
    return fail('proof_index_out_of_range', `receipt seq ${r.value.payload.seq} is proven at index ${b.value.index}`);
  }
  return ok({ receipt: r.value, checkpoint: b.value.checkpoint, index: b.value.index });
}
