// A model's chat template is a program (Jinja) that the node runs for every chat request, on its
// event loop. One that does not end (a loop of 10^8 steps) held a serving node for ever, SIGTERM
// included, and grew it to 2.3 GB (session 17, h6). Before a model is served, its template renders
// a few ordinary conversations in a child process with a time and a heap bound (a worker thread
// is not enough: V8 aborts the whole process when a worker's heap runs out on a huge array); one
// that does not finish within them is refused, naming what it did. A template that refuses a
// conversation (raise_exception: many refuse a system message) is fine: buyers get that refusal
// as a 400.
import { spawn } from 'node:child_process';

const PROBES = [
  [{ role: 'user', content: 'hello' }],
  [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello' }, { role: 'assistant', content: 'hi' }, { role: 'user', content: 'and again' }],
];

const CHILD = `
let input = '';
process.stdin.setEncoding('utf8');
for await (const chunk of process.stdin) input += chunk;
const w = JSON.parse(input);
const { Template } = await import(w.jinja);
const t = new Template(w.template);
for (const messages of w.probes) {
  try { t.render({ messages, add_generation_prompt: true, bos_token: w.bos, eos_token: w.eos }); } catch {}
}
process.stdout.write('done');
`;

export class ChatTemplateError extends Error {
  override name = 'ChatTemplateError';
}

/** Resolves when the template renders every probe conversation in time; throws ChatTemplateError otherwise. */
export async function probeChatTemplate(template: string, tokens: { bos: string; eos: string }, opts: { timeoutMs?: number; heapMb?: number } = {}): Promise<void> {
  const timeoutMs = opts.timeoutMs ?? 5000;
  const heapMb = opts.heapMb ?? 256;
  const child = spawn(process.execPath, [`--max-old-space-size=${heapMb}`, '--input-type=module', '-e', CHILD], { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (err = (err + d).slice(-4000)));
  child.stdin.on('error', () => undefined); // (a child that died early closed its stdin)
  child.stdin.end(JSON.stringify({ jinja: import.meta.resolve('@huggingface/jinja'), template, probes: PROBES, bos: tokens.bos, eos: tokens.eos }));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    child.kill('SIGKILL');
  }, timeoutMs);
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => child.once('close', (c, s) => resolve([c, s])));
  clearTimeout(timer);
  if (code === 0 && out === 'done') return;
  if (timedOut) throw new ChatTemplateError(`its chat template did not finish rendering a two-turn conversation within ${timeoutMs / 1000} s: it would hold the node on every chat request`);
  if (/heap out of memory|invalid (array|string) length|Invalid array length/i.test(err)) throw new ChatTemplateError(`its chat template used more than ${heapMb} MB rendering a two-turn conversation: it would exhaust the node on chat requests`);
  throw new ChatTemplateError(`its chat template could not be run (the probe ended with ${signal ?? `code ${code}`}: ${err.trim().split('\n').slice(-1)[0]?.slice(0, 200) ?? ''})`);
}
