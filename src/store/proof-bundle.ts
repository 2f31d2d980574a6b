// A receipt's offline proof, as the node's /service/log/1.0.0 inclusion op answers it and
// `seller-node log prove` writes it: a C2SP tlog-proof bundle (attestation/tlog-proof.ts) whose
// extra data is the receipt's envelope line, under one of the log's signed checkpoints.
// `seller-node verify FILE` (verifyReceiptProof) checks it offline.
import { utf8 } from '../../attestation/bytes.ts';
import { formatProofBundle } from '../../attestation/tlog-proof.ts';
import type { ReceiptLog, StoredCheckpoint } from './receipt-log.ts';

/**
 * The tlog-proof bundle of durable receipt `seq` under the signed checkpoint `cp` (one of
 * log.checkpoints(), log.checkpointAt(size)). Throws RangeError when `seq` is not under `cp` or not in the log.
 */
export function receiptProofBundle(log: ReceiptLog, seq: number, cp: Pick<StoredCheckpoint, 'size' | 'note'>): string {
  if (!Number.isSafeInteger(seq) || seq < 0 || seq >= cp.size) throw new RangeError(`seq ${seq} is not under the checkpoint of size ${cp.size}`);
  const line = log.lineBySeq(seq);
  if (line === undefined) throw new RangeError(`seq ${seq} is not in the log`);
  return formatProofBundle({ index: seq, proof: log.inclusionProof(seq, cp.size), checkpointNote: cp.note, extra: utf8(line) });
}
