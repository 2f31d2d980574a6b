// The GGUF header check the embedded adapter runs before node-llama-cpp reads a model file: a file
// that is not a model, or claims more entries than it holds, is refused at once with a message
// naming the file, where node-llama-cpp would hang on some of them.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { checkGgufHeader, GgufHeaderError } from '../adapters/gguf/gguf-header.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gguf-header-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const file = (name: string, bytes: Uint8Array | string) => {
  const f = path.join(dir, name);
  fs.writeFileSync(f, bytes);
  return f;
};
function header(version: number, tensors: bigint, kvs: bigint, rest = 0): Buffer {
  const b = Buffer.alloc(24 + rest);
  b.write('GGUF', 0, 'latin1');
  b.writeUInt32LE(version, 4);
  b.writeBigUInt64LE(tensors, 8);
  b.writeBigUInt64LE(kvs, 16);
  return b;
}

describe('checkGgufHeader', () => {
  test('passes a real model and reports its counts', () => {
    const f = path.join(dir, 'tiny.gguf');
    writeTinyLlama(f);
    const h = checkGgufHeader(f);
    expect(h.version).toBe(3);
    expect(h.tensors).toBeGreaterThan(0n);
    expect(h.kvs).toBeGreaterThan(0n);
  });

  test.each([
    ['text.gguf', 'hello, this is a web page, not a model\n', /text\.gguf is not a GGUF model file \(it starts with "hell", not "GGUF"\)/],
    ['empty.gguf', '', /empty\.gguf is not a GGUF model file \(it starts with "", not "GGUF"\)/],
    ['short.gguf', 'GGUF\x03\x00', /short\.gguf is a truncated GGUF file \(6 bytes, shorter than its 24-byte header\)/],
    ['v9.gguf', header(9, 1n, 1n, 64), /v9\.gguf: GGUF version 9 is not supported \(2 or 3\)/],
    ['counts.gguf', header(3, 1000n, 2n, 64), /counts\.gguf: its GGUF header claims 1000 tensors and 2 metadata entries, more than its 88 bytes can hold/],
    ['huge.gguf', header(3, 0n, 2n ** 63n, 0), /claims 0 tensors and 9223372036854775808 metadata entries/],
  ])('refuses %s', (name, bytes, message) => {
    const f = file(name, bytes);
    expect(() => checkGgufHeader(f)).toThrow(GgufHeaderError);
    expect(() => checkGgufHeader(f)).toThrow(message);
  });

  test('a missing file is the file system error', () => {
    expect(() => checkGgufHeader(path.join(dir, 'nope.gguf'))).toThrow(/ENOENT/);
  });

  // This file hung node-llama-cpp's metadata reader (the start never returned).
  test('the embedded adapter refuses a 15-byte file starting "GGUF" at once', async () => {
    const f = file('not-really.gguf', 'GGUF not really');
    const a = new LlamaEmbeddedAdapter({ modelPath: f, contextLength: 256 });
    await expect(a.start()).rejects.toThrow(/not-really\.gguf is a truncated GGUF file \(15 bytes/);
    // Nothing was loaded: the adapter can start on a good model afterwards.
    const good = path.join(dir, 'good.gguf');
    writeTinyLlama(good);
    const b = new LlamaEmbeddedAdapter({ modelPath: good, contextLength: 256 });
    await b.start();
    await b.stop();
  }, 20_000);
});
