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
import { readResponse } from '../src/p2p/request-stream.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { testKey } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';

const home = tempDir('node-stop-receipts-');
afterAll(() => removeTemp(home));

/** Makes the embedded runtime yield a token every 20 ms and, once stopped, take `endMs` to end; the original generate, to put back. */
function slowRuntime(endMs: number): typeof LlamaEmbeddedAdapter.prototype.generate {
  const generate = LlamaEmbeddedAdapter.prototype.generate;
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
      if (endMs > 0) await new Promise((r) => setTimeout(r, endMs));
      await inner.return(undefined as never);
    }
  } as typeof generate;
  return generate;
}

test('a request cancelled by the stop whose runtime takes 3 s to end still leaves its `cancelled` receipt in the log', async () => {
  const market = testKey();
  // A runtime that yields a token every 20 ms and, once stopped, takes 3 s to end.
  const generate = slowRuntime(3000);
  const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  try {
    const node = await startTinyNode(home, { publicKey: market.id }, { runtimeOnThisThread: true }); // (its runtime patched on this thread)
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

test('a stop past its grace: a stream ends with what was sent and its `cancelled` receipt; a whole body, none of it sent, ends `failed`, billing nothing (s30 review)', async () => {
  const market = testKey();
  // A runtime that yields a token every 20 ms: 300 tokens outlast the grace.
  const generate = slowRuntime(0);
  const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  const dir = path.join(home, 'both');
  try {
    const node = await startTinyNode(dir, { publicKey: market.id, slots: 2 }, { runtimeOnThisThread: true }); // (its runtime patched on this thread)
    const provider = node.providerId;
    const ask = (stream: boolean) => openPaid(buyer, node, market, { body: { model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 300, seed: 1, temperature: 1, stream } });
    const streamed = await ask(true);
    const whole = await ask(false);
    const frames = streamed.res.frames[Symbol.asyncIterator]();
    expect((await frames.next()).done).toBe(false); // streaming has begun
    expect((await whole.res.head).status).toBe(200); // (its run has begun too)
    const [, wholeRead] = await Promise.all([node.stop(200), readResponse(whole.res)]);
    let delivered = '';
    let trailer: Record<string, unknown> = {};
    for (let f = await frames.next(); !f.done; f = await frames.next()) {
      if (f.value.kind === 'data') delivered += Buffer.from(f.value.bytes).toString('utf8');
      else trailer = f.value.value;
    }
    const s = verifyReceipt(trailer.receipt as string, { provider });
    expect(s.ok && s.value.payload.status).toBe('cancelled');
    expect(s.ok && s.value.payload.usage.output_tokens).toBeGreaterThan(0);
    expect(delivered).toContain('"delta":{"content"');
    // The whole body: nothing sent, a `failed` receipt billing no output, the reason in the trailer.
    expect(wholeRead.body.length).toBe(0);
    const w = verifyReceipt(wholeRead.trailer.receipt as string, { provider });
    expect(w.ok && w.value.payload.status).toBe('failed');
    // Nothing billed: the node chose to stop, and the buyer got none of it (s30 review: the prompt was billed).
    expect(w.ok && [w.value.payload.usage, w.value.payload.cost_micro_usd]).toEqual([{ input_tokens: 0, output_tokens: 0 }, '0']);
    expect(wholeRead.trailer.error).toMatchObject({ code: 'node_stopping' });
  } finally {
    LlamaEmbeddedAdapter.prototype.generate = generate;
    await buyer.stop();
  }
}, 30_000);
