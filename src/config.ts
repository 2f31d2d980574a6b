// Node configuration: YAML, every key with a default (config.example.yaml documents them), then
// environment overrides, then validation. An invalid config is refused with the key and the
// problem, never half-applied.
//
// Environment: SELLER_NODE_<KEY>, nested keys joined by "__", e.g. SELLER_NODE_LOG_LEVEL=debug,
// SELLER_NODE_RECEIPTS__CHECKPOINT_EVERY=500, SELLER_NODE_MARKETPLACE__URL=http://…. Values are
// YAML scalars; lists and objects (listen, models, marketplace__public_keys) take YAML/JSON text,
// which replaces the file's whole list: list items cannot be set one by one (SELLER_NODE_MODELS__0__…).
import path from 'node:path';
import { multiaddr } from '@multiformats/multiaddr';
import YAML, { type YAMLError } from 'yaml';
import { isHex } from '../attestation/bytes.ts';
import { parseUsd } from '../attestation/money.ts';
import { MAX_WAIT_MS } from '../attestation/ticket.ts';
import { fsProblem } from './fs-problem.ts';
import { readTextFile } from './read-text-file.ts';
import { marketUrlProblem } from './market-url.ts';
import { MODEL_ID_MAX, MODEL_ID_RE, QUANT_MAX, QUANT_RE } from './market/registration-payload.ts';
import { parseHostPort, portAloneSuggestion, type HostPort } from './host-port.ts';
import { DIAL_ONLY_IDLE_CONNECTION_MS, MIN_NODE_IDLE_CONNECTION_MS, NODE_CONNECTION_LIMITS } from './p2p/connection-limits.ts';

export class ConfigError extends Error {
  override name = 'ConfigError';
  readonly key: string;
  readonly problem: string;
  constructor(key: string, problem: string) {
    super(key ? `config: ${key}: ${problem}` : `config: ${problem}`);
    this.key = key;
    this.problem = problem;
  }
}

const ADAPTERS = ['llama-embedded', 'llama-server', 'vllm', 'comfyui'] as const;
export type AdapterKind = (typeof ADAPTERS)[number];
export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal'] as const;

export interface ModelPrices {
  /** micro-USD per million input tokens (from a USD decimal in the file). */
  input_per_mtok: bigint;
  output_per_mtok: bigint;
}

export interface ModelConfig {
  id: string;
  adapter: AdapterKind;
  /** GGUF file for llama-embedded (absolute). */
  path: string | null;
  /** Runtime URL for the HTTP adapters. */
  url: string | null;
  /** The quantization bucket (lowercase, "_" → "-"); null: the GGUF file's own (general.file_type). */
  quantization: string | null;
  context: number;
  /** Whether `context` was set (not the default): the node warns when the model cannot serve it. */
  context_set?: boolean;
  prices: ModelPrices;
  slots: number;
  queue: number;
  /** How long a request may wait for a slot when the buyer set no X-Service-Max-Wait-Ms. */
  max_wait_ms: number;
  /** Whether llama.cpp maps the GGUF file (shared) instead of reading the weights into the node's own memory. */
  mmap: boolean;
  /** CPU threads of each evaluation (what the CPU computes: all of it without a GPU). */
  threads: number;
  /** llama-embedded: how long the start's load and run in a child process may take (model-probe.ts). */
  probe_timeout_s: number;
  /** llama-embedded: how long the tokenizer child may take over one long text before the request is refused (input_too_complex). */
  tokenize_timeout_s: number;
}

export interface NodeConfig {
  /** The folder the config file is in: relative paths resolve against it. */
  base: string;
  key: string;
  data_dir: string;
  listen: string[];
  marketplace: { url: string | null; public_keys: string[] };
  models: ModelConfig[];
  ops: { http: string };
  receipts: { checkpoint_every: number; checkpoint_interval_ms: number; signer_threads: number; min_free_mb: number };
  /** Connection limits of the libp2p host (src/p2p/connection-limits.ts; p2pHostLimits turns them into createHost's options). */
  p2p: P2pConfig;
  /** `auto`: llama.cpp on the host's GPU when it has one (CUDA, Vulkan, Metal), else the CPU; false: the CPU only. */
  gpu: 'auto' | false;
  log_level: (typeof LOG_LEVELS)[number];
  /** On SIGTERM or SIGINT, how long requests still running may take before they are cancelled (seconds). */
  stop_grace_s: number;
}

export interface P2pConfig {
  max_connections: number;
  max_connections_per_ip: number;
  max_pending_connections: number;
  handshake_timeout_ms: number;
  new_connections_per_ip_per_second: number;
  /** 0: never. */
  idle_connection_ms: number;
}

const P2P_DEFAULTS: P2pConfig = {
  max_connections: NODE_CONNECTION_LIMITS.maxConnections,
  max_connections_per_ip: NODE_CONNECTION_LIMITS.maxConnectionsPerIp,
  max_pending_connections: NODE_CONNECTION_LIMITS.maxPendingConnections,
  handshake_timeout_ms: NODE_CONNECTION_LIMITS.handshakeTimeoutMs,
  new_connections_per_ip_per_second: NODE_CONNECTION_LIMITS.newConnectionsPerIpPerSecond,
  idle_connection_ms: NODE_CONNECTION_LIMITS.idleConnectionMs,
};

/** The config's `p2p` limits as createHost's options (src/p2p/host.ts). */
export function p2pHostLimits(p: P2pConfig) {
  return {
    maxConnections: p.max_connections,
    maxConnectionsPerIp: p.max_connections_per_ip,
    maxPendingConnections: p.max_pending_connections,
    handshakeTimeoutMs: p.handshake_timeout_ms,
    newConnectionsPerIpPerSecond: p.new_connections_per_ip_per_second,
    idleConnectionMs: p.idle_connection_ms,
  };
}

const DEFAULTS = {
  key: './node.key',
  data_dir: '.',
  listen: ['/ip4/0.0.0.0/tcp/4101'],
  marketplace: { url: null, public_keys: [] },
  models: [],
  ops: { http: '127.0.0.1:9464' },
  receipts: { checkpoint_every: 1000, checkpoint_interval_ms: 10_000, signer_threads: 2, min_free_mb: 256 },
  p2p: P2P_DEFAULTS,
  gpu: 'auto',
  log_level: 'info',
  stop_grace_s: 30,
};

/** The config `seller-node init` writes: the keys an operator edits first. */
export function defaultConfigYaml(): string {
  return [
    '# seller-node configuration. config.example.yaml documents every key and its default.',
    'key: ./node.key',
    'data_dir: .',
    'marketplace:',
    '  url: null',
    '  public_keys: []',
    '# At least one model to sell, before `seller-node start` (see config.example.yaml), e.g.:',
    '#   - id: tiny/llama',
    '#     adapter: llama-embedded',
    '#     path: ./tiny.gguf',
    '#     prices: { input_per_mtok_usd: "0.15", output_per_mtok_usd: "0.60" }',
    'models: []',
    'log_level: info',
    '',
  ].join('\n');
}

const OPS_HTTP_EXPECTED = 'expected host:port with a port up to 65535, e.g. 127.0.0.1:9464';

const MODEL_DEFAULTS = { path: null, url: null, quantization: null, context: 4096, slots: 1, queue: 16, max_wait_ms: 30_000, mmap: false, threads: 1, probe_timeout_s: 600, tokenize_timeout_s: 10 };

type Raw = Record<string, unknown>;

/** Reads, overrides from the environment, validates. Throws ConfigError. */
export function loadConfig(file: string, env: NodeJS.ProcessEnv = process.env): NodeConfig {
  let text: string;
  try {
    text = readTextFile(file, { pipes: true }); // (a pipe too: --config <(envsubst < config.yaml))
  } catch (e) {
    const missing = (e as NodeJS.ErrnoException).code === 'ENOENT';
    throw new ConfigError('', `cannot read ${file}: ${fsProblem(e)}${missing ? ' (seller-node init --data DIR writes one)' : ''}`);
  }
  return parseConfig(text, path.dirname(path.resolve(file)), env, file);
}

/** `source`: the file the text came from, named in the messages about the YAML itself. */
export function parseConfig(text: string, base: string, env: NodeJS.ProcessEnv = {}, source?: string): NodeConfig {
  const doc = YAML.parseDocument(text, { uniqueKeys: true });
  if (doc.errors.length) throw yamlProblem(doc.errors[0]!, text, source);
  // (An unknown tag, `log_level: !foo debug`, is only a warning to the yaml library, which drops
  // the tag: refused, as nothing in a config is ignored: s23 h7.)
  if (doc.warnings.length) throw yamlProblem(doc.warnings[0]!, text, source);
  let raw: unknown;
  try {
    raw = (exactDecimals(doc).toJS() ?? {}) as unknown;
  } catch (e) {
    // (an alias whose anchor is missing or comes later: the parse took it, turning it into a value cannot)
    throw new ConfigError('', `not valid YAML in ${source ?? 'the configuration'}: ${(e as Error).message}`);
  }
  if (!isObject(raw)) throw new ConfigError('', `${source ?? 'the file'} must hold a YAML mapping`);
  const fromEnv = applyEnv(raw, env);
  try {
    return validate(raw, base);
  } catch (e) {
    // A value that came from the environment is not in the file: say where it came from.
    const name = e instanceof ConfigError ? [...fromEnv].find(([k]) => e.key === k || e.key.startsWith(`${k}.`) || e.key.startsWith(`${k}[`))?.[1] : undefined;
    throw name === undefined ? e : new ConfigError((e as ConfigError).key, `${(e as ConfigError).problem} (from environment variable ${name})`);
  }
}

/** The ops HTTP server's address (config.ops.http, checked by parseConfig) as host and port. */
export function opsHostPort(config: Pick<NodeConfig, 'ops'>): HostPort {
  const hp = parseHostPort(config.ops.http);
  if (!hp) throw new ConfigError('ops.http', OPS_HTTP_EXPECTED);
  return hp;
}

/**
 * One line: where (file, line, column), the yaml library's reason without its trailing " at line
 * N, column M:" and excerpt, then the offending line as written (trimmed, at most 80 characters).
 */
function yamlProblem(e: YAMLError, text: string, source: string | undefined): ConfigError {
  const reason = e.message.split('\n')[0]!.replace(/ at line \d+, column \d+:?$/, '').replace(/:$/, '');
  const at = e.linePos?.[0];
  const where = `${source === undefined ? '' : ` in ${source}`}${at ? ` at line ${at.line}, column ${at.col}` : ''}`;
  const line = at ? text.split('\n')[at.line - 1]?.trim() : undefined;
  const shown = line ? `; line ${at!.line} reads ${JSON.stringify(line.length > 80 ? `${line.slice(0, 79)}…` : line)}` : '';
  return new ConfigError('', `not valid YAML${where}: ${reason}${shown}`);
}

function isObject(v: unknown): v is Raw {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** Applies the overrides; returns the keys they set (dotted) and the variables that set them. */
function applyEnv(raw: Raw, env: NodeJS.ProcessEnv): Map<string, string> {
  const applied = new Map<string, string>();
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith('SELLER_NODE_') || value === undefined) continue;
    const keys = name.slice('SELLER_NODE_'.length).toLowerCase().split('__');
    // A list (listen, models, marketplace.public_keys) is set whole: SELLER_NODE_MODELS__0__SLOTS has no place to go.
    const listAt = keys.findIndex((_, i) => i > 0 && Array.isArray(keys.slice(0, i).reduce<unknown>((node, k) => (isObject(node) ? node[k] : undefined), DEFAULTS)));
    if (listAt > 0) {
      const key = keys.slice(0, listAt).join('.') + keys.slice(listAt).map((k) => (/^[0-9]+$/.test(k) ? `[${k}]` : `.${k}`)).join('');
      const whole = name.split('__').slice(0, listAt).join('__');
      throw new ConfigError(key, `list items cannot be set one by one (environment variable ${name}); set the whole list as YAML/JSON in ${whole}, which replaces the file's list`);
    }
    const known = keys.reduce<unknown>((node, k) => (isObject(node) ? node[k] : undefined), DEFAULTS);
    if (known === undefined && !(keys.length === 2 && keys[0] === 'marketplace' && keys[1] === 'url')) {
      throw new ConfigError(keys.join('.'), `unknown key (from environment variable ${name})`);
    }
    // An empty variable (docker-compose's `X=${UNSET}`, `export X=`) is YAML null, which for
    // marketplace.url silently turns registration off: refused, as no value at all (s23 h7).
    if (value.trim() === '') throw new ConfigError(keys.join('.'), `environment variable ${name} is set but empty: unset it to keep the file's value, or write null for none`);
    let parsed: unknown;
    try {
      const d = YAML.parseDocument(value);
      if (d.errors.length) throw d.errors[0];
      if (d.warnings.length) throw d.warnings[0];
      parsed = exactDecimals(d).toJS();
    } catch {
      throw new ConfigError(keys.join('.'), `environment variable ${name} is not a valid value`);
    }
    let node = raw;
    for (const [i, k] of keys.slice(0, -1).entries()) {
      // A section the file gives as something else is the file's error, not the variable's to hide (s29 review).
      if (node[k] !== undefined && node[k] !== null && !isObject(node[k])) throw new ConfigError(keys.slice(0, i + 1).join('.'), 'expected a mapping');
      if (!isObject(node[k])) node[k] = {};
      node = node[k] as Raw;
    }
    node[keys.at(-1)!] = parsed;
    applied.set(keys.join('.'), name);
  }
  return applied;
}

function only(o: Raw, where: string, allowed: readonly string[]): void {
  for (const k of Object.keys(o)) if (!allowed.includes(k)) throw new ConfigError(where ? `${where}.${k}` : k, 'unknown key');
}

function str(v: unknown, key: string): string {
  if (typeof v !== 'string' || v.length === 0) throw new ConfigError(key, 'expected a non-empty string');
  return v;
}

function bool(v: unknown, key: string): boolean {
  if (typeof v !== 'boolean') throw new ConfigError(key, 'expected true or false');
  return v;
}

function int(v: unknown, key: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) throw new ConfigError(key, `expected a whole number from ${min} to ${max}`);
  return v;
}

/**
 * Decimal literals written without quotes keep their text: YAML reads them as doubles, which would
 * silently change a price of more than 15 significant digits (99999999999.999999 → 100000000000),
 * and money never goes through floating point (design.md, Money); so do integers beyond 2^53. A
 * key that wants a whole number refuses such text.
 */
function exactDecimals(doc: YAML.Document): YAML.Document {
  YAML.visit(doc, {
    Scalar(_key, node) {
      if (typeof node.value !== 'number' || node.type !== 'PLAIN' || typeof node.source !== 'string') return;
      // Only where the double lost something: "8192.0" and "0.15" stay numbers, as before. A
      // number written otherwise (1e2, 0x10, .inf) keeps its text too, which no key takes: a price
      // would otherwise go through a double (99999999999.999999e0 read as 100000000000: s23 h7).
      const plain = /^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)$/.test(node.source);
      if (!plain || decimalText(node.source) !== decimalText(String(node.value))) node.value = node.source;
    },
  });
  return doc;
}

/** A plain decimal without its sign "+", leading zeros or trailing fraction zeros ("007.50" → "7.5"); other text as it is. */
function decimalText(s: string): string {
  const m = /^([-+]?)([0-9]*)(?:\.([0-9]*))?$/.exec(s);
  if (!m) return s;
  const int = m[2]!.replace(/^0+(?=[0-9])/, '') || '0';
  const frac = (m[3] ?? '').replace(/0+$/, '');
  return `${m[1] === '-' ? '-' : ''}${int}${frac ? `.${frac}` : ''}`;
}

function usdRate(v: unknown, key: string): bigint {
  // Prices are written as USD decimals per million tokens; YAML numbers would be floats, so take
  // the text of a number only when it is plain, and convert exactly.
  const s = typeof v === 'number' ? String(v) : v;
  const micro = typeof s === 'string' ? parseUsd(s) : undefined;
  if (micro === undefined) throw new ConfigError(key, 'expected a USD amount like "0.15" (at most 6 decimals)');
  return micro;
}

/**
 * A multiaddr the node can listen on, in its canonical text. The node's libp2p host has the TCP
 * transport only (src/p2p/host.ts), which would drop any other address at start, after the models
 * loaded: /ip4 or /ip6, then /tcp, nothing more.
 */
function tcpListenAddr(v: unknown, key: string): string {
  const example = 'expected a TCP multiaddr like /ip4/0.0.0.0/tcp/4101 or /ip6/::/tcp/4101';
  if (typeof v !== 'string' || !v.startsWith('/')) throw new ConfigError(key, example);
  let parts: { name: string }[];
  let text: string;
  try {
    const ma = multiaddr(v);
    parts = ma.getComponents();
    text = ma.toString();
  } catch (e) {
    throw new ConfigError(key, `not a multiaddr: ${(e as Error).message} (${example})`);
  }
  const names = parts.map((c) => c.name).join('/');
  if (names !== 'ip4/tcp' && names !== 'ip6/tcp') throw new ConfigError(key, `${text}: the node listens with TCP only: ${example}`);
  return text;
}

/** The `p2p` mapping: each key a whole number in its range, the per-address cap within the whole. */
function p2pLimits(v: unknown): P2pConfig {
  if (!isObject(v)) throw new ConfigError('p2p', 'expected a mapping');
  only(v, 'p2p', Object.keys(P2P_DEFAULTS));
  const p = { ...P2P_DEFAULTS, ...v };
  const max = int(p.max_connections, 'p2p.max_connections', 1, 100_000);
  const idle = int(p.idle_connection_ms, 'p2p.idle_connection_ms', 0, 86_400_000);
  // A gateway closes its own idle connections after DIAL_ONLY_IDLE_CONNECTION_MS: a node that closed
  // one sooner could close it just as the gateway sent a request on it, which that request would lose.
  if (idle !== 0 && idle < MIN_NODE_IDLE_CONNECTION_MS) {
    throw new ConfigError('p2p.idle_connection_ms', `expected 0 (never) or a whole number from ${MIN_NODE_IDLE_CONNECTION_MS} to 86400000: gateways close their own idle connections after ${DIAL_ONLY_IDLE_CONNECTION_MS} ms, and a node must not close one first`);
  }
  const perIp = int(p.max_connections_per_ip, 'p2p.max_connections_per_ip', 1, 100_000);
  if (perIp > max) throw new ConfigError('p2p.max_connections_per_ip', `${perIp} is more than p2p.max_connections (${max}): expected at most that`);
  return {
    max_connections: max,
    max_connections_per_ip: perIp,
    max_pending_connections: int(p.max_pending_connections, 'p2p.max_pending_connections', 1, 100_000),
    handshake_timeout_ms: int(p.handshake_timeout_ms, 'p2p.handshake_timeout_ms', 500, 60_000),
    new_connections_per_ip_per_second: int(p.new_connections_per_ip_per_second, 'p2p.new_connections_per_ip_per_second', 1, 100_000),
    idle_connection_ms: idle,
  };
}

function validate(raw: Raw, base: string): NodeConfig {
  only(raw, '', Object.keys(DEFAULTS));
  const pick = <T>(k: keyof typeof DEFAULTS): T => (raw[k] === undefined ? DEFAULTS[k] : raw[k]) as T;
  const resolve = (p: string) => path.resolve(base, p);

  const listen = pick<unknown>('listen');
  if (!Array.isArray(listen) || listen.length === 0) throw new ConfigError('listen', 'expected a list of multiaddrs');
  const listenAddrs = listen.map((a, i) => tcpListenAddr(a, `listen[${i}]`));
  listenAddrs.forEach((a, i) => {
    const first = listenAddrs.indexOf(a);
    if (first < i) throw new ConfigError(`listen[${i}]`, `${a} is listed already (listen[${first}]): the node would bind it twice and fail as if another process held it`);
  });

  const mp = pick<unknown>('marketplace');
  if (!isObject(mp)) throw new ConfigError('marketplace', 'expected a mapping');
  only(mp, 'marketplace', ['url', 'public_keys']);
  const url = mp.url ?? null;
  if (url !== null) {
    const problem = marketUrlProblem(str(url, 'marketplace.url'));
    if (problem) throw new ConfigError('marketplace.url', problem);
  }
  const keys = mp.public_keys ?? [];
  if (!Array.isArray(keys)) throw new ConfigError('marketplace.public_keys', 'expected a list of 64-hex Ed25519 public keys');
  keys.forEach((k, i) => {
    if (!isHex(k, 32)) throw new ConfigError(`marketplace.public_keys[${i}]`, 'expected 64 lowercase hex characters');
  });

  const models = pick<unknown>('models');
  if (!Array.isArray(models)) throw new ConfigError('models', 'expected a list');
  const ids = new Set<string>();
  const parsedModels = models.map((m, i) => {
    const where = `models[${i}]`;
    if (!isObject(m)) throw new ConfigError(where, 'expected a mapping');
    only(m, where, ['id', 'adapter', 'path', 'url', 'quantization', 'context', 'prices', 'slots', 'queue', 'max_wait_ms', 'mmap', 'threads', 'probe_timeout_s', 'tokenize_timeout_s']);
    const full: Raw = { ...MODEL_DEFAULTS, ...m };
    const id = str(full.id, `${where}.id`);
    if (id.length > MODEL_ID_MAX || !MODEL_ID_RE.test(id)) throw new ConfigError(`${where}.id`, `"${id.slice(0, 64)}" is not a model id: letters, digits and . _ : @ + / -, starting with a letter or digit, at most ${MODEL_ID_MAX} characters (e.g. vendor/model)`);
    if (ids.has(id)) throw new ConfigError(`${where}.id`, `"${id}" is listed twice`);
    ids.add(id);
    if (!ADAPTERS.includes(full.adapter as AdapterKind)) throw new ConfigError(`${where}.adapter`, `expected one of ${ADAPTERS.join(', ')}`);
    const adapter = full.adapter as AdapterKind;
    const file = full.path === null ? null : resolve(str(full.path, `${where}.path`));
    if (adapter === 'llama-embedded' && file === null) throw new ConfigError(`${where}.path`, 'the llama-embedded adapter needs the GGUF file');
    const murl = full.url === null ? null : str(full.url, `${where}.url`);
    if (adapter !== 'llama-embedded' && murl === null) throw new ConfigError(`${where}.url`, `the ${adapter} adapter needs the runtime's URL`);
    const quantization = full.quantization === null ? null : str(full.quantization, `${where}.quantization`).toLowerCase().replaceAll('_', '-');
    // (Left out, the start takes the GGUF file's: node.ts.)
    if (quantization !== null && (quantization.length > QUANT_MAX || !QUANT_RE.test(quantization))) throw new ConfigError(`${where}.quantization`, `"${quantization.slice(0, 64)}" is not a quantization bucket: letters, digits, ".", "-" and "_", starting with a letter or digit, at most ${QUANT_MAX} characters (e.g. q4_k_m, f16)`);
    const prices = full.prices;
    if (!isObject(prices)) throw new ConfigError(`${where}.prices`, 'expected input_per_mtok_usd and output_per_mtok_usd');
    only(prices, `${where}.prices`, ['input_per_mtok_usd', 'output_per_mtok_usd']);
    return {
      id,
      adapter,
      path: file,
      url: murl,
      quantization,
      context: int(full.context, `${where}.context`, 16, 4294967295),
      context_set: m.context !== undefined && m.context !== null,
      prices: {
        input_per_mtok: usdRate(prices.input_per_mtok_usd, `${where}.prices.input_per_mtok_usd`),
        output_per_mtok: usdRate(prices.output_per_mtok_usd, `${where}.prices.output_per_mtok_usd`),
      },
      // (llama.cpp takes at most 256 sequences a context: more failed at start, blamed on memory)
      slots: int(full.slots, `${where}.slots`, 1, 256),
      queue: int(full.queue, `${where}.queue`, 0, 100_000),
      max_wait_ms: int(full.max_wait_ms, `${where}.max_wait_ms`, 0, MAX_WAIT_MS),
      mmap: bool(full.mmap, `${where}.mmap`),
      threads: int(full.threads, `${where}.threads`, 1, 1024),
      probe_timeout_s: int(full.probe_timeout_s, `${where}.probe_timeout_s`, 1, 86_400),
      tokenize_timeout_s: int(full.tokenize_timeout_s, `${where}.tokenize_timeout_s`, 1, 600),
    };
  });

  const ops = pick<unknown>('ops');
  if (!isObject(ops)) throw new ConfigError('ops', 'expected a mapping');
  only(ops, 'ops', ['http']);
  const http: unknown = ops.http ?? DEFAULTS.ops.http;
  if (typeof http !== 'string' || !parseHostPort(http)) {
    const alone = portAloneSuggestion(http);
    const hint = alone === undefined ? '' : typeof http === 'number' ? `; got the number ${http}: write the string "${alone}"` : `; got "${http}", a port alone: write "${alone}"`;
    throw new ConfigError('ops.http', OPS_HTTP_EXPECTED + hint);
  }

  const rc = pick<unknown>('receipts');
  if (!isObject(rc)) throw new ConfigError('receipts', 'expected a mapping');
  only(rc, 'receipts', Object.keys(DEFAULTS.receipts));
  const r = { ...DEFAULTS.receipts, ...rc };

  const p2p = p2pLimits(pick<unknown>('p2p'));

  const gpu = pick<unknown>('gpu');
  if (gpu !== 'auto' && gpu !== false) throw new ConfigError('gpu', 'expected auto (the GPU when the host has one) or false (the CPU only)');

  const level = pick<unknown>('log_level');
  if (!LOG_LEVELS.includes(level as (typeof LOG_LEVELS)[number])) throw new ConfigError('log_level', `expected one of ${LOG_LEVELS.join(', ')}`);

  return {
    base,
    key: resolve(str(pick('key'), 'key')),
    data_dir: resolve(str(pick('data_dir'), 'data_dir')),
    listen: listenAddrs,
    marketplace: { url: url as string | null, public_keys: keys as string[] },
    models: parsedModels,
    ops: { http },
    receipts: {
      checkpoint_every: int(r.checkpoint_every, 'receipts.checkpoint_every', 1, 10_000_000),
      checkpoint_interval_ms: int(r.checkpoint_interval_ms, 'receipts.checkpoint_interval_ms', 0, 86_400_000),
      signer_threads: int(r.signer_threads, 'receipts.signer_threads', 0, 64),
      min_free_mb: int(r.min_free_mb, 'receipts.min_free_mb', 0, 1 << 30),
    },
    p2p,
    gpu,
    log_level: level as NodeConfig['log_level'],
    stop_grace_s: int(pick<unknown>('stop_grace_s'), 'stop_grace_s', 1, 3600),
  };
}
