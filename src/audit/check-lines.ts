// The per-receipt part of an audit, run in worker threads: verify each line on its own and reduce
// it to the link the chain check needs. Pure function of its input, so chunks run in any order.
import { peekSeq, verifyReceipt } from '../../attestation/receipt-verify.ts';
import type { VerifyError } from '../../attestation/result.ts';

export interface CheckedLine {
  number: number;
  ok: boolean;
  error?: VerifyError;
  seq?: string;
  prev?: string;
  payloadSha256?: string;
  leafHash?: Uint8Array;
  cost?: string;
  hold?: string;
  status?: string;
}

export interface CheckTask {
  provider: string;
  lines: { text: string; number: number }[];
}

export function checkLines(task: CheckTask): CheckedLine[] {
  return task.lines.map(({ text, number }) => {
    const r = verifyReceipt(text, { provider: task.provider, chain: true });
    if (!r.ok) {
      const seq = r.error.seq ?? peekSeq(text);
      return { number, ok: false, error: r.error, ...(seq !== undefined ? { seq } : {}) };
    }
    const p = r.value.payload;
    return {
      number,
      ok: true,
      seq: p.seq,
      prev: p.prev,
      payloadSha256: r.value.payloadSha256!,
      leafHash: r.value.leafHash!,
      cost: p.cost_micro_usd,
      hold: p.hold_micro_usd,
      status: p.status,
    };
  });
}
