// A model whose chat template does not finish (a loop of 10^8 steps: it held a serving node for
// ever, SIGTERM included) is refused when it loads, naming the file; a template that finishes, or
// refuses a conversation (raise_exception), is served as before.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { ChatTemplateError, probeChatTemplate } from '../adapters/chat-template-probe.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'template-probe-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const tokens = { bos: '<s>', eos: '</s>' };
const CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

describe('probeChatTemplate', () => {
  test('an ordinary template, and one that refuses a system message, pass', async () => {
    await probeChatTemplate(CHATML, tokens);
    await probeChatTemplate("{% if messages[0].role == 'system' %}{{ raise_exception('no system messages') }}{% endif %}" + CHATML, tokens);
  });

  test('a template that does not finish in time is refused', async () => {
    const nested = '{% for i in range(5000) %}{% for j in range(5000) %}{% endfor %}{% endfor %}' + CHATML;
    await expect(probeChatTemplate(nested, tokens, { timeoutMs: 300 })).rejects.toThrow(ChatTemplateError);
    await expect(probeChatTemplate(nested, tokens, { timeoutMs: 300 })).rejects.toThrow('its chat template did not finish rendering a two-turn conversation within 0.3 s: it would hold the node on every chat request');
  });

  test('a template that takes more memory than allowed is refused', async () => {
    await expect(probeChatTemplate('{% for i in range(100000000) %}{% endfor %}' + CHATML, tokens, { timeoutMs: 20_000, heapMb: 64 })).rejects.toThrow(/its chat template (used more than 64 MB|did not finish)/);
  });
});

test('the embedded runtime refuses a model whose template does not finish, naming the file; the node can start another', async () => {
  const bad = path.join(dir, 'loop.gguf');
  writeTinyLlama(bad, { chatTemplate: '{% for i in range(5000) %}{% for j in range(5000) %}{% endfor %}{% endfor %}' + CHATML });
  const a = new LlamaEmbeddedAdapter({ modelPath: bad, contextLength: 256, templateProbe: { timeoutMs: 300 } });
  await expect(a.start()).rejects.toThrow(/loop\.gguf: its chat template did not finish rendering/);
  const good = path.join(dir, 'good.gguf');
  writeTinyLlama(good);
  const b = new LlamaEmbeddedAdapter({ modelPath: good, contextLength: 256 });
  await b.start();
  expect(await b.renderChat([{ role: 'user', content: 'hi' }])).toContain('hi');
  await b.stop();
}, 30_000);
