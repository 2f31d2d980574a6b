// A model whose weights hold NaN or infinity, or compute NaN from an ordinary prompt, answers every
// request with noise, billed. The embedded runtime refuses such a model at start: llama.cpp's own
// check of every weight as it loads (checkTensors), named by tensor, and two greedy tokens whose
// probabilities must be numbers (a rope_freqs tensor of zeros passes the first and fails this).
// The node's start names the model and the file.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { u32, type GgufF32Tensor } from '../adapters/gguf/gguf-writer.ts';
import { writeTinyLlama, type TinyLlamaOptions } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'model-weights-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

type Edit = NonNullable<TinyLlamaOptions['edit']>;
const tensor = (m: { tensors: GgufF32Tensor[] }, name: string): Float32Array => m.tensors.find((t) => t.name === name)!.data;

/** Starts an adapter on the tiny model changed by `edit`; resolves with the start's error (undefined: it started, and is stopped again). */
async function startError(name: string, edit: Edit): Promise<Error | undefined> {
  const file = path.join(dir, `${name}.gguf`);
  writeTinyLlama(file, { edit });
  const adapter = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256 });
  try {
    await adapter.start();
  } catch (e) {
    return e as Error;
  }
  await adapter.stop();
  return undefined;
}

test.each<[string, Edit, RegExp]>([
  ['a NaN in a norm', (m) => void (tensor(m, 'output_norm.weight')[3] = Number.NaN), /tensor 'output_norm\.weight' holds NaN or infinite values \(a corrupt file\): llama\.cpp refuses to load it$/],
  ['infinity in the embeddings', (m) => void tensor(m, 'token_embd.weight').fill(Number.POSITIVE_INFINITY, 640, 700), /tensor 'token_embd\.weight' holds NaN or infinite values/],
  ['a rope_freqs tensor of NaN', (m) => void m.tensors.push({ name: 'rope_freqs.weight', dims: [8], data: new Float32Array(8).fill(Number.NaN) }), /tensor 'rope_freqs\.weight' holds NaN or infinite values/],
  ['a rope_freqs tensor of zeros (every value finite)', (m) => void m.tensors.push({ name: 'rope_freqs.weight', dims: [8], data: new Float32Array(8) }), /the model computes NaN \(not a number\) for an ordinary prompt, so its every answer would be noise/],
  // NaN logits make greedy sampling pick token 0, which ends the answer where it is the end token
  // (GPT-NeoX, MPT, StarCoder, RWKV vocabularies): the check must see that first token too (s21 h1).
  [
    'a rope_freqs tensor of zeros, token 0 the end token',
    (m) => {
      m.tensors.push({ name: 'rope_freqs.weight', dims: [8], data: new Float32Array(8) });
      const i = m.metadata.findIndex((k) => k.key === 'tokenizer.ggml.eos_token_id');
      m.metadata[i] = { key: 'tokenizer.ggml.eos_token_id', value: u32(0) };
    },
    /the model computes NaN \(not a number\) for an ordinary prompt/,
  ],
])('%s: refused at start, naming the file and why', async (name, edit, why) => {
  const e = await startError(name.replaceAll(' ', '-'), edit);
  expect(e?.message).toMatch(why);
  expect(e?.message).toContain(path.join(dir, name.replaceAll(' ', '-')));
});

test('sound weights start: a rope_freqs tensor of ones, norms of zeros (a flat, finite distribution)', async () => {
  expect(await startError('rope-ones', (m) => void m.tensors.push({ name: 'rope_freqs.weight', dims: [8], data: new Float32Array(8).fill(1) }))).toBeUndefined();
  expect(await startError('zero-norm', (m) => void tensor(m, 'output_norm.weight').fill(0))).toBeUndefined();
});

test('the node refuses to start on such a model: a NodeStartError naming the model and the tensor', async () => {
  const home = path.join(dir, 'node');
  fs.mkdirSync(home);
  createKeyFile(path.join(home, 'node.key'));
  writeTinyLlama(path.join(home, 'tiny.gguf'), { edit: (m) => void (tensor(m, 'blk.1.ffn_down.weight')[100] = Number.NEGATIVE_INFINITY) });
  const e = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'fatal' }), home), { runtimeOnThisThread: true }).then(
    async (n) => {
      await n.stop(1000);
      return undefined;
    },
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(NodeStartError);
  expect((e as Error).message).toBe(`models: tiny/llama: the runtime could not start: model file ${path.join(home, 'tiny.gguf')}: tensor 'blk.1.ffn_down.weight' holds NaN or infinite values (a corrupt file): llama.cpp refuses to load it`);
});
