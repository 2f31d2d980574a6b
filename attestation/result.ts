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
  | 'bundle_malformed';

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

export function fail(code: VerifyErrorCode, message: string, extra?: Omit<VerifyError, 'code' | 'message'>): { ok: false; error: VerifyError } {
  return { ok: false, error: { code, message, ...extra } };
}
