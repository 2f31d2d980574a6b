// The embedded runtime when a start fails: a missing or corrupt model file fails start() with an error
// that says so, the adapter stays "not started" (stop() is harmless), and nothing of the failure is
// remembered: another adapter in the same process (same llama.cpp binding) starts, and the failed one
// starts once its file is fixed. The binding itself is cached per GPU setting, except a binding that
// failed to load (adapters/llama-embedded.ts, llamaFor): that one is asked for again at the next start.
// Last, a start that fails after the model loaded (its context does not fit), on its own and under
// startNode (the model it loaded is released), and what startNode says about a corrupt model file
// (the model id and the file).
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { InsufficientMemoryError, LlamaModel, type LlamaContextOptions } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import type { GenerateRequest } from '../adapters/runtime-adapter.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { startNode } from '../src/node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-embedded-restart-'));
const goodPath = path.join(dir, 'good.gguf');
let good: Buffer;
const sha256 = (b: Uint8Array): string => crypto.createHash('sha256').update(b).digest('hex');

beforeAll(() => {
  writeTinyLlama(goodPath);
  good = fs.readFileSync(goodPath);
});
afterAll(() => {
  fs.rmSync(dir, { recursive: true, force: true });
});

const REQ: GenerateRequest = { input: { kind: 'prompt', prompt: 'hello world' }, maxTokens: 8, sampling: { temperature: 0.8, seed: 5 } };

/** The token ids of a whole generation, and its result. */
async function generateIds(rt: LlamaEmbeddedAdapter, req: GenerateRequest = REQ): Promise<{ ids: number[]; outputTokens: number; finishReason: string }> {
  const ids: number[] = [];
  const gen = rt.generate(req);
  for (;;) {
    const n = await gen.next();
    if (n.done) return { ids, outputTokens: n.value.outputTokens, finishReason: n.value.finishReason };
    ids.push(...n.value.tokens);
  }
}

const NOT_STARTED = { adapter: 'llama-embedded', version: '', modelSha256: '', contextLength: 0, embeddingLength: 0, chatTemplate: null };

/** What a failed start must leave: the initial info, calls refused as "not started", a stop() that resolves. */
async function expectNotStarted(rt: LlamaEmbeddedAdapter): Promise<void> {
  expect(rt.info).toEqual(NOT_STARTED);
  await expect(rt.tokenize('hello')).rejects.toThrow('the embedded runtime is not started');
  await expect(rt.countInputTokens({ kind: 'prompt', prompt: 'hello' })).rejects.toThrow('the embedded runtime is not started');
  await expect(rt.generate(REQ).next()).rejects.toThrow('the embedded runtime is not started');
  await rt.stop();
  await rt.stop();
  expect(rt.info).toEqual(NOT_STARTED);
}

function nodeHome(model: Uint8Array): ReturnType<typeof parseConfig> {
  const home = fs.mkdtempSync(path.join(dir, 'node-'));
  createKeyFile(path.join(home, 'node.key'));
  fs.writeFileSync(path.join(home, 'tiny.gguf'), model);
  return parseConfig(tinyNodeConfigYaml({ publicKey: '00'.repeat(32), context: 256, logLevel: 'fatal' }), home);
}

describe('LlamaEmbeddedAdapter: failed starts', () => {
  test('stop() on an adapter never started resolves (twice) and leaves it not started', async () => {
    const rt = new LlamaEmbeddedAdapter({ modelPath: path.join(dir, 'never.gguf') });
    await rt.stop();
    await expectNotStarted(rt);
  });

  test('a missing model file fails start() with ENOENT naming the file; the adapter stays not started', async () => {
    const missing = path.join(dir, 'missing.gguf');
    const rt = new LlamaEmbeddedAdapter({ modelPath: missing, contextLength: 256 });
    const err = await rt.start().then(() => undefined, (e: unknown) => e as NodeJS.ErrnoException);
    expect(err).toBeInstanceOf(Error);
    expect(err!.code).toBe('ENOENT');
    expect(err!.message).toContain(missing);
    await expectNotStarted(rt);
  });

  test('a file that is not GGUF (empty, or another format) fails start() on the GGUF magic, before llama.cpp reads it', async () => {
    for (const [name, bytes] of [
      ['empty.gguf', new Uint8Array(0)],
      ['not-gguf.gguf', new TextEncoder().encode('{"this": "is json, not a model"}'.repeat(64))],
    ] as const) {
      const file = path.join(dir, name);
      fs.writeFileSync(file, bytes);
      const rt = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256 });
      await expect(rt.start()).rejects.toThrow(new RegExp(`${name} is (?:not a GGUF model file \\(it starts with .*, not "GGUF"\\)|empty \\(0 bytes\\), not a GGUF model file)`));
      await expectNotStarted(rt);
    }
  });

  test('a truncated GGUF (valid header, tensors cut short) fails start(), in the header check or in llama.cpp', async () => {
    for (const [name, bytes, message] of [
      // cut inside the metadata: fewer bytes than the header's counts need (checkGgufFile)
      ['head.gguf', good.subarray(0, 200), /head\.gguf: its GGUF header claims \d+ tensors and \d+ metadata entries, more than its 200 bytes can hold/],
      // metadata whole, tensor data cut: llama.cpp's reason (node-llama-cpp says only "Failed to load model")
      ['half.gguf', good.subarray(0, good.length >> 1), /half\.gguf: llama\.cpp could not load it: tensor 'output\.weight' data is not within the file bounds, model is corrupted or incomplete$/],
      ['short.gguf', good.subarray(0, good.length - 100), /short\.gguf: llama\.cpp could not load it: tensor 'blk\.1\.ffn_up\.weight' data is not within the file bounds/], // only the end of the last tensor missing
    ] as const) {
      const file = path.join(dir, name);
      fs.writeFileSync(file, bytes);
      const rt = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256 });
      await expect(rt.start(), name).rejects.toThrow(message);
      await expectNotStarted(rt);
    }
  });

  test('after failed starts, another adapter in the same process starts on a valid model and generates', async () => {
    const bad = new LlamaEmbeddedAdapter({ modelPath: path.join(dir, 'also-missing.gguf') });
    await expect(bad.start()).rejects.toThrow(/ENOENT/);
    const rt = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 });
    await rt.start();
    try {
      expect(rt.info.modelSha256).toBe(sha256(good));
      expect(rt.info.contextLength).toBe(256);
      const a = await generateIds(rt);
      expect(a).toMatchObject({ outputTokens: 8, finishReason: 'length' });
      expect(a.ids.length).toBe(8);
      expect((await generateIds(rt)).ids).toEqual(a.ids); // seeded: the same tokens again
      // The failed adapter is still harmless beside it.
      await bad.stop();
      expect((await generateIds(rt)).ids).toEqual(a.ids);
    } finally {
      await rt.stop();
    }
  });

  test('the adapter that failed starts once its file is fixed, and serves the fixed file', async () => {
    const file = path.join(dir, 'fixed-later.gguf');
    fs.writeFileSync(file, good.subarray(0, good.length >> 1));
    const rt = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256 });
    await expect(rt.start()).rejects.toThrow(/fixed-later\.gguf: llama\.cpp could not load it: tensor '.*' data is not within the file bounds/);
    await expect(rt.start()).rejects.toThrow(/fixed-later\.gguf: llama\.cpp could not load it: tensor '.*' data is not within the file bounds/); // still broken: fails again, the same way
    expect(rt.info).toEqual(NOT_STARTED);
    fs.writeFileSync(file, good);
    await rt.start();
    const reference = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 });
    await reference.start();
    try {
      expect(rt.info.modelSha256).toBe(sha256(good));
      expect(rt.info.embeddingLength).toBe(64);
      expect(rt.info.version).toMatch(/^node-llama-cpp\/\d+\.\d+\.\d+\/prebuilt\/cpu$/); // (its version, build, device)
      const mine = await generateIds(rt);
      expect(mine).toMatchObject({ outputTokens: 8, finishReason: 'length' });
      expect(mine.ids).toEqual((await generateIds(reference)).ids);
    } finally {
      await reference.stop();
      await rt.stop();
    }
    // Stopped for good: refused again, and a second stop is harmless.
    await expect(rt.tokenize('hello')).rejects.toThrow('the embedded runtime is not started');
    await rt.stop();
  });

  // A model file that exists but is corrupt (a truncated download): the error names the model and
  // the file, as a missing file's does.
  test('startNode fails on a model file that exists but is corrupt, naming the model and the file', async () => {
    // (this thread: the process has loaded the binding here already, and llama.cpp's lines go to one binding)
    const e = await startNode(nodeHome(good.subarray(0, good.length >> 1)), { runtimeOnThisThread: true }).then(
      () => undefined,
      (err: unknown) => err as Error,
    );
    expect(e).toBeInstanceOf(Error);
    expect(e!.message).toMatch(/^models: tiny\/llama: the runtime could not start: model file .*tiny\.gguf: llama\.cpp could not load it: tensor '.*' data is not within the file bounds/);
    expect(e!.message).toContain('tiny/llama');
    expect(e!.message).toContain('tiny.gguf');
  });

  test('start() on a started (or starting) adapter is refused (its model stays as it was); slots must be a positive integer', async () => {
    const rt = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 });
    await rt.start();
    try {
      await expect(rt.start()).rejects.toThrow('already started');
      expect(await generateIds(rt)).toMatchObject({ outputTokens: 8 });
    } finally {
      await rt.stop();
    }
    // A hash the caller already has (audit replay) is taken as the model's, not worked out again.
    const known = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256, modelSha256: 'ab'.repeat(32) });
    await known.start();
    expect(known.info.modelSha256).toBe('ab'.repeat(32));
    await known.stop();
    // Two starts at once: the second is refused while the first loads, and the first succeeds.
    const both = [rt.start(), rt.start()];
    await expect(both[1]).rejects.toThrow('already started');
    await both[0];
    expect(await generateIds(rt)).toMatchObject({ outputTokens: 8 });
    await rt.stop();
    for (const slots of [0, 1.5, -1]) {
      await expect(new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256, slots }).start()).rejects.toThrow(`slots must be a positive integer, not ${slots}`);
    }
  });

  test('a stopped adapter starts again with all its slots', async () => {
    const rt = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256, slots: 2 });
    await rt.start();
    const first = await generateIds(rt);
    await rt.stop();
    await expect(rt.generate(REQ).next()).rejects.toThrow('the embedded runtime is not started');
    await rt.start();
    try {
      // Two slots again, not two left over from the first start plus two new ones, nor none.
      const g1 = rt.generate(REQ);
      const g2 = rt.generate(REQ);
      await g1.next();
      await g2.next();
      await expect(rt.generate(REQ).next()).rejects.toThrow(/no free slot/);
      await g1.return(undefined as never);
      await g2.return(undefined as never);
      expect((await generateIds(rt)).ids).toEqual(first.ids);
    } finally {
      await rt.stop();
    }
  });
});

describe('LlamaEmbeddedAdapter: the llama.cpp binding cache', () => {
  test('a binding that failed to load is not remembered: the next start asks again; a loaded one is reused', async () => {
    // A fresh copy of the adapter module (its own binding cache) over a node-llama-cpp whose first
    // getLlama() fails, as it does when no binary fits the host; later calls reach the real one.
    vi.resetModules();
    const calls: unknown[] = [];
    vi.doMock('node-llama-cpp', async (importOriginal) => {
      const real = await importOriginal<typeof import('node-llama-cpp')>();
      return {
        ...real,
        getLlama: async (...args: Parameters<typeof real.getLlama>) => {
          calls.push(args[0]);
          if (calls.length === 1) throw new Error('no prebuilt llama.cpp binary for this host');
          return real.getLlama(...args);
        },
      };
    });
    const adapters: InstanceType<typeof LlamaEmbeddedAdapter>[] = [];
    try {
      const fresh = await import('../adapters/llama-embedded.ts');
      expect(fresh.LlamaEmbeddedAdapter).not.toBe(LlamaEmbeddedAdapter);
      const rt = new fresh.LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 });
      adapters.push(rt);
      await expect(rt.start()).rejects.toThrow('no prebuilt llama.cpp binary for this host');
      expect(calls.length).toBe(1);
      expect(rt.info).toEqual(NOT_STARTED);
      await rt.stop();

      // The failure was not cached: the same adapter's next start loads the binding and the model.
      await rt.start();
      expect(calls.length).toBe(2);
      expect(rt.info.modelSha256).toBe(sha256(good));
      expect(await generateIds(rt)).toMatchObject({ outputTokens: 8 });

      // A loaded binding is cached: two more adapters (the same setting: auto, the default) share it.
      const more = [new fresh.LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 }), new fresh.LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256, gpu: 'auto' })];
      adapters.push(...more);
      await Promise.all(more.map((a) => a.start()));
      expect(calls.length).toBe(2);
      const ids = (await generateIds(rt)).ids;
      for (const a of more) expect((await generateIds(a)).ids).toEqual(ids);
      // Every call asked for the GPU when there is one (this host has none: the CPU), never a build.
      for (const c of calls) expect(c).toMatchObject({ gpu: 'auto', build: 'never' });
    } finally {
      for (const a of adapters) await a.stop();
      vi.doUnmock('node-llama-cpp');
      vi.resetModules();
    }
  });

  test('concurrent starts while the binding is loading share one load, and share its failure', async () => {
    vi.resetModules();
    let calls = 0;
    let fail!: (e: Error) => void;
    vi.doMock('node-llama-cpp', async (importOriginal) => {
      const real = await importOriginal<typeof import('node-llama-cpp')>();
      return {
        ...real,
        getLlama: (...args: Parameters<typeof real.getLlama>) => {
          calls++;
          if (calls === 1) return new Promise((_resolve, reject) => (fail = reject));
          return real.getLlama(...args);
        },
      };
    });
    const adapters: InstanceType<typeof LlamaEmbeddedAdapter>[] = [];
    try {
      const fresh = await import('../adapters/llama-embedded.ts');
      for (let i = 0; i < 3; i++) adapters.push(new fresh.LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 }));
      const starts = adapters.map((a) => a.start().then(() => 'started', (e: Error) => e.message));
      await vi.waitFor(() => expect(fail).toBeTypeOf('function'));
      fail(new Error('binding failed'));
      expect(await Promise.all(starts)).toEqual(['binding failed', 'binding failed', 'binding failed']);
      expect(calls).toBe(1);
      // All three retry together: one new load, all started.
      expect(await Promise.all(adapters.map((a) => a.start().then(() => 'started')))).toEqual(['started', 'started', 'started']);
      expect(calls).toBe(2);
    } finally {
      for (const a of adapters) await a.stop();
      vi.doUnmock('node-llama-cpp');
      vi.resetModules();
    }
  });
});

/**
 * Makes the next createContext() on a loaded model fail as node-llama-cpp does when the context does
 * not fit in memory; `models` receives the model it was called on (loaded, by then).
 */
function failNextContext(): { models: LlamaModel[]; restore(): void } {
  const models: LlamaModel[] = [];
  const real = LlamaModel.prototype.createContext;
  const spy = vi.spyOn(LlamaModel.prototype, 'createContext').mockImplementationOnce(async function (this: LlamaModel, _opts?: LlamaContextOptions) {
    models.push(this);
    throw new InsufficientMemoryError('A context size of 256 is too large for the available RAM');
  });
  return {
    models,
    restore: () => {
      spy.mockRestore();
      expect(LlamaModel.prototype.createContext).toBe(real);
    },
  };
}

describe('LlamaEmbeddedAdapter: a start that fails after the model loaded', () => {
  test('the failed start releases the model it loaded itself; stop() after it is harmless, and the next start succeeds', async () => {
    const rt = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 });
    const fail = failNextContext();
    try {
      await expect(rt.start()).rejects.toThrow(InsufficientMemoryError);
    } finally {
      fail.restore();
    }
    expect(fail.models.length).toBe(1);
    const [loaded] = fail.models;
    // Released by start() itself, before anyone calls stop().
    expect(loaded!.disposed).toBe(true);
    expect(rt.info).toEqual(NOT_STARTED);
    await expect(rt.tokenize('hello')).rejects.toThrow('the embedded runtime is not started');
    await rt.stop();
    await rt.start();
    try {
      expect(rt.info.modelSha256).toBe(sha256(good));
      expect(await generateIds(rt)).toMatchObject({ outputTokens: 8, finishReason: 'length' });
    } finally {
      await rt.stop();
    }
  });

  test('a model file that cannot be hashed once the model loaded: the start fails and releases the model', async () => {
    const realRead = fs.createReadStream;
    // Only the adapter's own hashing read (4 MiB chunks) fails; llama.cpp's reads go through.
    const read = vi.spyOn(fs, 'createReadStream').mockImplementation(((file: fs.PathLike, opts?: { highWaterMark?: number }) => {
      const stream = realRead(file, opts as never);
      if (opts?.highWaterMark === 1 << 22) process.nextTick(() => stream.destroy(Object.assign(new Error('EIO: i/o error, read'), { code: 'EIO' })));
      return stream;
    }) as typeof fs.createReadStream);
    const dispose = vi.spyOn(LlamaModel.prototype, 'dispose');
    const rt = new LlamaEmbeddedAdapter({ modelPath: goodPath, contextLength: 256 });
    try {
      await expect(rt.start()).rejects.toThrow('EIO');
    } finally {
      read.mockRestore();
    }
    try {
      expect(dispose).toHaveBeenCalledTimes(1);
      expect(rt.info).toEqual(NOT_STARTED);
      await expect(rt.tokenize('hello')).rejects.toThrow('the embedded runtime is not started');
    } finally {
      dispose.mockRestore();
    }
  });

  const leftLoaded: LlamaModel[] = [];
  afterAll(async () => {
    for (const m of leftLoaded) if (!m.disposed) await m.dispose(); // (only if the release failed)
  });

  // A context that does not fit (context x slots too large for the RAM/VRAM): the model the start
  // loaded (gigabytes, for a real model) is released, not left loaded in the process.
  test('startNode fails when the context of a loaded model cannot be created, naming the model, and releases the model', async () => {
    const fail = failNextContext();
    try {
      const e = await startNode(nodeHome(good), { runtimeOnThisThread: true }).then(() => undefined, (err: unknown) => err as Error);
      expect(e?.cause).toBeInstanceOf(InsufficientMemoryError);
      expect(e?.message).toMatch(/^models: tiny\/llama: the runtime could not start on model file .*tiny\.gguf: /);
    } finally {
      fail.restore();
    }
    expect(fail.models.length).toBe(1);
    leftLoaded.push(...fail.models);
    expect(fail.models[0]!.disposed).toBe(true);
  });

});
