import { describe, expect, test } from 'vitest';
import { createLogger, LOGGER_LEVELS, REDACTED, REDACT_PATHS } from '../src/ops/logger.ts';

function capture(): { write(s: string): void; lines(): Record<string, unknown>[]; text(): string } {
  let buf = '';
  return {
    write(s: string) {
      buf += s;
    },
    lines: () => buf.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Record<string, unknown>),
    text: () => buf,
  };
}

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal'] as const;

/** A log object shaped like the mistakes we expect: request and response bodies, prompts, outputs. */
function leakyObject(tag: string): Record<string, unknown> {
  return {
    request_id: `req-${tag}`,
    model: 'llama-3-8b',
    tokens_in: 12,
    prompt: `SECRET-prompt-${tag}`,
    messages: [{ role: 'user', content: `SECRET-messages-${tag}` }],
    output: `SECRET-output-${tag}`,
    text: `SECRET-text-${tag}`,
    input: `SECRET-input-${tag}`,
    content: `SECRET-content-${tag}`,
    choices: [{ message: { content: `SECRET-choices-${tag}` } }],
    body: { messages: [`SECRET-body-${tag}`] },
    req: { method: 'POST', body: `SECRET-reqbody-${tag}`, headers: { authorization: `SECRET-auth-${tag}` } },
    res: { statusCode: 200, body: `SECRET-resbody-${tag}` },
    job: {
      id: `job-${tag}`,
      prompt: `SECRET-job-prompt-${tag}`,
      request: { messages: [{ content: `SECRET-nested2-${tag}` }], params: { max_tokens: 64 } },
      result: { usage: { completion_tokens: 7 }, choice: { text: `SECRET-nested3-${tag}` } },
    },
    items: [{ prompt: `SECRET-array-${tag}` }],
  };
}

describe('createLogger never writes prompt or output text', () => {
  test('at every level, top-level and nested prompt/messages/output fields are redacted', () => {
    const out = capture();
    const log = createLogger({ level: 'trace', destination: out });
    for (const level of LEVELS) log[level](leakyObject(level), `handled ${level}`);
    const lines = out.lines();
    expect(lines.map((l) => l.msg)).toEqual(LEVELS.map((l) => `handled ${l}`));
    expect(out.text()).not.toContain('SECRET');
    // ids, counts and codes survive
    for (const [i, level] of LEVELS.entries()) {
      const l = lines[i]!;
      expect(l.request_id).toBe(`req-${level}`);
      expect(l.tokens_in).toBe(12);
      expect(l.prompt).toBe(REDACTED);
      expect(l.messages).toBe(REDACTED);
      expect((l.job as { id: string }).id).toBe(`job-${level}`);
      expect((l.job as { request: { params: { max_tokens: number } } }).request.params.max_tokens).toBe(64);
      expect((l.req as { method: string }).method).toBe('POST');
      expect((l.res as { statusCode: number }).statusCode).toBe(200);
    }
  });

  test('child-logger bindings are redacted too', () => {
    const out = capture();
    const log = createLogger({ level: 'info', destination: out });
    log.child({ request_id: 'r1', prompt: 'SECRET-binding', job: { output: 'SECRET-binding-2' } }).info({ n: 1 }, 'child');
    expect(out.text()).not.toContain('SECRET');
    expect(out.lines()[0]!.request_id).toBe('r1');
  });

  test('the original object is not modified', () => {
    const log = createLogger({ level: 'info', destination: capture() });
    const obj = { prompt: 'keep me' };
    log.info(obj);
    expect(obj.prompt).toBe('keep me');
  });

  test('redaction covers the likely paths', () => {
    for (const p of ['prompt', '*.prompt', '*.messages', '*.input', '*.content', '*.text', '*.output', '*.choices', 'body', '*.body', '*.*.messages', '*.*.*.content']) {
      expect(REDACT_PATHS).toContain(p);
    }
  });

  test('levels filter, and silent writes nothing', () => {
    const out = capture();
    const log = createLogger({ level: 'warn', destination: out });
    log.info('no');
    log.debug('no');
    log.warn('yes');
    expect(out.lines().map((l) => l.msg)).toEqual(['yes']);
    expect(log.level).toBe('warn');

    const quiet = capture();
    const silent = createLogger({ level: 'silent', destination: quiet });
    for (const level of LEVELS) silent[level]('nothing');
    expect(quiet.text()).toBe('');
  });

  test('name appears on every line when given', () => {
    const out = capture();
    createLogger({ level: 'info', destination: out, name: 'seller-node' }).info('x');
    expect(out.lines()[0]!.name).toBe('seller-node');
  });

  test('an invalid level is refused with a clear error', () => {
    for (const bad of ['verbose', 'INFO', '', 'warning', 10 as unknown as string, undefined as unknown as string]) {
      expect(() => createLogger({ level: bad, destination: capture() })).toThrow(RangeError);
    }
    expect(() => createLogger({ level: 'verbose' })).toThrow(/unknown level "verbose"; expected one of trace, debug, info, warn, error, fatal, silent/);
    for (const level of LOGGER_LEVELS) expect(() => createLogger({ level, destination: capture() })).not.toThrow();
  });
});
