// The tokenizer's child process (tokenizer-process.ts): the model's vocabulary alone (no weights),
// tokenising long texts off the node's event loop. llama.cpp's tokenizer is synchronous and, on
// some texts, quadratic (runs of characters without a token of their own, many special-token
// texts): here it holds only this process, which the node kills past a deadline. Large chats are
// rendered with the model's chat template here too (the same Jinja library as the node's): a
// template's work grows with the messages (s26: 8 MiB of empty messages held the node 1.5 s).
import { Template } from '@huggingface/jinja';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';

interface Tokenize {
  id: number;
  /** The text in pieces, each tokenised on its own (cut where llama.cpp cuts: special-token-split.ts). */
  pieces: string[];
  special: boolean;
}

interface Render {
  id: number;
  render: { template: string; messages: unknown[]; bos: string; eos: string };
}

const send = (m: unknown) => process.send?.(m);
// The node went (stopped, killed): nothing waits for this process.
process.on('disconnect', () => process.exit(0));

/** The template last rendered with, parsed once. */
let parsed: { source: string; template: Template } | undefined;

function render(r: Render['render']): string {
  if (parsed?.source !== r.template) parsed = { source: r.template, template: new Template(r.template) };
  return parsed.template.render({ messages: r.messages, add_generation_prompt: true, bos_token: r.bos, eos_token: r.eos });
}

try {
  const modelPath = process.argv[2];
  if (!modelPath) throw new Error('usage: tokenizer-child MODEL');
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error, progressLogs: false });
  const model = await llama.loadModel({ modelPath, vocabOnly: true });
  process.on('message', (m: Tokenize | Render) => {
    if ('render' in m) {
      try {
        send({ id: m.id, text: render(m.render) });
      } catch (e) {
        // The template refused these messages (raise_exception, a shape it cannot handle).
        send({ id: m.id, refused: e instanceof Error ? e.message : String(e) });
      }
      return;
    }
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
