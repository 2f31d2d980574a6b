// seller-node/verifier: everything a buyer, the marketplace or an auditor needs to check what a
// node signed. Pure TypeScript on @noble/*; imports no `node:` module, so it runs unchanged in
// browsers (test/browser-verifier.test.ts proves it). On Node it uses native crypto for speed,
// found at run time, with identical answers (see ed25519.ts).
export { ed25519Verify } from './ed25519.ts';
export { verifyReceipt, type VerifiedReceipt, type ReceiptVerifyOptions } from './receipt-verify.ts';
export { verifyTicket, type VerifiedTicket, type TicketVerifyOptions, type MarketplaceKey } from './ticket-verify.ts';
export { verifyCheckpoint, parseCheckpoint, receiptLogOrigin, type VerifiedCheckpoint, type CheckpointKey } from './checkpoint.ts';
export { verifyInclusion, verifyConsistency, rootFromInclusion, leafHash, MerkleTree } from './merkle.ts';
export { verifyLog, verifyPriceLists, verifyCheckpointConsistency, ReceiptChain, checkCheckpoints, type LogSummary, type VerifyLogInput, type ChainLink } from './log-verify.ts';
export { verifyProofBundle, parseProofBundle, formatProofBundle, type ProofBundle } from './tlog-proof.ts';
export { verifyReceiptProof, type VerifiedReceiptProof } from './receipt-proof.ts';
export { openNote, parseVerifierKey } from './note.ts';
export { verifyEnvelope, parseEnvelope, pae, serializeEnvelope, type DsseEnvelope, type DsseKey } from './dsse.ts';
export { canonicalize, parseCanonical } from './canonical-json.ts';
export { parseUsd, formatUsd, computeCost } from './money.ts';
export { verifyPriceList, priceVersion, PriceBook, PRICELIST_PAYLOAD_TYPE, type PriceListPayload, type PriceListEntry, type PricedVersion } from './price-list.ts';
export { verifyRequestContract, contractVersion, REQUEST_CONTRACT_PAYLOAD_TYPE, CONTRACT_ENDPOINTS, type RequestContractPayload, type EndpointContract, type AttributeSpec } from './request-contract.ts';
export { RECEIPT_PAYLOAD_TYPE, GENESIS_PREV, type ReceiptPayload, type ReceiptStatus } from './receipt.ts';
export { TICKET_PAYLOAD_TYPE, type TicketPayload, type TicketRouting } from './ticket.ts';
export type { VerifyResult, VerifyError, VerifyErrorCode } from './result.ts';
