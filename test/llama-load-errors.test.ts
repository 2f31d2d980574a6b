// Why llama.cpp refused a load (adapters/llama-load-errors.ts), with a stand-in binding: its log
// lines are kept and printed as before, a failed load names llama.cpp's reason (the tensors at
// fault first), one that said none keeps node-llama-cpp's own error, and loads run one at a time.
import type { Llama, LlamaModel } from 'node-llama-cpp';
import { expect, test } from 'vitest';
import { keepErrorLines, loadNamingWhy, sendLlamaLines } from '../adapters/llama-load-errors.ts';
import { namingModelFile } from '../adapters/llama-load-errors.ts';

/** A binding whose loads write `lines` to its logger, then fail with node-llama-cpp's error. */
function binding(lines: string[], events: string[] = []): { llama: Llama; printed: string[] } {
  const printed: string[] = [];
  const llama = {
    logger: (_level: unknown, message: string) => void printed.push(message),
    async loadModel({ modelPath }: { modelPath: string }): Promise<LlamaModel> {
      events.push(`start ${modelPath}`);
      for (const l of lines) llama.logger('error' as never, l);
      await new Promise((r) => setTimeout(r, 5));
      events.push(`end ${modelPath}`);
      throw new Error('Failed to load model');
    },
  } as unknown as Llama;
  return { llama: keepErrorLines(llama), printed };
}

test('a failed load names llama.cpp\'s reason; the lines are still printed', async () => {
  const lines = ["llama_model_load: error loading model: tensor 'output.weight' data is not within the file bounds, model is corrupted or incomplete", 'llama_model_load_from_file_impl: failed to load model'];
  const { llama, printed } = binding(lines);
  await expect(loadNamingWhy(llama, '/m/a.gguf', {})).rejects.toThrow("/m/a.gguf: llama.cpp could not load it: tensor 'output.weight' data is not within the file bounds, model is corrupted or incomplete");
  expect(printed).toEqual(lines);
  const nan = binding(["load_all_data: tensor 'blk.0.attn_norm.weight' has invalid data", 'llama_model_load: error loading model: found tensors with invalid data', 'llama_model_load_from_file_impl: failed to load model']);
  await expect(loadNamingWhy(nan.llama, '/m/b.gguf', {})).rejects.toThrow("/m/b.gguf: tensor 'blk.0.attn_norm.weight' holds NaN or infinite values (a corrupt file): llama.cpp refuses to load it");
});

test('a load whose lines say nothing keeps node-llama-cpp\'s error; loads run one at a time', async () => {
  const events: string[] = [];
  const { llama } = binding([], events);
  const both = await Promise.allSettled([loadNamingWhy(llama, 'x', {}), loadNamingWhy(llama, 'y', {})]);
  expect(both.map((r) => (r.status === 'rejected' ? (r.reason as Error).message : 'loaded'))).toEqual(['Failed to load model', 'Failed to load model']);
  expect(events).toEqual(['start x', 'end x', 'start y', 'end y']);
});

test('namingModelFile: a message naming the file says "model file" once; one that does not is left to the caller', () => {
  expect(namingModelFile('/m.gguf', '/m.gguf: not a GGUF file')).toBe('model file /m.gguf: not a GGUF file');
  expect(namingModelFile('/m.gguf', 'model file /m.gguf changed while it was loaded and hashed')).toBe('model file /m.gguf changed while it was loaded and hashed');
  expect(namingModelFile('/m.gguf', 'ENOENT: no such file')).toBeUndefined();
});

test('sent where sendLlamaLines says (the node\'s JSON log) instead of printed, until undone; still kept for the load\'s error', async () => {
  const lines = ["llama_model_load: error loading model: tensor 'x' data is not within the file bounds", 'llama_model_load_from_file_impl: failed to load model'];
  const { llama, printed } = binding(lines);
  const sent: string[] = [];
  const undo = sendLlamaLines((l) => sent.push(l));
  try {
    await expect(loadNamingWhy(llama, '/m/c.gguf', {})).rejects.toThrow("/m/c.gguf: llama.cpp could not load it: tensor 'x' data is not within the file bounds");
  } finally {
    undo();
  }
  expect([sent, printed]).toEqual([lines, []]);
  await expect(loadNamingWhy(llama, '/m/c.gguf', {})).rejects.toThrow(/could not load it/);
  expect(printed).toEqual(lines);
});
