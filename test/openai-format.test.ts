import { describe, expect, test } from 'vitest';
import { CompletionStream } from '../src/serve/openai-format.ts';

const texts = ['', 'hello', ' world', 'quote " and \\ backslash', 'new\nline\ttab', 'ünïcödé 漢字 🎉', '\u0000\u001f', '\uD800 lone', '</script>'];

describe('CompletionStream.delta', () => {
  test('is byte for byte the JSON of the whole chunk object (chat and completions)', () => {
    for (const chat of [true, false]) {
      const s = new CompletionStream(chat, 'req-"1"', 'org/model "x"', 1_700_000_000);
      const base = { id: `${chat ? 'chatcmpl' : 'cmpl'}-req-"1"`, object: chat ? 'chat.completion.chunk' : 'text_completion', created: 1_700_000_000, model: 'org/model "x"' };
      for (const t of texts) {
        const choice = chat ? { index: 0, delta: { content: t }, finish_reason: null } : { index: 0, text: t, logprobs: null, finish_reason: null };
        const expected = `data: ${JSON.stringify({ ...base, choices: [choice] })}\n\n`;
        expect(new TextDecoder().decode(s.delta(t))).toBe(expected);
      }
    }
  });
});
