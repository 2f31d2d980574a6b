// A receipt proof proves the receipt at the position its seq names (receipt-proof.ts).
import { describe, expect, test } from 'vitest';
import { utf8 } from '../attestation/bytes.ts';
import { signCheckpoint } from '../attestation/checkpoint.ts';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { leafHash, MerkleTree } from '../attestation/merkle.ts';
import { verifyReceiptProof } from '../attestation/receipt-proof.ts';
import { formatProofBundle } from '../attestation/tlog-proof.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

describe('verifyReceiptProof: the position is the seq', () => {
  test('a receipt proven at an index other than its seq is refused; the right one verifies', () => {
    const k = testKey();
    const origin = `${k.id}/receipts`;
    const line0 = serializeEnvelope(signReceipt(k, receiptPayload(k, 0)));
    const line1 = serializeEnvelope(signReceipt(k, receiptPayload(k, 1, { seq: '5' })));
    const tree = new MerkleTree();
    for (const l of [line0, line1]) tree.append(leafHash(utf8(l)));
    const note = signCheckpoint({ origin, size: 2, rootHash: tree.root() }, { name: origin, seed: k.seed });
    const bundle = (i: number, line: string) => formatProofBundle({ index: i, proof: tree.inclusionProof(i, 2), checkpointNote: note, extra: utf8(line) });
    expect(verifyReceiptProof(bundle(0, line0), { provider: k.id }).ok).toBe(true);
    const r = verifyReceiptProof(bundle(1, line1), { provider: k.id });
    expect(r.ok ? 'ok' : r.error.code).toBe('proof_index_out_of_range');
  });
});
