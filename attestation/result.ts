// Verification results. Every check in the verifier returns one of these instead of throwing, so a
// caller auditing a million records never pays for exceptions and never crashes on hostile input.

/** Every distinct reason a verification can fail. Stable strings: tools and tests match on them. */
export type VerifyErrorCode =
  // envelopes and payloads
  | 'envelope_not_json'
  | 'envelope_malformed'
  | 'envelope_not_canonical'
  | 'payload_type_mismatch'
  | 'payload_not_base64'
  | 'payload_not_json'
  | 'payload_not_canonical'
  | 'payload_invalid'
  | 'unknown_key'
  | 'signature_malformed'
  | 'signature_invalid'
  // receipts and logs
  | 'provider_mismatch'
  | 'cost_mismatch'
  | 'cost_exceeds_hold'
  | 'seq_gap'
  | 'seq_duplicate'
  | 'seq_out_of_order'
  | 'prev_mismatch'
  | 'log_empty'
  | 'ticket_billed_twice'
  // prices (a log checked against the provider's signed price lists)
  | 'price_list_invalid'
  | 'price_list_missing'
  | 'price_mismatch'
  // tickets
  | 'ticket_expired'
  | 'ticket_not_yet_valid'
  | 'ticket_wrong_provider'
  | 'ticket_body_mismatch'
  // Merkle proofs
  | 'proof_malformed'
  | 'proof_index_out_of_range'
  | 'proof_size_mismatch'
  | 'proof_root_mismatch'
  // signed notes and checkpoints
  | 'note_malformed'
  | 'note_no_known_signature'
  | 'checkpoint_malformed'
  | 'checkpoint_origin_mismatch'
  | 'checkpoint_root_mismatch'
  | 'checkpoint_size_exceeds_log'
  | 'checkpoint_fork'
  | 'checkpoint_inconsistent'
  | 'bundle_malformed'
  // the caller's options (a missing provider, a NaN clock): nothing was checked
  | 'options_invalid';

export interface VerifyError {
  code: VerifyErrorCode;
  message: string;
  /** The offending field (dotted path) for payload_invalid. */
  field?: string;
  /** The receipt sequence number the error concerns, where there is one. */
  seq?: string;
}

export type VerifyResult<T = undefined> = { ok: true; value: T } | { ok: false; error: VerifyError };

export function ok<T>(value: T): { ok: true; value: T } {
  return { ok: true, value };
}

/** What a thrown value says, whatever was thrown (null, a Symbol, an object whose getters throw). Never throws. */
function thrownMessage(e: unknown): string {
  try {
    const m = e !== null && typeof e === 'object' ? (e as { message?: unknown }).message : undefined;
    return typeof m === 'string' ? m : String(e);
  } catch {
    return 'something unreadable was thrown';
  }
}

/**
 * Runs a check; anything it throws (only reachable through hostile values: getters, proxies, a
 * missing argument) becomes a failure with `code`, so a verifier function answers, never throws.
 */
export function guarded<T>(code: VerifyErrorCode, what: string, check: () => VerifyResult<T>): VerifyResult<T> {
  try {
    return check();
  } catch (e) {
    return fail(code, `${what} could not be read: ${thrownMessage(e)}`);
  }
}

/** Whether `v` is an options object (not null, an array or a string); options_invalid otherwise. */
export function isOptions(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** The first of `keys` that `opts` has with the value undefined (an unset variable: a pin that would quietly pin nothing), or undefined. */
export function unsetOption(opts: Record<string, unknown>, keys: readonly string[]): string | undefined {
  return keys.find((k) => k in opts && opts[k] === undefined);
}

/** The first key of `opts` that is not one of `allowed` (a misspelt pin must not quietly check nothing), or undefined. */
export function unknownOption(opts: Record<string, unknown>, allowed: readonly string[]): string | undefined {
  return Object.keys(opts).find((k) => !allowed.includes(k));
}

export function fail(code: VerifyErrorCode, message: string, extra?: Omit<VerifyError, 'code' | 'message'>): { ok: false; error: VerifyError } {
  return { ok: false, error: { code, message, ...extra } };
}
