import crypto from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { fromBase64 } from '../attestation/bytes.ts';
import { verifyCheckpointConsistency } from '../attestation/log-verify.ts';
import { verifyReceiptProof } from '../attestation/receipt-proof.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { signPriceList, verifyPriceList } from '../attestation/price-list.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { LOG_PROTOCOL, serveLog } from '../src/p2p/log-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';

const dir = tempDir('p2p-log-');
let log: ReceiptLog;
let node: Host;
let client: Host;
let addr: string;
let prices: ReturnType<typeof signPriceList>;

beforeAll(async () => {
  const seed = new Uint8Array(crypto.randomBytes(32));
  log = ReceiptLog.open({ path: path.join(dir, 'r.db'), seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 10 });
  await Promise.all(Array.from({ length: 25 }, (_, i) => log.append(syntheticReceiptBody(i))));
  node = await createHost({ seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
  client = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  prices = signPriceList(seed, log.providerId, [{ model: 'tiny/llama', input_per_mtok: '150000', output_per_mtok: '600000' }]);
  await serveLog(node, log, (v) => (v === prices.payload.version ? serializeEnvelope(prices.envelope) : undefined));
  addr = node.getMultiaddrs()[0]!.toString();
});
afterAll(async () => {
  await client?.stop();
  await node?.stop();
  await log?.close();
  removeTemp(dir);
});

const ask = async (head: Record<string, unknown>) => {
  const r = await readResponse(await request(client, addr, LOG_PROTOCOL, head));
  return { status: r.head.status, text: Buffer.from(r.body).toString('utf8'), error: (r.trailer.error as { code: string } | undefined)?.code };
};

/** The request id of the synthetic receipt at `seq`. */
const rid = (seq: number): string => syntheticReceiptBody(seq).request_id;

describe('/service/log/1.0.0', () => {
  test('receipt by request id, verifiable', async () => {
    const r = await ask({ op: 'receipt', request_id: syntheticReceiptBody(7).request_id });
    expect(r.status).toBe(200);
    const { receipts } = JSON.parse(r.text) as { receipts: string[] };
    expect(receipts.length).toBe(1);
    expect(verifyReceipt(receipts[0]!, { provider: log.providerId })).toMatchObject({ ok: true, value: { payload: { seq: '7' } } });
  });
  test('checkpoint, inclusion bundle and consistency proof all verify offline', async () => {
    const cp = JSON.parse((await ask({ op: 'checkpoint' })).text) as { checkpoint: string; size: number };
    expect(cp.size).toBe(20);
    const bundle = await ask({ op: 'inclusion', request_id: rid(13) });
    expect(verifyReceiptProof(bundle.text)).toMatchObject({ ok: true, value: { index: 13 } });
    expect(bundle.text).toContain(`\n20\n`); // (under the latest checkpoint: size 20)
    // Under an older stored checkpoint, by its size.
    const under10 = await ask({ op: 'inclusion', request_id: rid(7), size: 10 });
    expect(verifyReceiptProof(under10.text)).toMatchObject({ ok: true, value: { index: 7 } });
    expect(under10.text).toContain(log.checkpoints().find((x) => x.size === 10)!.note);
    // seq and sizes also as decimal strings, as a receipt carries its seq.
    const asText = await ask({ op: 'inclusion', request_id: rid(13), seq: '13', size: '20' });
    expect(asText.text).toBe(bundle.text);
    expect(JSON.parse((await ask({ op: 'consistency', size1: '10', size2: '20' })).text)).toEqual(JSON.parse((await ask({ op: 'consistency', size1: 10, size2: 20 })).text));
    const c = JSON.parse((await ask({ op: 'consistency', size1: 10 })).text) as { proof: string[]; checkpoint: string };
    const older = log.checkpoints().find((x) => x.size === 10)!.note;
    expect(verifyCheckpointConsistency(older, c.checkpoint, c.proof.map((p) => fromBase64(p)!), log.providerId).ok).toBe(true);
  });
  test('the signed price list of a version: whoever holds a receipt checks its rates against what the provider signed', async () => {
    const r = await ask({ op: 'price_list', version: prices.payload.version });
    expect(r.status).toBe(200);
    const v = verifyPriceList((JSON.parse(r.text) as { price_list: never }).price_list, { provider: log.providerId });
    expect(v).toMatchObject({ ok: true, value: { version: prices.payload.version, models: [{ model: 'tiny/llama', output_per_mtok: '600000' }] } });
    expect(await ask({ op: 'price_list', version: 'p-00000000000000000000000000000000' })).toMatchObject({ status: 404, error: 'not_found' });
    for (const version of [undefined, 'p-1', '../prices/x', 7]) expect(await ask({ op: 'price_list', version }), String(version)).toMatchObject({ status: 400, error: 'invalid_request' });
  });

  test('bad and unknown asks get codes', async () => {
    expect(await ask({ op: 'receipt', request_id: 'nope' })).toMatchObject({ status: 404, error: 'not_found' });
    expect(await ask({ op: 'inclusion', request_id: rid(22) })).toMatchObject({ status: 404, error: 'not_found' }); // not under a checkpoint yet
    expect(await ask({ op: 'inclusion', request_id: rid(1), seq: -1 })).toMatchObject({ status: 400, error: 'invalid_request' });
    for (const seq of ['-1', '01', '1.0', ' 1', '99999999999999999999', '']) expect(await ask({ op: 'inclusion', request_id: rid(1), seq }), seq).toMatchObject({ status: 400, error: 'invalid_request' });
    expect(await ask({ op: 'inclusion', request_id: rid(1), size: 'ten' })).toMatchObject({ status: 400, error: 'invalid_request' });
    expect(await ask({ op: 'inclusion', request_id: rid(1), size: 15 })).toMatchObject({ status: 404, error: 'not_found' }); // no checkpoint of that size
    expect(await ask({ op: 'inclusion', request_id: rid(12), size: 10 })).toMatchObject({ status: 404, error: 'not_found' }); // not under it
    expect(await ask({ op: 'consistency', size1: 0 })).toMatchObject({ status: 400, error: 'invalid_request' });
    expect(await ask({ op: 'drop tables' })).toMatchObject({ status: 400, error: 'invalid_request' });
  });

  test('a receipt is read only by its request id: a peer that counts seqs gets none, nor its proof (s29 review: every receipt could be walked, and a short answer guessed against its response_sha256)', async () => {
    for (let seq = 0; seq < 3; seq++) {
      expect(await ask({ op: 'inclusion', seq }), String(seq)).toMatchObject({ status: 400, error: 'invalid_request' });
      expect(await ask({ op: 'receipt', seq }), String(seq)).toMatchObject({ status: 400, error: 'invalid_request' });
    }
    // A request id with another receipt's seq is not that receipt; an unknown one is nothing.
    expect(await ask({ op: 'inclusion', request_id: rid(3), seq: 4 })).toMatchObject({ status: 404, error: 'not_found' });
    expect(await ask({ op: 'inclusion', request_id: 'req-guessed' })).toMatchObject({ status: 404, error: 'not_found' });
    const own = await ask({ op: 'inclusion', request_id: rid(3), seq: 3 });
    expect(verifyReceiptProof(own.text)).toMatchObject({ ok: true, value: { index: 3, receipt: { payload: { request_id: rid(3) } } } });
  });
});
