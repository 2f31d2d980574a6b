// Child process for the durability test: appends receipts and prints each seq the moment its
// append resolves. The parent kills it with SIGKILL mid-run.
import { ReceiptLog } from '../../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../../src/store/synthetic.ts';

const [file, seedHex] = process.argv.slice(2);
const log = ReceiptLog.open({ path: file!, seed: Uint8Array.from(Buffer.from(seedHex!, 'hex')), checkpointEvery: 50, checkpointIntervalMs: 0 });
for (let i = 0; ; i++) {
  const batch = [];
  for (let j = 0; j < 64; j++) batch.push(log.append(syntheticReceiptBody(i * 64 + j)).then((r) => process.stdout.write(`${r.seq}\n`)));
  await Promise.all(batch);
}
