// A serving core on the real runtime for tests and benchmarks: the tiny model, a receipt log, the
// ticket gate and idempotency store in a temp folder, and one served model "tiny/llama".
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type Database from 'better-sqlite3';
import { LlamaEmbeddedAdapter } from '../../adapters/llama-embedded.ts';
import { writeTinyLlama } from '../../adapters/gguf/tiny-llama.ts';
import type { Rates } from '../../attestation/money.ts';
import { Admission } from '../../src/dispatch/admission.ts';
import { IdempotencyStore } from '../../src/dispatch/idempotency.ts';
import { TicketGate } from '../../src/dispatch/ticket-gate.ts';
import { FreeWorkPace } from '../../src/dispatch/free-work-pace.ts';
import { InferService, type ServedModel } from '../../src/serve/infer-service.ts';
import { ReceiptLog } from '../../src/store/receipt-log.ts';
import { openStateDb } from '../../src/store/state-db.ts';

export const TEST_RATES: Rates = { input_per_mtok: 150_000n, output_per_mtok: 600_000n };

export interface Serving {
  dir: string;
  adapter: LlamaEmbeddedAdapter;
  log: ReceiptLog;
  db: Database.Database;
  model: ServedModel;
  service: InferService;
  close(): Promise<void>;
}

export async function startServing(opts: { nodeSeed: Uint8Array; nodeId: string; marketId: string; slots?: number; contextLength?: number; logThreads?: number; chatTemplate?: string | null; priceVersion?: string }): Promise<Serving> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'serving-'));
  const modelPath = path.join(dir, 'tiny.gguf');
  writeTinyLlama(modelPath, opts.chatTemplate === undefined ? {} : { chatTemplate: opts.chatTemplate });
  const slots = opts.slots ?? 1;
  const adapter = new LlamaEmbeddedAdapter({ modelPath, slots, contextLength: opts.contextLength ?? 512 });
  await adapter.start();
  const log = ReceiptLog.open({ path: path.join(dir, 'receipts.db'), seed: opts.nodeSeed, threads: opts.logThreads ?? 0, checkpointIntervalMs: 0 });
  const db = openStateDb(path.join(dir, 'state.db'));
  const gate = new TicketGate({ db, marketplaceKeys: [{ publicKey: opts.marketId }], providerId: opts.nodeId });
  const model: ServedModel = { id: 'tiny/llama', adapter, admission: new Admission({ slots, queue: 4 }), quantization: 'f32', tokensPerSecond: 1000, rates: TEST_RATES };
  // Free work unpaced (share 1): how long a count takes depends on the machine's load, and the
  // tests of the pace give theirs a clock of their own.
  const service = new InferService({ log, gate, idempotency: new IdempotencyStore(db), models: new Map([[model.id, model]]), priceVersion: opts.priceVersion ?? 'p1', freePace: new FreeWorkPace({ share: 1 }) });
  return {
    dir,
    adapter,
    log,
    db,
    model,
    service,
    async close() {
      await log.close();
      db.close();
      await adapter.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
