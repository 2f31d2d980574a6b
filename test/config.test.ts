import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import YAML from 'yaml';
import { ConfigError, loadConfig, opsHostPort, parseConfig } from '../src/config.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

const base = '/srv/node';
const model = 'models:\n  - id: tiny/llama\n    adapter: llama-embedded\n    path: ./m.gguf\n    prices: { input_per_mtok_usd: "0.15", output_per_mtok_usd: 0.6 }\n';

function refused(text: string, env: NodeJS.ProcessEnv = {}): { key: string; message: string } {
  try {
    parseConfig(text, base, env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return { key: (e as ConfigError).key, message: (e as Error).message };
  }
  throw new Error('expected the config to be refused');
}

describe('config', () => {
  test('config.example.yaml is valid and equals the defaults', () => {
    const c = loadConfig(path.join(REPO_ROOT, 'config.example.yaml'), {});
    expect(c).toMatchObject({
      key: path.join(REPO_ROOT, 'node.key'),
      data_dir: REPO_ROOT,
      listen: ['/ip4/0.0.0.0/tcp/4101'],
      marketplace: { url: null, public_keys: [] },
      models: [],
      ops: { http: '127.0.0.1:9464' },
      receipts: { checkpoint_every: 1000, checkpoint_interval_ms: 10000, signer_threads: 2 },
      gpu: 'auto',
      log_level: 'info',
    });
    expect(parseConfig('', base)).toEqual({ ...c, base, key: '/srv/node/node.key', data_dir: base });
  });

  test('config.example.yaml shows every key, and its model example every model key at its default', () => {
    const text = fs.readFileSync(path.join(REPO_ROOT, 'config.example.yaml'), 'utf8');
    const keys = (o: unknown, at = ''): string[] =>
      o !== null && typeof o === 'object' && !Array.isArray(o) ? Object.entries(o).flatMap(([k, v]) => [`${at}${k}`, ...keys(v, `${at}${k}.`)]) : [];
    // (base: where relative paths resolve, not a key)
    expect(keys(YAML.parse(text)).sort()).toEqual(keys(parseConfig('', base)).filter((k) => k !== 'base').sort());
    // The commented model example, uncommented, is the defaults but for what it must name.
    const lines = text.split('\n');
    const from = lines.indexOf('# models:');
    const to = lines.findIndex((l, i) => i > from && !l.startsWith('#   '));
    const example = lines.slice(from, to).map((l) => l.slice(2)).join('\n');
    const m = parseConfig(example, base).models[0]!;
    const { id, adapter, path: file, prices, context_set, ...rest } = m;
    expect([id, adapter, file, prices, context_set]).toEqual(['tiny/llama', 'llama-embedded', '/srv/node/tiny-llama.gguf', { input_per_mtok: 150000n, output_per_mtok: 600000n }, true]);
    expect(rest).toEqual({ url: null, quantization: null, context: 4096, slots: 1, queue: 16, max_wait_ms: 30_000, mmap: false, threads: 1, probe_timeout_s: 600, tokenize_timeout_s: 10 });
    const defaults = parseConfig(`models: [{ id: a/b, adapter: llama-embedded, path: ./m.gguf, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]`, base).models[0]!;
    expect(Object.keys(m).sort()).toEqual(Object.keys(defaults).sort());
    for (const [k, v] of Object.entries(rest)) expect(defaults[k as keyof typeof defaults], k).toEqual(v);
  });

  test('models: defaults, exact prices, resolved paths, normalised quantization', () => {
    const c = parseConfig(model.replace('    prices', '    quantization: Q4_K_M\n    prices'), base);
    expect(c.models).toEqual([
      { id: 'tiny/llama', adapter: 'llama-embedded', path: '/srv/node/m.gguf', url: null, quantization: 'q4-k-m', context: 4096, context_set: false, prices: { input_per_mtok: 150000n, output_per_mtok: 600000n }, slots: 1, queue: 16, max_wait_ms: 30_000, mmap: false, threads: 1, probe_timeout_s: 600, tokenize_timeout_s: 10 },
    ]);
    // mmap: the weights read into memory unless the operator asks llama.cpp to map the file.
    expect(parseConfig(model.replace('    prices', '    mmap: true\n    prices'), base).models[0]!.mmap).toBe(true);
    expect(parseConfig(model.replace('    prices', '    threads: 8\n    prices'), base).models[0]!.threads).toBe(8);
    expect(parseConfig(model.replace('    prices', '    probe_timeout_s: 3600\n    prices'), base).models[0]!.probe_timeout_s).toBe(3600);
    expect(parseConfig(model.replace('    prices', '    tokenize_timeout_s: 30\n    prices'), base).models[0]!.tokenize_timeout_s).toBe(30);
    // gpu (node-wide): auto, the default, or false; an environment variable says either too.
    expect(parseConfig(model, base).gpu).toBe('auto');
    expect(parseConfig(`gpu: false\n${model}`, base).gpu).toBe(false);
    expect(parseConfig(model, base, { SELLER_NODE_GPU: 'false' }).gpu).toBe(false);
  });

  test('environment variables override keys, nested with __', () => {
    const c = parseConfig(model, base, {
      SELLER_NODE_LOG_LEVEL: 'debug',
      SELLER_NODE_RECEIPTS__CHECKPOINT_EVERY: '500',
      SELLER_NODE_MARKETPLACE__URL: 'http://127.0.0.1:11436',
      SELLER_NODE_LISTEN: '["/ip4/127.0.0.1/tcp/0"]',
      OTHER: 'ignored',
    });
    expect(c.log_level).toBe('debug');
    expect(c.stop_grace_s).toBe(30); // (the default)
    expect(parseConfig('stop_grace_s: 8\n', base).stop_grace_s).toBe(8);
    expect(parseConfig('', base, { SELLER_NODE_STOP_GRACE_S: '9' }).stop_grace_s).toBe(9);
    expect(c.receipts.checkpoint_every).toBe(500);
    expect(c.marketplace.url).toBe('http://127.0.0.1:11436');
    expect(c.listen).toEqual(['/ip4/127.0.0.1/tcp/0']);
    expect(refused('', { SELLER_NODE_NOPE: '1' })).toMatchObject({ key: 'nope' });
    expect(refused('', { SELLER_NODE_RECEIPTS__CHECKPOINT_EVERY: 'lots' })).toMatchObject({ key: 'receipts.checkpoint_every' });
    // A section the file gives as something else is refused, naming it, with or without a variable under it (s29 review: the variable hid it).
    for (const [file, env, key] of [['receipts: 5\n', { SELLER_NODE_RECEIPTS__CHECKPOINT_EVERY: '10' }, 'receipts'], ['p2p: garbage\n', { SELLER_NODE_P2P__MAX_CONNECTIONS: '10' }, 'p2p'], ['marketplace: [1, 2]\n', { SELLER_NODE_MARKETPLACE__URL: 'null' }, 'marketplace']] as const) {
      expect(refused(file), file).toMatchObject({ key, message: expect.stringMatching(/expected a mapping/) });
      expect(refused(file, env), file).toMatchObject({ key, message: expect.stringMatching(/expected a mapping/) });
    }
  });

  test.each([
    ['log_level: loud', 'log_level'],
    ['surprise: 1', 'surprise'],
    ['receipts: { checkpoint_every: 0 }', 'receipts.checkpoint_every'],
    ['receipts: { checkpointEvery: 5 }', 'receipts.checkpointEvery'],
    ['listen: []', 'listen'],
    ['listen: [tcp://x]', 'listen[0]'],
    ['marketplace: { url: ftp://x }', 'marketplace.url'],
    ['marketplace: { url: "http://127.0.0.1:6000" }', 'marketplace.url'],
    ['marketplace: { public_keys: [abc] }', 'marketplace.public_keys[0]'],
    ['ops: { http: "0.0.0.0" }', 'ops.http'],
    ['ops: { http: "127.0.0.1:99999" }', 'ops.http'],
    ['models: {}', 'models'],
    ['models: [{ adapter: vllm }]', 'models[0].id'],
    ['models: [{ id: a, adapter: tgi }]', 'models[0].adapter'],
    ['models: [{ id: a, adapter: llama-embedded, prices: {} }]', 'models[0].path'],
    ['models: [{ id: a, adapter: vllm, prices: {} }]', 'models[0].url'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: "0.1234567", output_per_mtok_usd: "1" } }]', 'models[0].prices.input_per_mtok_usd'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: -1, output_per_mtok_usd: "1" } }]', 'models[0].prices.input_per_mtok_usd'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", slots: 0, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].slots'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", max_wait_ms: -1, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].max_wait_ms'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", max_wait_ms: 60001, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].max_wait_ms'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", mmap: "yes", prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].mmap'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", mmap: 1, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].mmap'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", threads: 0, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].threads'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", probe_timeout_s: 0, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].probe_timeout_s'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", probe_timeout_s: 86401, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].probe_timeout_s'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", probe_timeout_s: 1.5, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].probe_timeout_s'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", tokenize_timeout_s: 0, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].tokenize_timeout_s'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", tokenize_timeout_s: 601, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].tokenize_timeout_s'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", tokenize_timeout_s: 2.5, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].tokenize_timeout_s'],
    // What the marketplace would refuse in the registration is refused at start, naming the key (s29 review: the node served and never registered).
    ['models: [{ id: __proto__, adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].id'],
    ['models: [{ id: "tiny llama", adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].id'],
    [`models: [{ id: ${'m'.repeat(257)}, adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]`, 'models[0].id'],
    ['models: [{ id: a, adapter: vllm, url: "http://x", quantization: "Q4_K_M (imatrix)", prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]', 'models[0].quantization'],
    [`models: [{ id: a, adapter: vllm, url: "http://x", quantization: ${'q'.repeat(33)}, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }]`, 'models[0].quantization'],
    ['stop_grace_s: 0', 'stop_grace_s'],
    ['stop_grace_s: 3601', 'stop_grace_s'],
    ['stop_grace_s: 1.5', 'stop_grace_s'],
    ['gpu: true', 'gpu'],
    ['gpu: cuda', 'gpu'],
    [model + '  - id: tiny/llama\n    adapter: vllm\n    url: "http://x"\n    prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" }\n', 'models[1].id'],
  ])('%s is refused naming %s', (text, key) => {
    expect(refused(text).key).toBe(key);
  });

  test('prices written without quotes convert exactly, never through a double (design.md, Money)', () => {
    const rates = (input: string, env: NodeJS.ProcessEnv = {}) =>
      parseConfig(`models:\n  - { id: a, adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: ${input}, output_per_mtok_usd: 1 } }\n`, base, env).models[0]!.prices;
    expect(rates('99999999999.999999').input_per_mtok).toBe(99999999999999999n);
    expect(rates('12345678901.234567').input_per_mtok).toBe(12345678901234567n);
    expect(rates('0.15').input_per_mtok).toBe(150000n);
    expect(rates('12345678901234567').input_per_mtok).toBe(12345678901234567000000n); // an integer beyond 2^53
    expect(rates('2').output_per_mtok).toBe(1000000n);
    // The same through an environment variable (a list is YAML text there).
    const env = { SELLER_NODE_MODELS: '[{ id: a, adapter: vllm, url: "http://x", prices: { input_per_mtok_usd: 99999999999.999999, output_per_mtok_usd: 1 } }]' };
    expect(rates('1', env).input_per_mtok).toBe(99999999999999999n);
    // A decimal the double holds exactly stays a number, as before: whole-number keys take "8192.0".
    expect(parseConfig('models:\n  - { id: a, adapter: vllm, url: "http://x", context: 8192.0, prices: { input_per_mtok_usd: 0.150, output_per_mtok_usd: 1.0 } }\n', base).models[0]).toMatchObject({ context: 8192, prices: { input_per_mtok: 150000n, output_per_mtok: 1000000n } });
    expect(parseConfig('receipts: { checkpoint_every: 1000.0 }\n', base, { SELLER_NODE_RECEIPTS__SIGNER_THREADS: '2.0' }).receipts).toMatchObject({ checkpoint_every: 1000, signer_threads: 2 });
    // Whole-number keys still take whole numbers, and refuse a decimal as before.
    expect(() => parseConfig('models:\n  - { id: a, adapter: vllm, url: "http://x", slots: 2.5, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }\n', base)).toThrow(/models\[0\]\.slots/);
    // A number written with an exponent or in hex is not read through a double: refused, as its quoted form is (s23 h7).
    for (const written of ['1e2', '99999999999.999999e0', '1.0000000000000001e0', '0x10', '.inf']) {
      expect(() => rates(written), written).toThrow('config: models[0].prices.input_per_mtok_usd: expected a USD amount like "0.15" (at most 6 decimals)');
    }
    expect(() => parseConfig('models:\n  - { id: a, adapter: vllm, url: "http://x", context: 0x2000, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }\n', base)).toThrow(/models\[0\]\.context/);
  });

  test('the rest of what a config could hide is refused: slots beyond what llama.cpp runs, an address listed twice, an unknown tag, an empty environment variable (s23 h7)', () => {
    expect(() => parseConfig('models:\n  - { id: a, adapter: vllm, url: "http://x", slots: 257, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }\n', base)).toThrow('config: models[0].slots: expected a whole number from 1 to 256');
    expect(parseConfig('models:\n  - { id: a, adapter: vllm, url: "http://x", slots: 256, prices: { input_per_mtok_usd: "1", output_per_mtok_usd: "1" } }\n', base).models[0]!.slots).toBe(256);
    expect(refused('listen: [/ip4/127.0.0.1/tcp/4101, /ip4/127.0.0.1/tcp/4101/]')).toEqual({ key: 'listen[1]', message: 'config: listen[1]: /ip4/127.0.0.1/tcp/4101 is listed already (listen[0]): the node would bind it twice and fail as if another process held it' });
    expect(refused('log_level: !foo debug').message).toMatch(/^config: not valid YAML.*Unresolved tag: !foo/);
    expect(refused('', { SELLER_NODE_LOG_LEVEL: '!foo debug' }).message).toBe('config: log_level: environment variable SELLER_NODE_LOG_LEVEL is not a valid value');
    for (const value of ['', '  ']) {
      expect(refused('marketplace: { url: "http://127.0.0.1:1" }', { SELLER_NODE_MARKETPLACE__URL: value }).message).toBe("config: marketplace.url: environment variable SELLER_NODE_MARKETPLACE__URL is set but empty: unset it to keep the file's value, or write null for none");
    }
    expect(parseConfig('marketplace: { url: "http://127.0.0.1:1" }', base, { SELLER_NODE_MARKETPLACE__URL: 'null' }).marketplace.url).toBeNull();
  });

  test('listen: each entry is parsed as a multiaddr the TCP transport can listen on, refused naming its index', () => {
    expect(parseConfig('listen: [/ip4/127.0.0.1/tcp/0, /ip6/::1/tcp/4101/]', base).listen).toEqual(['/ip4/127.0.0.1/tcp/0', '/ip6/::1/tcp/4101']);
    expect(refused('listen: [/foo/bar]')).toEqual({ key: 'listen[0]', message: 'config: listen[0]: not a multiaddr: Protocol foo was unknown (expected a TCP multiaddr like /ip4/0.0.0.0/tcp/4101 or /ip6/::/tcp/4101)' });
    expect(refused('listen: [/ip4/127.0.0.1/tcp/0, /ip4/1.2.3.4/udp/1]')).toEqual({ key: 'listen[1]', message: 'config: listen[1]: /ip4/1.2.3.4/udp/1: the node listens with TCP only: expected a TCP multiaddr like /ip4/0.0.0.0/tcp/4101 or /ip6/::/tcp/4101' });
    expect(refused('listen: [/ip4/300.1.1.1/tcp/1]').message).toMatch(/^config: listen\[0\]: not a multiaddr: Invalid IPv4 address "300\.1\.1\.1"/);
    expect(refused('listen: [/ip4/1.2.3.4/tcp/70000]').message).toMatch(/^config: listen\[0\]: not a multiaddr: .*65535/);
  });

  test.each([
    ['/foo/bar'],
    ['/ip4/1.2.3.4/udp/1'],
    ['/ip4/1.2.3.4'],
    ['/ip4/1.2.3.4/tcp'],
    ['/ip4/1.2.3.4/tcp/1/ws'],
    ['/dns4/localhost/tcp/1'],
    ['/unix/tmp%2Fnode.sock'],
    ['/'],
  ])('listen entry %s is refused (file and environment alike)', (addr) => {
    expect(refused(`listen: ["/ip4/127.0.0.1/tcp/0", "${addr}"]`).key).toBe('listen[1]');
    const env = refused('', { SELLER_NODE_LISTEN: JSON.stringify([addr]) });
    expect(env.key).toBe('listen[0]');
    expect(env.message).toMatch(/\(from environment variable SELLER_NODE_LISTEN\)$/);
  });

  test('a value from the environment that is refused names its variable; one from the file does not', () => {
    expect(refused('', { SELLER_NODE_RECEIPTS__CHECKPOINT_EVERY: '0' }).message).toBe('config: receipts.checkpoint_every: expected a whole number from 1 to 10000000 (from environment variable SELLER_NODE_RECEIPTS__CHECKPOINT_EVERY)');
    expect(refused('receipts: { checkpoint_every: 0 }', { SELLER_NODE_LOG_LEVEL: 'debug' }).message).toBe('config: receipts.checkpoint_every: expected a whole number from 1 to 10000000');
  });

  test('ops.http: a bare number (YAML or environment) or a port alone is refused with the address to write', () => {
    const expected = 'config: ops.http: expected host:port with a port up to 65535, e.g. 127.0.0.1:9464';
    expect(refused('ops: { http: 24564 }')).toEqual({ key: 'ops.http', message: `${expected}; got the number 24564: write the string "127.0.0.1:24564"` });
    expect(refused('ops: { http: "24564" }').message).toBe(`${expected}; got "24564", a port alone: write "127.0.0.1:24564"`);
    expect(refused('', { SELLER_NODE_OPS__HTTP: '24564' }).message).toBe(`${expected}; got the number 24564: write the string "127.0.0.1:24564" (from environment variable SELLER_NODE_OPS__HTTP)`);
    for (const other of ['ops: { http: 99999 }', 'ops: { http: true }', 'ops: { http: [1] }', 'ops: { http: "" }', 'ops: { http: "0.0.0.0" }']) expect(refused(other).message, other).toBe(expected);
    expect(parseConfig('', base, { SELLER_NODE_OPS__HTTP: '0.0.0.0:24564' }).ops.http).toBe('0.0.0.0:24564');
    expect(opsHostPort(parseConfig('ops: { http: "[::1]:9464" }', base))).toEqual({ host: '::1', port: 9464 });
  });

  test('list items cannot be set one by one from the environment: the message names the whole-list variable', () => {
    expect(refused(model, { SELLER_NODE_MODELS__0__SLOTS: '4' })).toEqual({
      key: 'models[0].slots',
      message: "config: models[0].slots: list items cannot be set one by one (environment variable SELLER_NODE_MODELS__0__SLOTS); set the whole list as YAML/JSON in SELLER_NODE_MODELS, which replaces the file's list",
    });
    expect(refused('', { SELLER_NODE_LISTEN__1: '/ip4/127.0.0.1/tcp/0' }).message).toMatch(/^config: listen\[1\]: list items .* in SELLER_NODE_LISTEN, /);
    expect(refused('', { SELLER_NODE_MARKETPLACE__PUBLIC_KEYS__0: 'ab' }).key).toBe('marketplace.public_keys[0]');
    // what the message offers works: the whole list, as YAML/JSON, replaces the file's
    const whole = JSON.stringify([{ id: 'x/y', adapter: 'vllm', url: 'http://127.0.0.1:8000', slots: 4, prices: { input_per_mtok_usd: '1', output_per_mtok_usd: '2' } }]);
    expect(parseConfig(model, base, { SELLER_NODE_MODELS: whole }).models.map((m) => [m.id, m.slots])).toEqual([['x/y', 4]]);
  });

  test('broken YAML names the file, the line and column, the reason and the line as written, on one line', () => {
    const text = 'key: ./node.key\nmodels: []\nfoo bar\n  baz: 1\n';
    expect(refused(text).message).toBe('config: not valid YAML at line 3, column 1: Implicit keys need to be on a single line; line 3 reads "foo bar"');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'config-yaml-'));
    try {
      const file = path.join(dir, 'seller.yaml');
      fs.writeFileSync(file, text);
      expect(() => loadConfig(file, {})).toThrow(`config: not valid YAML in ${file} at line 3, column 1: Implicit keys need to be on a single line; line 3 reads "foo bar"`);
      fs.writeFileSync(file, '- 1\n');
      expect(() => loadConfig(file, {})).toThrow(`config: ${file} must hold a YAML mapping`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    // duplicate keys; a long line is cut at 80 characters; an error at the end of the text shows no line
    expect(refused('log_level: info\nlog_level: debug\n').message).toBe('config: not valid YAML at line 2, column 1: Map keys must be unique; line 2 reads "log_level: debug"');
    // An alias whose anchor is never set parses, and fails only as it becomes values.
    expect(refused('log_level: *a\n').message).toMatch(/^config: not valid YAML in the configuration: .*alias.*: a$/i);
    const long = refused(`${'x'.repeat(100)}: 1\n${'x'.repeat(100)}: 2\n`).message;
    expect(long).toBe(`config: not valid YAML at line 2, column 1: Map keys must be unique; line 2 reads "${'x'.repeat(79)}…"`);
    expect(refused('a: [1\n').message).toMatch(/^config: not valid YAML at line 2, column 1: [^\n]*\]$/);
  });

  test('broken YAML, duplicate keys and non-mappings are refused', () => {
    expect(refused('a: [1\n').message).toMatch(/not valid YAML/);
    expect(refused('log_level: info\nlog_level: debug\n').message).toMatch(/not valid YAML/);
    expect(refused('- 1\n').message).toMatch(/mapping/);
  });

  test('the config init writes is valid', async () => {
    const { defaultConfigYaml } = await import('../src/config.ts');
    expect(parseConfig(defaultConfigYaml(), base).key).toBe('/srv/node/node.key');
  });

  test('a missing file is a named error', () => {
    expect(() => loadConfig(path.join(REPO_ROOT, 'nope.yaml'))).toThrow(`cannot read ${path.join(REPO_ROOT, 'nope.yaml')}: not found (seller-node init --data DIR writes one)`);
    expect(() => loadConfig(REPO_ROOT)).toThrow(`cannot read ${REPO_ROOT}: it is a folder`);
    expect(fs.existsSync(path.join(REPO_ROOT, 'config.example.yaml'))).toBe(true);
  });
});
