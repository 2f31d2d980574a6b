// A model file that changes while the embedded runtime loads and hashes it (a copy still being
// written, a file renamed over it) is refused: the hash would not be of the weights
// loaded, and every receipt would name it. The seam: the adapter hashes the file with its own read
// (fs.createReadStream, 4 MiB chunks), which starts after the file's identity was taken and ends
// before it is taken again; the file is changed as that read opens.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { LlamaModel } from 'node-llama-cpp';
import { afterAll, afterEach, beforeAll, describe, expect, test, vi } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';

const NOT_STARTED = { adapter: 'llama-embedded', version: '', modelSha256: '', contextLength: 0, embeddingLength: 0, chatTemplate: null };
const HASH_CHUNK = 1 << 22; // (the adapter's hashing read; llama.cpp's own reads are not through it)

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'model-load-change-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
afterEach(() => void vi.restoreAllMocks());

/** Runs `change(file)` as the adapter's hashing read of `file` is made (once). */
function changeWhileHashing(file: string, change: (file: string) => void): { changed: () => boolean } {
  const realRead = fs.createReadStream;
  let done = false;
  vi.spyOn(fs, 'createReadStream').mockImplementation(((p: fs.PathLike, o?: { highWaterMark?: number }) => {
    if (!done && String(p) === file && o?.highWaterMark === HASH_CHUNK) {
      done = true;
      change(file);
    }
    return realRead(p, o as never);
  }) as typeof fs.createReadStream);
  return { changed: () => done };
}

const sha256 = (file: string) => crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');

describe('the embedded runtime refuses a model file that changed while it was loaded and hashed', () => {
  test.each([
    ['still being written (it grows)', (f: string) => fs.appendFileSync(f, Buffer.alloc(64))],
    ['renamed over by another file', (f: string) => {
      const other = `${f}.new`;
      writeTinyLlama(other);
      fs.renameSync(other, f);
    }],
  ] as const)('%s: start() fails naming the file, the loaded model is released, and nothing is served; started again on the whole file, it serves that file\'s hash', async (name, change) => {
    const model = path.join(dir, `${name.split(' ')[0]}.gguf`);
    writeTinyLlama(model);
    const hook = changeWhileHashing(model, change);
    const dispose = vi.spyOn(LlamaModel.prototype, 'dispose');
    const rt = new LlamaEmbeddedAdapter({ modelPath: model, contextLength: 256 });
    await expect(rt.start()).rejects.toThrow(`model file ${model} changed while it was loaded and hashed: start again once it is complete`);
    expect(hook.changed()).toBe(true);
    expect(dispose).toHaveBeenCalledTimes(1); // the model llama.cpp had loaded is released
    expect(rt.info).toEqual(NOT_STARTED);
    expect(rt.modelFileState()).toBe('unchanged'); // (nothing loaded to compare with)
    await expect(rt.tokenize('hello')).rejects.toThrow('the embedded runtime is not started');
    vi.restoreAllMocks();
    // The file whole now: a new start hashes what it loads.
    await rt.start();
    try {
      expect(rt.info.modelSha256).toBe(sha256(model));
      expect(rt.modelFileState()).toBe('unchanged');
    } finally {
      await rt.stop();
    }
  });

  test('a file left as it was during the load is taken (the seam itself changes nothing)', async () => {
    const model = path.join(dir, 'still.gguf');
    writeTinyLlama(model);
    const hook = changeWhileHashing(model, () => undefined);
    const rt = new LlamaEmbeddedAdapter({ modelPath: model, contextLength: 256 });
    await rt.start();
    try {
      expect(hook.changed()).toBe(true);
      expect(rt.info.modelSha256).toBe(sha256(model));
    } finally {
      await rt.stop();
    }
  });
});

test('startNode: a model file still being copied in is a NodeStartError naming the model and the file, and nothing is left running', async () => {
  const home = fs.mkdtempSync(path.join(dir, 'node-'));
  createKeyFile(path.join(home, 'node.key'));
  const model = path.join(home, 'tiny.gguf');
  writeTinyLlama(model);
  const config = parseConfig(tinyNodeConfigYaml({ publicKey: '00'.repeat(32), context: 256, logLevel: 'fatal' }), home);
  changeWhileHashing(model, (f) => fs.appendFileSync(f, Buffer.alloc(64)));
  const e = await startNode(config, { runtimeOnThisThread: true }).then(() => undefined, (err: unknown) => err as Error);
  expect(e).toBeInstanceOf(NodeStartError);
  // (the file named once)
  expect(e?.message).toBe(`models: tiny/llama: the runtime could not start: model file ${model} changed while it was loaded and hashed: start again once it is complete`);
  vi.restoreAllMocks();
  // The data dir's lock was released: a start on the now-complete file succeeds.
  const node = await startNode(config, { runtimeOnThisThread: true });
  await node.stop(1000);
});
