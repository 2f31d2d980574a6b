// The tokenizer's child process (tokenizer-process.ts): the model's vocabulary alone (no weights),
// tokenising long texts off the node's event loop. llama.cpp's tokenizer is synchronous and, on
// some texts, quadratic (runs of characters without a token of their own, many special-token
// texts): here it holds only this process, which the node kills past a deadline.
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';

interface Ask {
  id: number;
  /** The text in pieces, each tokenised on its own (cut where llama.cpp cuts: special-token-split.ts). */
  pieces: string[];
  special: boolean;
}

const send = (m: unknown) => process.send?.(m);
// The node went (stopped, killed): nothing waits for this process.
process.on('disconnect', () => process.exit(0));

try {
  const modelPath = process.argv[2];
  if (!modelPath) throw new Error('usage: tokenizer-child MODEL');
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, progressLogs: false });
  const model = await llama.loadModel({ modelPath, vocabOnly: true });
  process.on('message', (m: Ask) => {
    try {
      const out: number[] = [];
      for (const piece of m.pieces) for (const t of model.tokenize(piece, m.special)) out.push(t);
      send({ id: m.id, tokens: Int32Array.from(out) });
    } catch (e) {
      send({ id: m.id, error: e instanceof Error ? e.message : String(e) });
    }
  });
  send({ ready: true });
} catch (e) {
  send({ ready: false, error: e instanceof Error ? e.message : String(e) });
  process.exitCode = 1;
  process.disconnect?.();
}
