// Reads a file line by line in bounded memory: a line longer than maxLine is reported, not buffered.
import fs from 'node:fs';

export type Line = { text: string; number: number } | { tooLong: true; number: number };

export async function* readLines(file: string, maxLine = 1 << 20): AsyncGenerator<Line> {
  const stream = fs.createReadStream(file, { highWaterMark: 1 << 20 });
  let carry: Buffer[] = [];
  let carryLen = 0;
  let skipping = false;
  let number = 0;
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl === -1) break;
      number++;
      if (skipping) {
        skipping = false;
        yield { tooLong: true, number };
      } else {
        const part = chunk.subarray(start, nl);
        const text = carryLen ? Buffer.concat([...carry, part]).toString('utf8') : part.toString('utf8');
        if (carryLen + part.length > maxLine) yield { tooLong: true, number };
        else yield { text, number };
      }
      carry = [];
      carryLen = 0;
      start = nl + 1;
    }
    if (start < chunk.length && !skipping) {
      carry.push(chunk.subarray(start));
      carryLen += chunk.length - start;
      if (carryLen > maxLine) {
        skipping = true;
        carry = [];
        carryLen = 0;
      }
    }
  }
  if (skipping) yield { tooLong: true, number: number + 1 };
  else if (carryLen) yield { text: Buffer.concat(carry).toString('utf8'), number: number + 1 };
}
