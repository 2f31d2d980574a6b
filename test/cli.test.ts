// The real `seller-node` command line, spawned in child processes against temp dirs. Needs the
// build: `npm run build` first (bin/seller-node.js imports dist/).
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toBase64, utf8 } from '../attestation/bytes.ts';
import { formatProofBundle } from '../attestation/tlog-proof.ts';
import { loadKeyFile } from '../src/identity.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { priceVersion, signPriceList, verifyPriceList } from '../attestation/price-list.ts';
import { savePriceList } from '../src/data-dir.ts';
import { SYNTHETIC_PRICE_LIST, syntheticReceiptBody } from '../src/store/synthetic.ts';
import { assertCliBuilt, CLI_BIN, runCli, STACK_TRACE, type CliResult } from './helpers/cli-run.ts';
import { flipSignatureBit, payloadOf, providerIdOf, randomSeed, removeTemp, tempDir, withPayloadKeepSig } from './helpers/tamper-log.ts';

let tmp: string;
const SYNTHETIC_VERSION = priceVersion(SYNTHETIC_PRICE_LIST);
const SUCCESS = /\bOK\b|appended|exported|^[0-9a-f]{64}$/m;

beforeAll(() => {
  assertCliBuilt();
  tmp = tempDir('seller-node-cli-');
});

afterAll(() => removeTemp(tmp));

/** A usage or input error: non-zero exit, a one-line message on stderr, no stack, nothing that looks like success. */
function expectCleanError(r: CliResult, stderrHas: RegExp | string, code?: number): void {
  expect(r.signal).toBeNull();
  if (code === undefined) expect(r.code).not.toBe(0);
  else expect(r.code).toBe(code);
  expect(r.code).not.toBeNull();
  expect(r.stderr).toMatch(typeof stderrHas === 'string' ? new RegExp(stderrHas.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')) : stderrHas);
  expect(r.stderr).not.toMatch(STACK_TRACE);
  expect(r.stdout).not.toMatch(SUCCESS);
}

/** A checked fault: exit 1, the verdict on stdout, no stack trace. */
function expectFail(r: CliResult, stdoutHas: RegExp): void {
  expect(r.code, r.stderr).toBe(1);
  expect(r.stdout).toMatch(stdoutHas);
  expect(r.stdout).not.toMatch(/^OK/m);
  expect(r.stderr).not.toMatch(STACK_TRACE);
}

describe.concurrent('help', () => {
  it('--help lists every subcommand and exits 0', async ({ expect }) => {
    const r = await runCli(['--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Usage: seller-node/m);
    for (const c of ['init', 'start', 'log', 'audit', 'verify', 'dev-model', 'check-model', 'demo', 'demo-receipts', 'market', 'gateway']) expect(r.stdout).toMatch(new RegExp(`^\\s+${c}\\b`, 'm'));
    expect(r.stdout).toMatch(/^\s+log\b[^]*?\bprove\b[^]*?^\s+audit\b/m); // log's entry names what it does, prove among it
    // One line a subcommand (the output is not a terminal here: 80 columns), log's own too.
    const entries = (text: string) => text.slice(text.indexOf('\nCommands:\n') + 11).split('\n').filter((l) => l.trim() !== '');
    for (const l of entries(r.stdout)) expect(l, 'a continuation line').toMatch(/^ {2}[a-z]/);
    expect(entries(r.stdout)).toHaveLength(12); // (the 11 above and help)
    const log = await runCli(['log', '--help']);
    for (const l of entries(log.stdout)) expect(l, 'a continuation line').toMatch(/^ {2}[a-z]/);
    expect(entries(log.stdout).map((l) => l.trim().split(' ')[0])).toEqual(['fill', 'prove', 'export', 'help']);
  });

  for (const [args, mentions] of [
    [['init'], ['--data']],
    [['log'], ['fill', 'prove', 'export']],
    [['audit'], ['<dir>', '--provider', '--json', '--threads']],
    [['verify'], ['<file>', '--provider', '--json']],
    [['dev-model'], ['--out', '--seed']],
    [['check-model'], ['<file>', '--gpu', '--mmap', '--context']],
    [['start'], ['--config']],
    [['demo'], ['--port', '--smoke']],
    [['demo-receipts'], ['--count', '--keep']],
    [['log', 'fill'], ['--data', '--count', '--checkpoint-every', '--threads']],
    [['log', 'prove'], ['--data', '--seq', '--size', '--out']],
    [['log', 'export'], ['--data', '--out']],
  ] as const) {
    it(`${args.join(' ')} --help exits 0 and documents ${mentions.join(', ')}`, async ({ expect }) => {
      const r = await runCli([...args, '--help']);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain(`Usage: seller-node ${args.join(' ')}`);
      for (const m of mentions) expect(r.stdout).toContain(m);
      expect(r.stderr).toBe('');
    });
  }

  it('-V prints this package\'s version, even inside another project\'s npm script', async ({ expect }) => {
    const own = (JSON.parse(fs.readFileSync(path.join(import.meta.dirname, '..', 'package.json'), 'utf8')) as { version: string }).version;
    for (const env of [{}, { npm_package_version: '9.9.9' }] as Record<string, string>[]) {
      const r = await runCli(['-V'], { env });
      expect(r.code).toBe(0);
      expect(r.stdout.trim()).toBe(own);
    }
  });
});

describe.concurrent('usage errors', () => {
  it('an unknown subcommand', async () => {
    expectCleanError(await runCli(['bogus']), /unknown command 'bogus'/);
  });

  it('an unknown log subcommand', async () => {
    expectCleanError(await runCli(['log', 'bogus']), /unknown command 'bogus'/);
  });

  it('init without --data', async () => {
    expectCleanError(await runCli(['init']), /--data/);
  });

  it('log fill without --count', async () => {
    expectCleanError(await runCli(['log', 'fill', '--data', path.join(tmp, 'unused')]), /--count/);
  });

  for (const bad of ['abc', '0', '-5', '1.5', '1e3', '']) {
    it(`log fill --count ${JSON.stringify(bad)}`, async () => {
      const data = path.join(tmp, `bad-count-${bad || 'empty'}`);
      const r = await runCli(['log', 'fill', '--data', data, '--count', bad]);
      expectCleanError(r, /--count must be/, 2);
      expect(fs.existsSync(data)).toBe(false);
    });
  }

  it('log fill --checkpoint-every 0', async () => {
    expectCleanError(await runCli(['log', 'fill', '--data', path.join(tmp, 'unused'), '--count', '5', '--checkpoint-every', '0']), /--checkpoint-every must be/, 2);
  });

  it('log fill into a folder without a key', async () => {
    const data = path.join(tmp, 'no-key');
    expectCleanError(await runCli(['log', 'fill', '--data', data, '--count', '3']), `--data ${data}: not found (the node's data_dir; seller-node init --data DIR makes one)`);
    fs.mkdirSync(data); // (the folder there, no key in it)
    expectCleanError(await runCli(['log', 'fill', '--data', data, '--count', '3']), /key file .* not found/);
    expect(fs.existsSync(path.join(data, 'receipts.db'))).toBe(false);
  });

  it('log export without --out', async () => {
    expectCleanError(await runCli(['log', 'export', '--data', path.join(tmp, 'unused')]), /--out/);
  });

  it('audit without a folder', async () => {
    expectCleanError(await runCli(['audit']), /missing required argument 'dir'/);
  });

  it('audit --provider that is not 64 hex', async () => {
    expectCleanError(await runCli(['audit', tmp, '--provider', 'XYZ']), /--provider must be 64 lowercase hex/, 2);
  });

  it('audit --threads 65', async () => {
    expectCleanError(await runCli(['audit', tmp, '--threads', '65']), /--threads must be between 0 and 64/, 2);
  });

  it('verify without a file', async () => {
    expectCleanError(await runCli(['verify']), /missing required argument 'file'/);
  });

  it('verify --provider that is not 64 hex', async () => {
    expectCleanError(await runCli(['verify', 'x.json', '--provider', 'ab']), /--provider must be 64 lowercase hex/, 2);
  });

  it('gateway without --market, with a market that is not a URL, with a bad --listen, --provider-idle-ms or --account', async () => {
    for (const bad of ['', 'a b', 'x'.repeat(257), 'café']) expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--account', bad]), /--account must be 1 to 256 of the characters A-Z a-z 0-9 \. _ : @ -, got "/, 2);
    expectCleanError(await runCli(['gateway']), /required option '--market <url>'/);
    expectCleanError(await runCli(['gateway', '--market', 'not a url']), /--market: /, 2);
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--listen', 'a:b:c']), '--listen must be host:port, e.g. 127.0.0.1:11435; got "a:b:c"\n', 2);
    for (const bad of ['soon', '-5', '1e5']) expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--provider-idle-ms', bad]), new RegExp(`--provider-idle-ms must be a whole number, got "?${bad}`), 2);
    // (at least 5 s: a working node sends a keepalive after 1 s of silence, docs/protocol.md)
    for (const bad of ['4999', '1000000000']) expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--provider-idle-ms', bad]), new RegExp(`--provider-idle-ms must be between 5000 and 999999999, got "?${bad}`), 2);
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--api-keys-file', path.join(tmp, 'no-such-keys')]), /^seller-node: --api-keys-file: cannot read the API keys file .*no-such-keys: not found\n$/, 2);
    const keys = path.join(tmp, 'keys-bad-option');
    fs.writeFileSync(keys, 'sk-svc-v1-0123456789abcdef spend_interval=yearly\n');
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--api-keys-file', keys]), `seller-node: --api-keys-file: ${keys}:1: spend_interval: expected daily, weekly, monthly (omitted: a lifetime budget), got "yearly"\n`, 2);
    fs.writeFileSync(keys, 'sk-svc-v1-0123456789abcdef spend_interval=daily\n');
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--api-keys-file', keys]), `seller-node: --api-keys-file: ${keys}:1: spend_interval: given without spend_limit_usd\n`, 2);
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--records-days', '30']), '--records-days needs --records FILE (records kept in memory go with the process)', 2);
  });

  it('gateway and market --listen with a port alone: the same usage error, before anything listens or warns', async () => {
    // "24037" once passed as a host name: a warning that the gateway listens "beyond this machine", then EADDRNOTAVAIL 0.0.93.229.
    const gw = await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--listen', '24037']);
    expectCleanError(gw, 'seller-node: --listen must be host:port, e.g. 127.0.0.1:11435; got "24037" (a port alone: write 127.0.0.1:24037)\n', 2);
    expect(gw.stderr).not.toMatch(/warning|EADDRNOTAVAIL/);
    const data = path.join(tmp, 'market-bad-listen');
    expectCleanError(await runCli(['market', '--data', data, '--listen', '24038']), 'seller-node: --listen must be host:port, e.g. 127.0.0.1:11436; got "24038" (a port alone: write 127.0.0.1:24038)\n', 2);
    expect(fs.existsSync(data)).toBe(false);
  });

  it('a marketplace or gateway on a port fetch will not connect to is refused before anything starts', async () => {
    const problem = 'is one that fetch (Node, browsers, the openai client) refuses to connect to (a "bad port" in the Fetch standard); choose another\n';
    const data = path.join(tmp, 'market-bad-port');
    expectCleanError(await runCli(['market', '--data', data, '--listen', '127.0.0.1:6000']), `seller-node: --listen: port 6000 ${problem}`, 2);
    expect(fs.existsSync(data)).toBe(false);
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--listen', '127.0.0.1:10080']), `seller-node: --listen: port 10080 ${problem}`, 2);
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:6667']), `seller-node: --market: market URL "http://127.0.0.1:6667": port 6667 ${problem}`, 2);
    expectCleanError(await runCli(['demo', '--port', '6669']), `seller-node: --port: port 6669 ${problem}`, 2);
  });

  it('market, gateway and demo on a port in use, or an address this machine does not have: the address, why, and the option to change', async () => {
    const net = await import('node:net');
    const busy = net.createServer();
    await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
    const port = (busy.address() as import('node:net').AddressInfo).port;
    try {
      expectCleanError(await runCli(['market', '--data', path.join(tmp, 'market-busy'), '--listen', `127.0.0.1:${port}`]), `seller-node: 127.0.0.1:${port}: address already in use (pick another with --listen)\n`, 1);
      expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--listen', `127.0.0.1:${port}`]), `seller-node: 127.0.0.1:${port}: address already in use (pick another with --listen)\n`, 1);
      expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--listen', '192.0.2.1:11435']), 'seller-node: 192.0.2.1:11435: no such address on this machine (pick another with --listen)\n', 1);
      const demo = await runCli(['demo', '--port', String(port)], { timeoutMs: 60_000 });
      expect(demo.code).toBe(1);
      expect(demo.stderr).toContain(`seller-node: 127.0.0.1:${port}: address already in use (the gateway's port: pick another with --port)\n`);
    } finally {
      await new Promise((r) => busy.close(r));
    }
  }, 90_000);

  it('gateway --records in a folder that does not exist: a clean error naming the file', async () => {
    const file = path.join(tmp, 'no-such-folder', 'records.db');
    expectCleanError(await runCli(['gateway', '--market', 'http://127.0.0.1:2', '--listen', '127.0.0.1:0', '--records', file]), /request records .*no-such-folder.*: its folder .*no-such-folder does not exist\n/, 1);
  });
});

describe.concurrent('start: an ops HTTP address beyond loopback', () => {
  // No models: the node refuses to start right after the config is read, so nothing listens.
  const start = async (name: string, ops: string) => {
    const file = path.join(tmp, `${name}.yaml`);
    fs.writeFileSync(file, `key: ./${name}.key\ndata_dir: ./${name}-data\nops: { http: "${ops}" }\n`);
    return runCli(['start', '--config', file]);
  };
  const warning = (addr: string) => `seller-node: warning: the ops HTTP server listens on ${addr}, beyond this machine; /status and /metrics have no authentication\n`;

  it('0.0.0.0 and [::] are warned about on stderr, once, as the gateway does', async () => {
    for (const [name, addr] of [['ops-wide4', '0.0.0.0:0'], ['ops-wide6', '[::]:0']] as const) {
      const r = await start(name, addr);
      expect(r.code).toBe(1);
      expect(r.stderr.startsWith(warning(addr)), r.stderr).toBe(true);
      expect(r.stderr.split('warning:')).toHaveLength(2);
    }
  });

  it('loopback is not', async () => {
    for (const [name, addr] of [['ops-lo4', '127.0.0.1:0'], ['ops-lo6', '[::1]:0'], ['ops-lo-name', 'localhost:0']] as const) {
      const r = await start(name, addr);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/^seller-node: config: models: /);
      expect(r.stderr).not.toMatch(/warning/);
    }
  });
});

describe('init', () => {
  it('prints a 64-hex provider id, writes a 0600 key and a config, and refuses a second init', async () => {
    const data = path.join(tmp, 'init');
    const r = await runCli(['init', '--data', data]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^[0-9a-f]{64}\n$/);
    const id = r.stdout.trim();
    const keyFile = path.join(data, 'node.key');
    expect(fs.statSync(keyFile).mode & 0o777).toBe(0o600);
    expect(fs.existsSync(path.join(data, 'config.yaml'))).toBe(true);
    expect(loadKeyFile(keyFile).providerId).toBe(id);

    const key = fs.readFileSync(keyFile);
    const config = fs.readFileSync(path.join(data, 'config.yaml'));
    const again = await runCli(['init', '--data', data]);
    expectCleanError(again, /already exists; refusing to overwrite/, 1);
    expect(again.stdout).toBe('');
    expect(fs.readFileSync(keyFile).equals(key)).toBe(true);
    expect(fs.readFileSync(path.join(data, 'config.yaml')).equals(config)).toBe(true);
    expect(fs.statSync(keyFile).mode & 0o777).toBe(0o600);
  });

  it('a config already in the folder is kept as it is, and init says so', async () => {
    const data = path.join(tmp, 'init-kept');
    fs.mkdirSync(data);
    fs.writeFileSync(path.join(data, 'config.yaml'), '# mine\n');
    const r = await runCli(['init', '--data', data]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe(`key: ${path.join(data, 'node.key')}\nconfig: ${path.join(data, 'config.yaml')} (already there: kept as it is)\n`);
    expect(fs.readFileSync(path.join(data, 'config.yaml'), 'utf8')).toBe('# mine\n');
    const fresh = await runCli(['init', '--data', path.join(tmp, 'init-fresh')]);
    expect(fresh.stderr).toBe(`key: ${path.join(tmp, 'init-fresh', 'node.key')}\nconfig: ${path.join(tmp, 'init-fresh', 'config.yaml')}\n`);
  });

  it('init over a file is a clean error', async () => {
    const file = path.join(tmp, 'a-file');
    fs.writeFileSync(file, 'x');
    expectCleanError(await runCli(['init', '--data', file]), /seller-node: /);
    expect(fs.readFileSync(file, 'utf8')).toBe('x');
  });
});

describe('fill, export, audit round trip', () => {
  const data = () => path.join(tmp, 'node');
  const out = () => path.join(tmp, 'export');
  let id: string;

  beforeAll(async () => {
    const r = await runCli(['init', '--data', data()]);
    expect(r.code, r.stderr).toBe(0);
    id = r.stdout.trim();
  });

  it('log fill appends the receipts and keeps the signed price list they cite', async () => {
    const r = await runCli(['log', 'fill', '--data', data(), '--count', '30', '--checkpoint-every', '10', '--threads', '0']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^appended 30 receipts \(seq 0\.\.29\) in [0-9.]+ s; log size 30\n$/);
    expect(fs.readdirSync(path.join(data(), 'prices'))).toEqual([`${SYNTHETIC_VERSION}.json`]);
    expect(verifyPriceList(fs.readFileSync(path.join(data(), 'prices', `${SYNTHETIC_VERSION}.json`), 'utf8'), { provider: id }).ok).toBe(true);
  });

  it('log export writes receipts.jsonl, the checkpoints, provider.pub and the price lists', async () => {
    const r = await runCli(['log', 'export', '--data', data(), '--out', out()]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^exported 30 receipts, \d+ checkpoints and 1 price list to /);
    expect(fs.readFileSync(path.join(out(), 'prices', `${SYNTHETIC_VERSION}.json`), 'utf8')).toBe(fs.readFileSync(path.join(data(), 'prices', `${SYNTHETIC_VERSION}.json`), 'utf8'));
    const lines = fs.readFileSync(path.join(out(), 'receipts.jsonl'), 'utf8').split('\n');
    expect(lines).toHaveLength(31);
    expect(lines[30]).toBe('');
    expect(fs.readFileSync(path.join(out(), 'provider.pub'), 'utf8')).toBe(`${id}\n`);
    expect(fs.existsSync(path.join(out(), 'checkpoint'))).toBe(true);
    expect(fs.readdirSync(path.join(out(), 'checkpoints'))).toContain('30');
  });

  it('audit holds (default worker threads) and the summary names the receipt count', async () => {
    const r = await runCli(['audit', out()]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain(`provider     ${id}`);
    expect(r.stdout).toMatch(/^receipts\s+30 \(seq 0\.\.29\)/m);
    expect(r.stdout).toMatch(/latest covers 30 of 30 receipts/);
    expect(r.stdout).toContain(`prices       ok (every receipt at its model's rates in the signed price list it cites; 1 price list: ${SYNTHETIC_VERSION})`);
    expect(r.stdout).toMatch(/^OK \(/m);
    expect(r.stdout).not.toMatch(/FAIL/);
  });

  it('audit --json --provider --threads 0 prints the report', async () => {
    const r = await runCli(['audit', out(), '--json', '--provider', id, '--threads', '0']);
    expect(r.code, r.stderr).toBe(0);
    const report = JSON.parse(r.stdout);
    expect(report.ok).toBe(true);
    expect(report.provider).toBe(id);
    expect(report.summary.receipts).toBe(30);
    expect(report.summary.size).toBe(30);
    expect(report.summary.latestCheckpoint.size).toBe(30);
    expect(report.fault).toBeUndefined();
  });

  it('audit pinned to another provider fails provider_mismatch', async () => {
    const other = providerIdOf(randomSeed());
    expectFail(await runCli(['audit', out(), '--provider', other, '--threads', '0']), /^FAIL: provider_mismatch: /m);
  });

  it('audit of a tampered copy names the code, seq and line', async () => {
    const bad = path.join(tmp, 'export-tampered');
    fs.cpSync(out(), bad, { recursive: true });
    const file = path.join(bad, 'receipts.jsonl');
    const lines = fs.readFileSync(file, 'utf8').split('\n');
    lines[4] = flipSignatureBit(lines[4]!);
    fs.writeFileSync(file, lines.join('\n'));
    expectFail(await runCli(['audit', bad, '--threads', '0']), /^FAIL at seq 4, line 5: signature_invalid: /m);
    const j = await runCli(['audit', bad, '--json']);
    expect({ code: j.code, signal: j.signal }, j.stderr).toEqual({ code: 1, signal: null });
    const report = JSON.parse(j.stdout);
    expect(report.ok).toBe(false);
    expect(report.fault).toMatchObject({ code: 'signature_invalid', seq: '4', line: 5 });
    expect(report.summary).toBeUndefined();
  });

  it('audit and verify print what they read with its control characters escaped: an envelope cannot erase the FAIL line and print a forged OK (s23 h3)', async () => {
    const bad = path.join(tmp, 'export-escapes');
    fs.cpSync(out(), bad, { recursive: true });
    const file = path.join(bad, 'receipts.jsonl');
    const lines = fs.readFileSync(file, 'utf8').split('\n');
    const forgedType = '\u001b[1A\u001b[2K\rOK (0.05 s)\u001b[8m\u202e';
    lines[1] = JSON.stringify({ ...JSON.parse(lines[1]!), payloadType: forgedType });
    fs.writeFileSync(file, lines.join('\n'));
    const r = await runCli(['audit', bad, '--threads', '0']);
    expectFail(r, /^FAIL at seq 1, line 2: /m);
    expect(r.stdout).not.toMatch(/[\u001b\r\u202e]/);
    expect(r.stdout).toContain('\\u001b[1A\\u001b[2K\\u000dOK (0.05 s)\\u001b[8m\\u202e');
    const one = path.join(tmp, 'escapes.json');
    fs.writeFileSync(one, lines[1]!);
    const v = await runCli(['verify', one]);
    expectFail(v, /^FAIL receipt: /m);
    expect(v.stdout).not.toMatch(/[\u001b\r\u202e]/);
    expect(v.stdout).toContain('\\u001b[2K');
  });

  it('audit of a copy whose price list was forged or removed names the fault', async () => {
    const forged = path.join(tmp, 'export-forged-prices');
    fs.cpSync(out(), forged, { recursive: true });
    const file = path.join(forged, 'prices', `${SYNTHETIC_VERSION}.json`);
    fs.writeFileSync(file, flipSignatureBit(fs.readFileSync(file, 'utf8').trim()));
    expectFail(await runCli(['audit', forged, '--threads', '0']), new RegExp(`^FAIL: price_list_invalid: prices/${SYNTHETIC_VERSION}\\.json is not a price list signed by the provider: signature_invalid: `, 'm'));
    fs.rmSync(path.join(forged, 'prices'), { recursive: true });
    const j = await runCli(['audit', forged, '--json']);
    expect(j.code).toBe(1);
    expect(JSON.parse(j.stdout).fault).toMatchObject({ code: 'price_list_missing', seq: '0', line: 1 });
  });

  it('log export of a data dir without price lists warns that its audit cannot price the receipts', async () => {
    const bare = path.join(tmp, 'node-no-prices');
    fs.cpSync(data(), bare, { recursive: true });
    fs.rmSync(path.join(bare, 'prices'), { recursive: true });
    const r = await runCli(['log', 'export', '--data', bare, '--out', path.join(tmp, 'export-no-prices')]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^exported 30 receipts, \d+ checkpoints and 0 price lists to /);
    expect(r.stderr).toMatch(/warning: .* holds no signed price lists \(prices\/\), so an audit of this export cannot price its receipts/);
  });

  it('log export warns when receipts cite a price version whose signed list the data dir lacks (prices changed when upgrading from a build that kept none)', async () => {
    const partial = path.join(tmp, 'node-other-prices');
    fs.cpSync(data(), partial, { recursive: true });
    fs.rmSync(path.join(partial, 'prices'), { recursive: true });
    const key = loadKeyFile(path.join(partial, 'node.key'));
    savePriceList(partial, signPriceList(key.seed, key.providerId, [{ ...SYNTHETIC_PRICE_LIST[0]!, input_per_mtok: '200000' }]));
    const r = await runCli(['log', 'export', '--data', partial, '--out', path.join(tmp, 'export-other-prices')]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/ and 1 price list to /);
    expect(r.stderr).toContain(`warning: receipts cite price versions with no signed price list in ${partial}/prices (${SYNTHETIC_VERSION}): an audit of this export fails at them with price_list_missing`);
  });

  it('log export, prove and fill of a data dir that is not there say so (not that its key is missing)', async () => {
    const nope = path.join(tmp, 'no-such-data');
    for (const args of [['export', '--out', path.join(tmp, 'export-nope')], ['prove', '--seq', '0'], ['fill', '--count', '1']]) {
      expectCleanError(await runCli(['log', args[0]!, '--data', nope, ...args.slice(1)]), `seller-node: --data ${nope}: not found (the node's data_dir; seller-node init --data DIR makes one)\n`, 1);
    }
    expect(fs.existsSync(nope)).toBe(false);
  });

  it('log export and log prove of a node whose key is kept outside its data dir (config "key"): --key', async () => {
    const home = path.join(tmp, 'key-elsewhere');
    fs.cpSync(data(), path.join(home, 'data'), { recursive: true });
    fs.renameSync(path.join(home, 'data', 'node.key'), path.join(home, 'node.key'));
    const out = path.join(tmp, 'export-key-elsewhere');
    const without = await runCli(['log', 'export', '--data', path.join(home, 'data'), '--out', out]);
    expect(without.code).toBe(1);
    expect(without.stderr).toMatch(/node\.key not found: if the node's key is elsewhere \(its config's "key"\), pass --key FILE/);
    expect(without.stderr).not.toMatch(/create one/);
    const withKey = await runCli(['log', 'export', '--data', path.join(home, 'data'), '--out', out, '--key', path.join(home, 'node.key')]);
    expect(withKey.code, withKey.stderr).toBe(0);
    expect((await runCli(['audit', out, '--threads', '0'])).code).toBe(0);
    const proof = await runCli(['log', 'prove', '--data', path.join(home, 'data'), '--seq', '3', '--key', path.join(home, 'node.key')]);
    expect(proof.code, proof.stderr).toBe(0);
  });

  it('log export to a full disk names the file; of a damaged receipts.db names the database', async () => {
    const out = path.join(tmp, 'export-full');
    fs.mkdirSync(out);
    fs.symlinkSync('/dev/full', path.join(out, 'provider.pub')); // every write there: ENOSPC
    const full = await runCli(['log', 'export', '--data', data(), '--out', out]);
    expect(full.code).toBe(1);
    expect(full.stderr).toContain(`seller-node: cannot write the export to ${out}: no space left on the device (${path.join(out, 'provider.pub')})`);
    const damaged = path.join(tmp, 'node-damaged');
    fs.cpSync(data(), damaged, { recursive: true });
    const db = path.join(damaged, 'receipts.db');
    for (const f of ['receipts.db-wal', 'receipts.db-shm']) fs.rmSync(path.join(damaged, f), { force: true });
    fs.truncateSync(db, Math.floor(fs.statSync(db).size / 2));
    const bad = await runCli(['log', 'export', '--data', damaged, '--out', path.join(tmp, 'export-damaged')]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain(`seller-node: ${db}: `);
  });

  it('a second fill (default signer threads) continues the log, and the new export audits', async () => {
    const f = await runCli(['log', 'fill', '--data', data(), '--count', '5']);
    expect(f.code, f.stderr).toBe(0);
    expect(f.stdout).toMatch(/appended 5 receipts \(seq 30\.\.34\).*log size 35/);
    const out2 = path.join(tmp, 'export2');
    expect((await runCli(['log', 'export', '--data', data(), '--out', out2])).code).toBe(0);
    const a = await runCli(['audit', out2, '--threads', '0']);
    expect(a.code, a.stdout).toBe(0);
    expect(a.stdout).toMatch(/^receipts\s+35 /m);
  });

  it('verify of one exported line holds', async () => {
    const line = fs.readFileSync(path.join(out(), 'receipts.jsonl'), 'utf8').split('\n')[3]!;
    const file = path.join(tmp, 'receipt-3.json');
    fs.writeFileSync(file, line);
    const r = await runCli(['verify', file]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^OK receipt: seq 3 by ${id}, `));
    const pinned = await runCli(['verify', file, '--provider', id, '--json']);
    expect(pinned.code).toBe(0);
    expect(JSON.parse(pinned.stdout)).toMatchObject({ ok: true, kind: 'receipt', payload: { seq: '3', provider: id } });
  });
});

describe('verify', () => {
  const seed = randomSeed();
  const id = providerIdOf(seed);
  let lines: string[];
  let bundle: string;
  let note: string;
  let proofOf: (seq: number) => Uint8Array[];
  const SEQ = 7;

  beforeAll(async () => {
    const log = ReceiptLog.open({ path: path.join(tmp, 'verify.db'), seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 1000 });
    try {
      await Promise.all(Array.from({ length: 30 }, (_, i) => log.append(syntheticReceiptBody(i))));
      note = log.checkpoint()!;
      expect(note).toBeTypeOf('string');
      lines = [...log.lines()];
      const proofs = lines.map((_, i) => log.inclusionProof(i, 30));
      proofOf = (s) => proofs[s]!;
      bundle = formatProofBundle({ index: SEQ, proof: log.inclusionProof(SEQ, 30), checkpointNote: note, extra: utf8(log.lineBySeq(SEQ)!) });
    } finally {
      await log.close();
    }
  });

  const write = (name: string, content: string | Uint8Array): string => {
    const f = path.join(tmp, name);
    fs.writeFileSync(f, content);
    return f;
  };

  it('a receipt envelope holds, with or without --provider, from a file or stdin', async () => {
    const f = write('r0.json', lines[0]!);
    const r = await runCli(['verify', f]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^OK receipt: seq 0 by ${id}, `));
    expect(r.stderr).toMatch(/pass --provider to pin it/);
    const pinned = await runCli(['verify', f, '--provider', id]);
    expect(pinned.code).toBe(0);
    expect(pinned.stderr).toBe('');
    const stdin = await runCli(['verify', '-', '--provider', id], { input: lines[1]! + '\n' });
    expect(stdin.code, stdin.stdout + stdin.stderr).toBe(0);
    expect(stdin.stdout).toMatch(/^OK receipt: seq 1 /);
  });

  it('a receipt with a payload field changed is signature_invalid', async () => {
    const p = payloadOf(lines[2]!);
    p.usage.output_tokens += 1;
    const f = write('r2-tampered.json', withPayloadKeepSig(lines[2]!, p));
    expectFail(await runCli(['verify', f]), /^FAIL receipt: signature_invalid: /m);
    const j = await runCli(['verify', f, '--json', '--provider', id]);
    expect(j.code).toBe(1);
    expect(JSON.parse(j.stdout)).toMatchObject({ ok: false, kind: 'receipt', error: { code: 'signature_invalid' } });
  });

  it('a receipt with a flipped signature bit is signature_invalid', async () => {
    const f = write('r4-flipped.json', flipSignatureBit(lines[4]!, 40, 7));
    expectFail(await runCli(['verify', f, '--provider', id]), /^FAIL receipt: signature_invalid: /m);
  });

  it('a receipt checked against another provider is unknown_key', async () => {
    const f = write('r5.json', lines[5]!);
    expectFail(await runCli(['verify', f, '--provider', providerIdOf(randomSeed())]), /^FAIL receipt: unknown_key: /m);
  });

  it('a tlog-proof bundle built with the library holds', async () => {
    expect(bundle.startsWith('c2sp.org/tlog-proof@v1\nextra ')).toBe(true);
    const f = write('bundle.txt', bundle);
    const r = await runCli(['verify', f]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^OK bundle: seq ${SEQ} by ${id}, .*included in the log at index ${SEQ} under a checkpoint of size 30`));
    const j = await runCli(['verify', f, '--json', '--provider', id]);
    expect(j.code).toBe(0);
    expect(JSON.parse(j.stdout)).toMatchObject({ ok: true, kind: 'bundle', payload: { seq: String(SEQ) } });
  });

  it('a bundle carrying another receipt than the proven one is proof_root_mismatch', async () => {
    const f = write('bundle-other-extra.txt', bundle.replace(`extra ${toBase64(utf8(lines[SEQ]!))}`, `extra ${toBase64(utf8(lines[SEQ + 1]!))}`));
    expectFail(await runCli(['verify', f]), /^FAIL bundle: proof_root_mismatch: /m);
  });

  it('a bundle whose receipt was tampered is proof_root_mismatch', async () => {
    const p = payloadOf(lines[SEQ]!);
    p.cost_micro_usd = '0';
    const forged = withPayloadKeepSig(lines[SEQ]!, p);
    const f = write('bundle-forged.txt', formatProofBundle({ index: SEQ, proof: proofOf(SEQ), checkpointNote: note, extra: utf8(forged) }));
    expectFail(await runCli(['verify', f]), /^FAIL bundle: proof_root_mismatch: /m);
  });

  it('a bundle with the right receipt at the wrong index is refused', async () => {
    const f = write('bundle-wrong-index.txt', formatProofBundle({ index: SEQ + 1, proof: proofOf(SEQ), checkpointNote: note, extra: utf8(lines[SEQ]!) }));
    expectFail(await runCli(['verify', f]), /^FAIL bundle: proof_root_mismatch: /m);
  });

  it('a bundle pinned to another provider is provider_mismatch, naming the provider it is from', async () => {
    const f = write('bundle-pin.txt', bundle);
    expectFail(await runCli(['verify', f, '--provider', providerIdOf(randomSeed())]), /^FAIL bundle: provider_mismatch: the bundle is from provider [0-9a-f]{64}, not /m);
  });

  it('a bundle whose checkpoint was edited is signature_invalid', async () => {
    const f = write('bundle-cp.txt', bundle.replace(/\n30\n/, '\n31\n'));
    expectFail(await runCli(['verify', f]), /^FAIL bundle: signature_invalid: /m);
  });

  it('a bundle whose checkpoint does not parse says so, not that its origin is wrong (s23 h3)', async () => {
    const r = await runCli(['verify', write('bundle-cp-malformed.txt', bundle.replace(/\n30\n/, '\n030\n'))]);
    expectFail(r, /^FAIL bundle: checkpoint_malformed: /m);
  });

  it('a bundle cut short is refused', async () => {
    const f = write('bundle-short.txt', bundle.slice(0, bundle.indexOf('\n\n')));
    expectFail(await runCli(['verify', f]), /^FAIL bundle: bundle_malformed: /m);
  });

  it('a genuine receipt without a usable keyid (missing, empty, another name) is verified under the provider its payload names; a forged one still fails', async () => {
    const env = JSON.parse(lines[7]!) as { payload: string; payloadType: string; signatures: { keyid?: string; sig: string }[] };
    for (const [name, sig] of [['no-keyid', { sig: env.signatures[0]!.sig }], ['empty-keyid', { keyid: '', sig: env.signatures[0]!.sig }], ['other-keyid', { keyid: 'my-key', sig: env.signatures[0]!.sig }]] as const) {
      const f = write(`r7-${name}.json`, JSON.stringify({ ...env, signatures: [sig] }));
      const r = await runCli(['verify', f]);
      expect({ code: r.code, out: r.stdout }, name).toMatchObject({ code: 0, out: expect.stringMatching(/^OK receipt: seq 7 by [0-9a-f]{64}/) });
    }
    const f = write('r7-no-keyid-flipped.json', JSON.stringify({ ...env, signatures: [{ sig: JSON.parse(flipSignatureBit(lines[7]!)).signatures[0].sig }] }));
    expectFail(await runCli(['verify', f]), /^FAIL receipt: signature_invalid: /m);
  });

  it('a file that is not valid UTF-8 is refused, receipt or bundle, never read with U+FFFD in its place', async () => {
    const receipt = Buffer.from(lines[7]!.replace(/}$/, ',"x":"XX"}'));
    receipt[receipt.length - 4] = 0xff;
    receipt[receipt.length - 3] = 0xfe;
    expectFail(await runCli(['verify', write('r7-bad-utf8.json', receipt)]), /^FAIL receipt: envelope_not_json: the envelope is not valid UTF-8$/m);
    const b = Buffer.from(bundle + '\u00e9');
    b[b.length - 1] = 0xff;
    expectFail(await runCli(['verify', write('bundle-bad-utf8.txt', b)]), /^FAIL bundle: bundle_malformed: the bundle is not valid UTF-8$/m);
  });

  it('a missing file is a clean error', async () => {
    const r = await runCli(['verify', path.join(tmp, 'no-such-file.json')]);
    expectCleanError(r, /cannot read .*no-such-file\.json: not found/, 1);
    expect(r.stdout).toBe('');
  });

  it('a directory is a clean error', async () => {
    expectCleanError(await runCli(['verify', tmp]), /cannot read .*: it is a folder/, 1);
  });

  it('a FIFO nobody writes to reads as empty at once, never waited on', async () => {
    const fifo = path.join(tmp, 'pipe.json');
    const { execFileSync } = await import('node:child_process');
    execFileSync('mkfifo', [fifo]);
    expectFail(await runCli(['verify', fifo]), /^FAIL receipt: envelope_not_json: /m);
  });

  it('a pipe is read to its end (the README\'s `verify <(sed -n 5p receipts.jsonl)`)', async () => {
    const f = write('piped.json', lines[3]!);
    const { execFileSync } = await import('node:child_process');
    // The writer starts late: the read waits for it, then for its end.
    const out = execFileSync('bash', ['-c', `${JSON.stringify(process.execPath)} ${JSON.stringify(CLI_BIN)} verify --provider ${id} <(sleep 0.3; cat ${JSON.stringify(f)})`], { encoding: 'utf8' });
    expect(out).toMatch(/^OK receipt: seq 3 /m);
  });

  it('a device is a clean error at once', async () => {
    expectCleanError(await runCli(['verify', '/dev/zero']), /cannot read \/dev\/zero: it is a device, not a regular file or a pipe/, 1);
  });

  it('an empty file is envelope_not_json', async () => {
    expectFail(await runCli(['verify', write('empty.json', '')]), /^FAIL receipt: envelope_not_json: /m);
  });

  it('binary garbage is envelope_not_json', async () => {
    const garbage = new Uint8Array(512);
    for (let i = 0; i < garbage.length; i++) garbage[i] = (i * 167 + 13) & 255;
    expectFail(await runCli(['verify', write('garbage.bin', garbage)]), /^FAIL receipt: envelope_not_json: /m);
  });

  it('a JSON value that is not an envelope is envelope_malformed', async () => {
    expectFail(await runCli(['verify', write('array.json', '[1,2]')]), /^FAIL receipt: envelope_malformed: /m);
  });

  it('a file over 8 MiB is refused with a clean error', async () => {
    const r = await runCli(['verify', write('huge.json', Buffer.alloc((8 << 20) + 1, 0x20))]);
    expectCleanError(r, /cannot read .*huge\.json: it holds 8388609 bytes, more than the 8388608 such a file may/, 1);
    // A pipe is read only up to the bound too.
    const { execFileSync } = await import('node:child_process');
    const piped = (() => {
      try {
        execFileSync('bash', ['-c', `${JSON.stringify(process.execPath)} ${JSON.stringify(CLI_BIN)} verify <(head -c 9000000 /dev/zero)`], { encoding: 'utf8', stdio: 'pipe' });
        return '';
      } catch (e) {
        return String((e as { stderr?: unknown }).stderr);
      }
    })();
    expect(piped).toMatch(/it holds more than the 8388608 bytes such a file may/);
  });
});

describe('audit of things that are not exports', () => {
  it('a nonexistent folder is export_missing_file', async () => {
    const r = await runCli(['audit', path.join(tmp, 'nope'), '--threads', '0']);
    expectFail(r, /^FAIL: export_missing_file: .*is not a directory/m);
    expect(r.stderr).toBe('');
  });

  it('a file instead of a folder is export_missing_file', async () => {
    const f = path.join(tmp, 'plain-file');
    fs.writeFileSync(f, 'x');
    expectFail(await runCli(['audit', f, '--threads', '0']), /^FAIL: export_missing_file: /m);
  });

  it('an empty folder is export_missing_file', async () => {
    const d = path.join(tmp, 'empty-dir');
    fs.mkdirSync(d);
    expectFail(await runCli(['audit', d, '--threads', '0']), /^FAIL: export_missing_file: provider\.pub is missing/m);
    const j = await runCli(['audit', d, '--json']);
    expect(j.code).toBe(1);
    expect(JSON.parse(j.stdout)).toMatchObject({ ok: false, fault: { code: 'export_missing_file' } });
  });

  it('garbage in receipts.jsonl is envelope_not_json at line 1', async () => {
    const d = path.join(tmp, 'garbage-export');
    fs.mkdirSync(d);
    fs.writeFileSync(path.join(d, 'provider.pub'), providerIdOf(randomSeed()) + '\n');
    const garbage = Buffer.alloc(4096);
    for (let i = 0; i < garbage.length; i++) garbage[i] = (i * 31 + 7) & 255;
    fs.writeFileSync(path.join(d, 'receipts.jsonl'), garbage);
    expectFail(await runCli(['audit', d]), /^FAIL at line 1: envelope_not_json: /m);
    const j = await runCli(['audit', d, '--json', '--threads', '0']);
    expect(j.code).toBe(1);
    expect(JSON.parse(j.stdout).fault).toMatchObject({ code: 'envelope_not_json', line: 1 });
  });

  it('garbage in provider.pub is export_malformed', async () => {
    const d = path.join(tmp, 'garbage-pub');
    fs.mkdirSync(d);
    fs.writeFileSync(path.join(d, 'provider.pub'), Buffer.from([0, 1, 2, 255, 254]));
    fs.writeFileSync(path.join(d, 'receipts.jsonl'), '');
    expectFail(await runCli(['audit', d, '--threads', '0']), /^FAIL: export_malformed: /m);
  });

  it('an empty receipts.jsonl is log_empty', async () => {
    const d = path.join(tmp, 'empty-log');
    fs.mkdirSync(d);
    fs.writeFileSync(path.join(d, 'provider.pub'), providerIdOf(randomSeed()) + '\n');
    fs.writeFileSync(path.join(d, 'receipts.jsonl'), '');
    expectFail(await runCli(['audit', d, '--threads', '0']), /^FAIL: log_empty: /m);
  });
});

describe('dev-model and demo', () => {
  it('dev-model writes the same tiny GGUF every time, and a different one for another seed', async ({ expect }) => {
    const dir = tempDir('seller-node-devmodel-');
    try {
      const a = await runCli(['dev-model', '--out', path.join(dir, 'a.gguf')]);
      const b = await runCli(['dev-model', '--out', path.join(dir, 'b.gguf')]);
      const c = await runCli(['dev-model', '--out', path.join(dir, 'c.gguf'), '--seed', '2']);
      for (const r of [a, b, c]) expect(r.code).toBe(0);
      const bytes = (f: string) => fs.readFileSync(path.join(dir, f));
      expect(bytes('a.gguf').subarray(0, 4).toString()).toBe('GGUF');
      expect(bytes('a.gguf').length).toBeGreaterThan(500_000);
      expect(bytes('a.gguf').equals(bytes('b.gguf'))).toBe(true);
      expect(bytes('a.gguf').equals(bytes('c.gguf'))).toBe(false);
      expect(a.stderr).toMatch(/sha256 [0-9a-f]{64}/);
      const bad = await runCli(['dev-model', '--out', path.join(dir, 'no-such-dir', 'x.gguf')]);
      expect(bad.code).toBe(1);
      expect(bad.stderr).toBe(`seller-node: cannot write --out ${path.join(dir, 'no-such-dir', 'x.gguf')}: no such folder: ${path.join(dir, 'no-such-dir')}\n`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('demo-receipts signs, exports, audits, verifies a proof and catches a tampered copy', async ({ expect }) => {
    const r = await runCli(['demo-receipts', '--count', '300'], { timeoutMs: 60_000 });
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/signed\s+300 receipts/);
    expect(r.stdout).toMatch(/audit\s+OK/);
    expect(r.stdout).toMatch(/offline proof\s+verifies/);
    expect(r.stdout).toMatch(/tampered copy\s+audit says: FAIL at seq 1: signature_invalid/);
  });

  it('demo (npm start) runs marketplace, node and gateway; a paid request goes through and is settled', async ({ expect }) => {
    const r = await runCli(['demo', '--smoke'], { timeoutMs: 90_000 });
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/gateway\s+http:\/\/127\.0\.0\.1:\d+\/v1/);
    expect(r.stdout).toMatch(/curl -s http:\/\/127\.0\.0\.1:\d+\/v1\/chat\/completions/);
    expect(r.stdout).toMatch(/smoke\s+200: \d+ tokens for 0\.\d{6} USD, request req-[0-9a-f-]+; market collected 1 receipt\(s\)/);
  });
});
