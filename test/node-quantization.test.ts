// The quantization bucket buyers route on, and receipts sign, is the model file's own
// (general.file_type): left out of the config it is taken from the file; a config that names
// another is refused at start, naming the key (s29 review: an F32 file was advertised as q4-k-m,
// and any file as f32 when the key was left out).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { u32, type GgufKv } from '../adapters/gguf/gguf-writer.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { quantizationOfFileType } from '../adapters/gguf/file-type.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { startNode } from '../src/node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { testKey } from './helpers/receipts.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-quantization-'));
const market = testKey();
createKeyFile(path.join(home, 'node.key'));
/** Where the nodes' logs go (the test reads their status and start errors, not their lines). */
const quiet = fs.openSync('/dev/null', 'w');
afterAll(() => {
  fs.closeSync(quiet);
  fs.rmSync(home, { recursive: true, force: true });
});

/** The tiny model (F32 weights) with `general.file_type` set to `fileType`, or left out. */
function model(file: string, fileType: number | undefined): void {
  writeTinyLlama(path.join(home, file), {
    edit: (m) => {
      const md = m.metadata as GgufKv[];
      const at = md.findIndex((e) => e.key === 'general.file_type');
      if (fileType === undefined) md.splice(at, 1);
      else md[at] = { key: 'general.file_type', value: u32(fileType) };
    },
  });
}

const config = (file: string, quantization?: string) => {
  const yaml = tinyNodeConfigYaml({ publicKey: market.id }).replace(/^( {4}path: ).*$/m, `$1${path.join(home, file)}`);
  return parseConfig(quantization === undefined ? yaml : yaml.replace(/^( {4}path: .*)$/m, `$1\n    quantization: ${quantization}`), home);
};

const served = async (cfg: ReturnType<typeof parseConfig>): Promise<string> => {
  const node = await startNode(cfg, { logDestination: quiet });
  try {
    const status = (await (await fetch(`${node.opsUrl}/status`)).json()) as { models: { quantization: string }[] };
    return status.models[0]!.quantization;
  } finally {
    await node.stop(1000);
  }
};

test('llama.cpp\'s file types as buckets', () => {
  expect([0, 1, 7, 15, 18, 32, 30].map(quantizationOfFileType)).toEqual(['f32', 'f16', 'q8-0', 'q4-k-m', 'q6-k', 'bf16', 'iq4-xs']);
  expect(quantizationOfFileType(undefined)).toBeUndefined();
  expect(quantizationOfFileType(9999)).toBeUndefined();
});

test('left out, the bucket is the file\'s; the same value given is taken; another is refused naming the key; a file that says none needs the key', async () => {
  model('f32.gguf', 0);
  expect(await served(config('f32.gguf'))).toBe('f32');
  expect(await served(config('f32.gguf', 'F32'))).toBe('f32');
  await expect(startNode(config('f32.gguf', 'Q4_K_M'), { logDestination: quiet })).rejects.toThrow(/^models\[0\]\.quantization: "q4-k-m", but .*f32\.gguf is f32 \(its general\.file_type\)/);
  model('labelled.gguf', 15);
  expect(await served(config('labelled.gguf'))).toBe('q4-k-m');
  model('unlabelled.gguf', undefined);
  await expect(startNode(config('unlabelled.gguf'), { logDestination: quiet })).rejects.toThrow(/^models\[0\]\.quantization: .*unlabelled\.gguf does not say its quantization \(general\.file_type\): set the key$/);
  expect(await served(config('unlabelled.gguf', 'q8_0'))).toBe('q8-0');
}, 120_000);
