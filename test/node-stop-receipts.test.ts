// A stop past its grace cancels the requests still running; a runtime can take a while to stop
// (the embedded one stops in milliseconds; an HTTP runtime may take seconds), and the cancelled
// request's receipt, billing what the buyer got, must still reach the log before the log closes.
import crypto from 'node:crypto';
import path from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { loadKeyFile } from '../src/identity.ts';
import { createHost } from '../src/p2p/host.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { openPaid } from './helpers/paid-ask.ts';
import { testKey } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';

const home = tempDir('node-stop-receipts-');
afterAll(() => removeTemp(home));

test('a request cancelled by the stop whose runtime takes 3 s to end still leaves its `cancelled` receipt in the log', async () => {
  const market = testKey();
  const generate = LlamaEmbeddedAdapter.prototype.generate;
  // A runtime that yields a token every 20 ms and, once stopped, takes 3 s to end.
  LlamaEmbeddedAdapter.prototype.generate = async function* (this: LlamaEmbeddedAdapter, req) {
    const inner = generate.call(this, req);
    try {
      for (;;) {
        const n = await inner.next();
        if (n.done) return n.value;
        yield n.value;
        await new Promise((r) => setTimeout(r, 20));
      }
    } finally {
      await new Promise((r) => setTimeout(r, 3000));
      await inner.return(undefined as never);
    }
  } as typeof generate;
  const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  try {
    const node = await startTinyNode(home, { publicKey: market.id });
    const { payload, res } = await openPaid(buyer, node, market, { body: { model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 300, seed: 1, temperature: 1, stream: true } });
    const frames = res.frames[Symbol.asyncIterator]();
    expect((await frames.next()).done).toBe(false); // streaming has begun
    await node.stop(200); // a grace far shorter than the answer
    const key = loadKeyFile(path.join(home, 'node.key'));
    const log = ReceiptLog.open({ path: path.join(home, 'data', 'receipts.db'), seed: key.seed, threads: 0, checkpointIntervalMs: 0 });
    try {
      const found = log.byRequestId(payload.request_id);
      expect(found).toHaveLength(1);
      expect(JSON.parse(Buffer.from(JSON.parse(found[0]!.line).payload, 'base64').toString('utf8'))).toMatchObject({ status: 'cancelled', request_id: payload.request_id });
    } finally {
      await log.close();
    }
  } finally {
    LlamaEmbeddedAdapter.prototype.generate = generate;
    await buyer.stop();
  }
}, 30_000);
