// Runs a runtime's generation to its end, keeping its chunks (tests of the runtime adapters).
import type { GeneratedChunk, GenerationResult } from '../../adapters/runtime-adapter.ts';

/** Reads `gen` to its end; `onChunk` sees each chunk as it comes. */
export async function drain(gen: AsyncGenerator<GeneratedChunk, GenerationResult, void>, onChunk?: (c: GeneratedChunk) => void): Promise<{ chunks: GeneratedChunk[]; result: GenerationResult }> {
  const chunks: GeneratedChunk[] = [];
  for (;;) {
    const n = await gen.next();
    if (n.done) return { chunks, result: n.value };
    chunks.push(n.value);
    onChunk?.(n.value);
  }
}
