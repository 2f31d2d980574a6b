// seller-node as a library: the node-side pieces (the verifier is `seller-node/verifier`).
export { ReceiptLog, ReceiptLogError, type ReceiptLogOptions, type AppendedReceipt, type StoredCheckpoint } from './store/receipt-log.ts';
export { exportLog, type ExportSummary } from './store/export.ts';
export { audit, type AuditReport, type AuditFault, type AuditOptions } from './audit/audit.ts';
export { createKeyFile, loadKeyFile, identityFromSeed, type NodeIdentity } from './identity.ts';
