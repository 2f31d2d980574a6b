// The node: everything `seller-node start` runs, composed from its parts and stopped in order.
// Config → identity → receipt log, state, runtimes → serving core → libp2p → ops HTTP.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { LlamaThreadAdapter } from '../adapters/runtime-thread.ts';
import { namingModelFile, sendLlamaLines } from '../adapters/llama-load-errors.ts';
import type { RuntimeAdapter } from '../adapters/runtime-adapter.ts';
import { signPriceList } from '../attestation/price-list.ts';
import { opsHostPort, p2pHostLimits, type NodeConfig } from './config.ts';
import { readPriceList, savePriceList } from './data-dir.ts';
import { LOCK_FILE, lockDataDir } from './data-dir-lock.ts';
import { Admission } from './dispatch/admission.ts';
import { IdempotencyStore } from './dispatch/idempotency.ts';
import { TicketGate } from './dispatch/ticket-gate.ts';
import { folderProblem, fsProblem, isErrnoError } from './fs-problem.ts';
import { loadKeyFile } from './identity.ts';
import { KeyFileWatch } from './key-watch.ts';
import { withProbeTimeoutHint } from '../adapters/model-probe.ts';
import { dataDirProbeMemo } from './model-probe-memo.ts';
import { createLogger, type Logger } from './ops/logger.ts';
import { LineBudget } from './ops/line-budget.ts';
import { createMetrics } from './ops/metrics.ts';
import { createOpsServer, type HealthResult, type ReadyResult } from './ops/server.ts';
import { createHost } from './p2p/host.ts';
import { tryListenAddresses } from './p2p/listen-check.ts';
import { serveInfer } from './p2p/infer-protocol.ts';
import { serveLog } from './p2p/log-protocol.ts';
import { serveCapacity, signCapacity } from './p2p/capacity-protocol.ts';
import type { RequestServer } from './p2p/request-stream.ts';
import { untilQuiet } from './p2p/request-server.ts';
import { readiness, startRegistration, workRefused, type Registration } from './registration.ts';
import { InferService, modelFileModified, NodeStopping, type ServedModel } from './serve/infer-service.ts';
import { ReceiptLog } from './store/receipt-log.ts';
import { DatabaseRescue } from './store/file-guard.ts';
import { SqliteSeal } from './store/sqlite-seal.ts';
import { DescriptorWatch } from './ops/descriptor-watch.ts';
import { RepeatLimit } from './ops/repeat-limit.ts';
import { openStateDb } from './store/state-db.ts';
import { CloseGuard } from './store/close-guard.ts';
import { FALLBACK_CHECKPOINT_PAGES, WalCheckpointer } from './store/wal-checkpointer.ts';
import { StoreHealth, StoreStopped } from './store/store-health.ts';
import { stopStep } from './stop-step.ts';
import { ratesToWire } from '../attestation/receipt.ts';
import { signTextRequestContracts } from './serve/request-contract.ts';
import { endpointsServed, PAID_ENDPOINTS } from './serve/contract.ts';
import { makeFolder } from './make-folder.ts';
import { listenProblem, listenWhy } from './host-port.ts';
import { NodeStartError, NodeStartStopped, unlessStopped } from './start-errors.ts';

/** How long a stop waits, once the runtimes have stopped, for the requests they ran to log their receipts. */
const STOP_RECEIPTS_MS = 10_000;
/** How long requests a stop cancelled have to write their last frames and receipts (their trailers) before their streams are reset. */
const STOP_CANCEL_MS = 3000;
/** At stop, how long the protocols must have been idle before the connections close (untilQuiet), and the most it waits for that. */
const STOP_QUIET_MS = 200;
const STOP_QUIET_MAX_MS = 2000;

/** Log lines of refused requests a second, at most (the rest are counted: LineBudget). */
const REFUSAL_LINES_PER_SECOND = 50;

/**
 * One round of the state pruner: each step runs, and one that fails (state.db busy or broken) is
 * logged and tried again next round; it never reaches the timer, where it would end the process.
 */
export function pruneState(steps: readonly (() => unknown)[], logger: Pick<Logger, 'warn'>): void {
  for (const step of steps) {
    try {
      step();
    } catch (e) {
      logger.warn({ err: e instanceof Error ? e.message : String(e) }, 'state pruning failed; tried again in a minute');
    }
  }
}

/**
 * The node's data dir exists (it is made if missing), is a folder, and this user may write in it;
 * else a NodeStartError naming the folder and why (SQLite's own "unable to open database file"
 * names neither).
 */
function checkDataDir(dir: string): void {
  try {
    // (made for this user only: state.db holds recorded answers; an existing folder keeps its mode)
    makeFolder(dir, 0o700);
  } catch (e) {
    throw new NodeStartError(`data_dir: ${path.resolve(dir)}: ${folderProblem(e)}`, { cause: e });
  }
  try {
    fs.accessSync(dir, fs.constants.W_OK | fs.constants.X_OK);
  } catch (e) {
    throw new NodeStartError(`data_dir: ${path.resolve(dir)}: this user (uid ${process.getuid?.() ?? '?'}) may not write in it`, { cause: e });
  }
}

/** A data dir file the node could not use: the message names the file (SQLite's own does not). */
function dataDirError(file: string, e: unknown): NodeStartError {
  const abs = path.resolve(file);
  if (isErrnoError(e)) return new NodeStartError(`data_dir: ${abs}: ${fsProblem(e)}`, { cause: e });
  const msg = (e as Error).message ?? String(e);
  return new NodeStartError(`data_dir: ${msg.includes(abs) || msg.includes(file) ? msg : `${abs}: ${msg}`}`, { cause: e });
}

/** Why the file system of `dir` is too full for paid work (less than `minFreeMb` MiB free), or undefined. */
export function lowDisk(dir: string, minFreeMb: number): string | undefined {
  if (minFreeMb <= 0) return undefined;
  let free: number;
  try {
    const st = fs.statfsSync(dir);
    free = st.bavail * st.bsize;
  } catch {
    return undefined; // (a data dir that cannot be asked is found out by its writes)
  }
  const mb = Math.floor(free / 2 ** 20);
  return mb < minFreeMb ? `the data dir's file system has ${mb} MiB free, less than receipts.min_free_mb (${minFreeMb} MiB)` : undefined;
}

const reportedFileStates = new WeakMap<object, string>();
/** Says once when a model's file was modified in place under a mapping (the model is refused from then on) or otherwise changed (served on: the weights loaded are intact). */
export function watchModelFiles(models: Iterable<Pick<ServedModel, 'id' | 'adapter'>>, logger: Pick<Logger, 'warn' | 'error'>): void {
  for (const m of models) {
    const state = m.adapter.modelFileState?.() ?? 'unchanged';
    if (state === 'unchanged' || reportedFileStates.get(m.adapter) === state) continue;
    reportedFileStates.set(m.adapter, state);
    if (state === 'modified') logger.error({ model: m.id, model_sha256: m.adapter.info.modelSha256 }, `${modelFileModified(m).message}: its requests are refused (503 no_capacity) until then`);
    else logger.warn({ model: m.id, model_sha256: m.adapter.info.modelSha256 }, `model ${m.id}: its file was changed, deleted or replaced; the node serves on with the weights it loaded (model_sha256 ${m.adapter.info.modelSha256}) until it restarts`);
  }
}

/** libp2p's "some addresses failed" error, cut to the address and the reason, without its stack or its config advice. */
export function listenFailure(e: Error): string {
  const failed = [...(e.message ?? '').matchAll(/^\s*(\/\S+): (?:\w*Error: )?(.+)$/gm)].map((m) => {
    const why = listenWhy(/\b(E[A-Z]+)\b/.exec(m[2]!)?.[1], 'pick another in listen') ?? m[2]!.trim();
    return `${m[1]}: ${why}`;
  });
  return failed.length ? failed.join('; ') : (e.message ?? String(e)).split('\n')[0]!;
}

export { NodeStartError, NodeStartStopped } from './start-errors.ts';

export interface RunningNode {
  providerId: string;
  peerId: string;
  addresses: string[];
  opsUrl: string;
  priceVersion: string;
  logger: Logger;
  /** Stops admitting, lets in-flight requests finish (bounded), flushes receipts, closes. */
  stop(graceMs?: number): Promise<void>;
}

/** Measured generation speed, for the min-throughput routing control and registration. */
async function measureTokensPerSecond(adapter: RuntimeAdapter, signal?: AbortSignal): Promise<number> {
  const t0 = performance.now();
  const gen = adapter.generate({ input: { kind: 'prompt', prompt: 'the' }, maxTokens: 64, sampling: { temperature: 0, seed: 0 }, ...(signal ? { signal } : {}) });
  let n = 0;
  for (;;) {
    const r = await gen.next();
    if (r.done) break;
    n += r.value.tokens.length;
  }
  const s = (performance.now() - t0) / 1000;
  return n > 0 && s > 0 ? Math.round(n / s) : 0;
}

/** An error as a log line carries it: name, code and a short message (never request text). */
function errSummary(err: unknown): { name: unknown; code: unknown; message: string | undefined } {
  const e = err as { name?: unknown; code?: unknown; message?: unknown } | null;
  return { name: e?.name, code: e?.code, message: typeof e?.message === 'string' ? e.message.slice(0, 200) : undefined };
}

/**
 * Starts the node. `signal` stops the start (the operator's SIGTERM during a model load): what was
 * opened is closed and NodeStartStopped thrown, at once even while a model loads.
 */
export async function startNode(config: NodeConfig, opts: { logDestination?: number; signal?: AbortSignal; /** Runs the models on this thread, not the runtime thread: for tests that patch node-llama-cpp in this process. */ runtimeOnThisThread?: boolean } = {}): Promise<RunningNode> {
  // Every model is checked before anything starts: a bad second model fails at once, not after the first loaded.
  if (config.models.length === 0) throw new NodeStartError('config: models: a node needs at least one model to sell');
  for (const m of config.models) {
    if (m.adapter !== 'llama-embedded') throw new NodeStartError(`models: ${m.id}: the ${m.adapter} adapter is not available in this version`);
    if (!fs.existsSync(m.path!)) throw new NodeStartError(`models: ${m.id}: model file ${m.path} not found (seller-node dev-model --out FILE writes a tiny test model)`);
  }
  const logger = createLogger({ level: config.log_level, ...(opts.logDestination !== undefined ? { destination: opts.logDestination } : {}) });
  const identity = loadKeyFile(config.key);
  checkDataDir(config.data_dir);
  const models = new Map<string, ServedModel>();
  // Shutdown steps, named: one that hangs is reported by name (see stopStep), and undone in reverse.
  const cleanup: [string, () => Promise<void> | void][] = [];
  const undo = async () => {
    // Taken out as they run, so that each runs once.
    for (const [name, c] of cleanup.splice(0).reverse()) await stopStep(logger, name, c);
  };
  try {
    // llama.cpp's own lines (a load's errors) as lines of the node's JSON log, not raw text among them.
    cleanup.push(['llama.cpp lines', sendLlamaLines((line) => logger.warn({ line: line.slice(0, 500) }, 'llama.cpp'))]);
    // The data dir first: its lock, the price list, the receipt log and the state database are
    // checked before any model loads, so a folder problem is named at once, not after the load.
    try {
      const lock = lockDataDir(config.data_dir);
      cleanup.push(['data dir lock', () => lock.release()]);
    } catch (e) {
      throw dataDirError(path.join(config.data_dir, LOCK_FILE), e);
    }
    const prices = signPriceList(
      identity.seed,
      identity.providerId,
      config.models.map((m) => ({ model: m.id, ...ratesToWire(m.prices) })),
    );
    // Kept before any receipt cites its version, so `log export` can hand auditors every list.
    try {
      savePriceList(config.data_dir, prices);
    } catch (e) {
      throw dataDirError(path.join(config.data_dir, 'prices'), e);
    }
    let log: ReceiptLog;
    try {
      log = ReceiptLog.open({
        path: path.join(config.data_dir, 'receipts.db'),
        seed: identity.seed,
        threads: config.receipts.signer_threads,
        checkpointEvery: config.receipts.checkpoint_every,
        checkpointIntervalMs: config.receipts.checkpoint_interval_ms,
        onNotice: (m, level) => (level === 'error' ? logger.error(m) : logger.warn(m)),
      });
    } catch (e) {
      throw dataDirError(path.join(config.data_dir, 'receipts.db'), e);
    }
    cleanup.push(['receipt log', () => log.close()]);
    let db: ReturnType<typeof openStateDb>;
    const statePath = path.join(config.data_dir, 'state.db');
    const stateExisted = fs.existsSync(statePath);
    try {
      db = openStateDb(statePath);
    } catch (e) {
      throw dataDirError(statePath, e);
    }
    // Its files changed in place by another program (a cut -wal, an older copy written over it) are
    // noticed too (sqlite-seal.ts): every checkpoint of it runs through the seal.
    // Its guard is closed after the connection once its files were changed in place, so that the
    // connection's close checkpoints nothing into them (close-guard.ts).
    let stateSeal: SqliteSeal | undefined;
    let stateGuard: CloseGuard;
    try {
      stateSeal = SqliteSeal.attach(statePath);
      stateGuard = CloseGuard.open(statePath);
    } catch (e) {
      db.close();
      stateSeal?.release(); // (after the connection: see sqlite-seal.ts)
      throw dataDirError(statePath, e);
    }
    /** The file check, once it is set up below (run once more at close). */
    let checkStateAtClose: (() => void) | undefined;
    const stateFiles = new DatabaseRescue(
      db,
      statePath,
      () => 'its used tickets and Idempotency-Key records',
      () => `restore ${statePath} from a backup, or start without one after a minute (the tickets used since have expired by then); the Idempotency-Key records written since are lost: a retry under one of those keys would be run, and billed, again.`,
      stateSeal,
    );
    if (!stateExisted && log.size > 0) {
      logger.error({ receipts: log.size }, `${statePath} was not there and has been created anew, though the receipt log holds ${log.size} receipts: the used tickets and Idempotency-Key records it kept are gone (a ticket of the last minutes could be used again, and a retry of the last 24 h runs and is billed again); if it was removed by mistake, stop the node and put it back`);
    }
    cleanup.push(['state database', () => {
      try {
        checkStateAtClose?.(); // (a change since the last 5 s check: said, copied, not checkpointed into)
      } finally {
        try {
          stateGuard.closeWith(db, stateFiles.changedInPlace);
        } finally {
          stateSeal.release(); // (after the connection: see sqlite-seal.ts)
        }
      }
    }]);
    // Its checkpoints (an fsync each) on a thread of their own, off the event loop.
    const stateCheckpoints = new WalCheckpointer(statePath, { seal: stateSeal, onError: (m) => logger.warn({ err: m }, 'state.db could not be checkpointed (its WAL grows until it can; the node checkpoints it itself past ~40 MiB)') });
    cleanup.push(['state checkpoints', () => stateCheckpoints.close()]);
    const metrics = createMetrics({ admission: () => [...models.values()].map((m) => ({ model: m.id, inUse: m.admission.inUse, queued: m.admission.queued })), receiptLogStopped: () => log.failure !== undefined });
    // The ops server answers from the start: while the models load (minutes for a real one) /healthz
    // is ok and /readyz says what is loading, so a liveness probe does not kill a node still loading.
    const serving: { health?: () => HealthResult; ready?: () => ReadyResult; status?: () => Record<string, unknown> } = {};
    const { host: opsHost, port: opsPort } = opsHostPort(config); // (checked by parseConfig)
    const ops = createOpsServer({
      host: opsHost,
      port: opsPort,
      metrics,
      // (Its requests at debug, a failing callback at error: s29 review found it logging nothing.)
      logger: logger.child({ component: 'ops' }),
      health: () => serving.health?.() ?? { ok: true },
      ready: () => serving.ready?.() ?? { ready: false, reasons: [`loading models: ${models.size} of ${config.models.length} ready`] },
      status: () =>
        serving.status?.() ?? { provider_id: identity.providerId, loading: true, models_ready: [...models.keys()], models: config.models.map((m) => m.id), uptime_s: Math.round(process.uptime()) },
    });
    let opsAddr: Awaited<ReturnType<typeof ops.listen>>;
    try {
      opsAddr = await ops.listen();
    } catch (e) {
      throw new NodeStartError(`ops.http: ${listenProblem(e, config.ops.http, 'pick another host:port in ops.http') ?? (e as Error).message}`, { cause: e });
    }
    cleanup.push(['ops HTTP', () => ops.close()]);
    // Runs after the runtimes stop (steps undo in reverse): a request the stop cancelled ends once
    // its runtime has, and its `cancelled` receipt must reach the log before the log closes.
    let inferServer: RequestServer | undefined;
    cleanup.push(['requests still ending', async () => {
      if (inferServer && !(await inferServer.idle(STOP_RECEIPTS_MS))) logger.warn({ in_flight: inferServer.inFlight }, `requests still running ${STOP_RECEIPTS_MS / 1000} s after their runtimes stopped: their receipts may be lost`);
    }]);
    // The libp2p ports too: the host listens only after the loads.
    try {
      await tryListenAddresses(config.listen);
    } catch (e) {
      throw new NodeStartError(`listen: ${listenFailure(e as Error)}`, { cause: e });
    }
    const probeMemo = dataDirProbeMemo(config.data_dir);
    for (const [i, m] of config.models.entries()) {
      if (opts.signal?.aborted) throw new NodeStartStopped();
      const started = performance.now();
      // On the runtime thread, where node-llama-cpp's token loop does not wait behind the node's work
      // (node-llama-cpp is loaded on this thread only for tests that patch it here).
      const Adapter = opts.runtimeOnThisThread ? (await import('../adapters/llama-embedded.ts')).LlamaEmbeddedAdapter : LlamaThreadAdapter;
      const adapter = new Adapter({ onFailure: (e: Error) => logger.error({ model: m.id, err: errSummary(e) }, `model ${m.id}: the runtime thread failed: every request for it fails until the node is restarted (/healthz says so)`), modelPath: m.path!, contextLength: m.context, slots: m.slots, mmap: m.mmap, threads: m.threads, gpu: config.gpu, probe: { memo: probeMemo, timeoutMs: m.probe_timeout_s * 1000 }, tokenizerAtStart: true, tokenizeDeadlineMs: m.tokenize_timeout_s * 1000 });
      try {
        // (a start that fails releases what it loaded; one stopped meanwhile is stopped once it ends)
        await unlessStopped(adapter.start(), opts.signal, () => adapter.stop());
      } catch (e) {
        if (e instanceof NodeStartStopped) throw e;
        const msg = withProbeTimeoutHint(e, `models[${i}].probe_timeout_s, now ${m.probe_timeout_s},`);
        const named = namingModelFile(m.path!, msg);
        throw new NodeStartError(named !== undefined ? `models: ${m.id}: the runtime could not start: ${named}` : `models: ${m.id}: the runtime could not start on model file ${m.path}: ${msg}`, { cause: e });
      }
      cleanup.push([`runtime ${m.id}`, () => adapter.stop()]);
      // Buyers route on the quantization bucket, and receipts sign it: it is the file's (s29 review:
      // an F32 file was advertised and signed as q4-k-m, and any file as f32 when the key was left out).
      const fileQuantization = adapter.info.quantization;
      if (m.quantization !== null && fileQuantization !== undefined && m.quantization !== fileQuantization) {
        throw new NodeStartError(`models[${i}].quantization: "${m.quantization}", but ${m.path} is ${fileQuantization} (its general.file_type): leave the key out to take the file's, or serve the file it names`);
      }
      const quantization = m.quantization ?? fileQuantization;
      if (quantization === undefined) throw new NodeStartError(`models[${i}].quantization: ${m.path} does not say its quantization (general.file_type): set the key`);
      const tps = await measureTokensPerSecond(adapter, opts.signal); // (a stop ends it within a token)
      if (opts.signal?.aborted) throw new NodeStartStopped();
      models.set(m.id, { id: m.id, adapter, admission: new Admission({ slots: m.slots, queue: m.queue, defaultMaxWaitMs: m.max_wait_ms }), quantization, tokensPerSecond: tps, rates: m.prices });
      const cores = os.availableParallelism();
      if (m.threads > cores) {
        // More threads than cores make every evaluation wait on the others (s29 review: 1,024 threads on 2 cores took 19 s to start).
        logger.warn({ model: m.id, threads: m.threads, cores }, `model ${m.id}: threads ${m.threads} is more than this machine's ${cores} cores; each evaluation waits on the others (set threads to the physical cores, or 1)`);
      }
      if (m.context_set === true && adapter.info.contextLength < m.context) {
        // The runtime serves no more than the model was trained for: say so, or the operator believes the config.
        logger.warn({ model: m.id, configured: m.context, context: adapter.info.contextLength }, `model ${m.id}: context ${m.context} is more than the model was trained for; serving ${adapter.info.contextLength}`);
      }
      // (probe: whether this start loaded the model in a child process first, or knew the file passed: model-probes.json)
      logger.info({ model: m.id, context: adapter.info.contextLength, tokens_per_second: tps, model_sha256: adapter.info.modelSha256, runtime: adapter.info.version, probe: adapter.probed, start_ms: Math.round(performance.now() - started) }, 'model ready');
    }
    const gate = new TicketGate({ db, marketplaceKeys: config.marketplace.public_keys.map((k) => ({ publicKey: k })), providerId: identity.providerId });
    // (Its WAL truncations, checkpoints, run through the seal: only on files as SQLite left them.)
    const idempotency = new IdempotencyStore(db, { own: (checkpoint) => stateSeal.own(checkpoint) });
    // Expired ticket ids and day-old idempotency records are forgotten: state.db stays bounded.
    // The deletes commit outside the seal's own(), the truncation inside (a commit inside it could
    // start the WAL over and be checkpointed unseen, then taken for another program's write).
    const pruner = setInterval(() => {
      watchStateFile();
      if (state.stopped) return;
      pruneState([() => gate.prune(), () => idempotency.forgetOlderThan()], logger);
      watchStateFile(); // (a truncation the seal refused: the files changed)
    }, 60_000).unref();
    cleanup.push(['state pruner', () => clearInterval(pruner)]);
    // Slots and queue are read from admission at each scrape, so they are live mid-request.
    // Refusals need no ticket: at most REFUSAL_LINES_PER_SECOND of them are lines, the rest counted (metrics count all).
    const refusalLines = new LineBudget(REFUSAL_LINES_PER_SECOND, (n) => logger.warn({ suppressed: n }, `${n} refused request lines not logged (more than ${REFUSAL_LINES_PER_SECOND} a second); seller_requests_total counts them`));
    refusalLines.start();
    cleanup.push(['refusal lines', () => refusalLines.stop()]); // (the count of the last second's unlogged lines is said too)
    // state.db refusing writes (disk full): paid requests get 503 and the node says it is not
    // accepting work for a while; the operator hears of it at once, then at most every 10 s.
    const stateFailures = new RepeatLimit(10_000, Date.now);
    const state = new StoreHealth({
      onFailure: (e, first) => {
        const unsaid = stateFailures.take(first);
        if (unsaid !== undefined) logger.error({ err: errSummary(e), failures_since_last_line: unsaid }, 'state.db refused a write: paid requests are refused (503) until a write succeeds; the node says it is not accepting work');
      },
    });
    // The data dir's free space: below receipts.min_free_mb, paid work is refused (before tickets are used).
    let diskLow: string | undefined;
    /** Why no paid work is taken when a runtime can no longer serve (its thread died): /healthz is 503 then too (restart the node). */
    const runtimeFailed = () => {
      const e = [...models.values()].map((m) => m.adapter.failure?.()).find((f) => f !== undefined);
      return e ? `the runtime thread failed (${e.message.slice(0, 500)}): paid work is refused until the node is restarted` : undefined;
    };
    const watchDisk = () => {
      const low = lowDisk(config.data_dir, config.receipts.min_free_mb);
      if (low && !diskLow) logger.error({ data_dir: config.data_dir }, `${low}: paid work is refused until space is freed`);
      else if (!low && diskLow) logger.info({ data_dir: config.data_dir }, 'the data dir has room again: paid work is taken');
      diskLow = low;
    };
    watchDisk();
    // state.db deleted, replaced or changed in place while in use: paid work stops, and what the
    // connection still holds is copied out (tried again every 5 s until it is, should the copy fail: a full disk).
    const watchStateFile = (): void => {
      const found = stateFiles.check();
      if (!found) return;
      if (found.kind === 'made') return void logger.error({}, `state file: the copy failed before has now been made. ${found.message}`);
      const how = found.kind === 'gone' ? 'was deleted or replaced while the node used it' : `${found.what} while the node used it (something other than the node changed it, a truncate or an older copy copied over it, and SQLite's next checkpoint would mix what is left into it)`;
      const e = new StoreStopped(`state file ${found.file} ${how}: paid requests are refused until a restart. ${found.copy.message}`);
      state.stop(e);
      logger.error({}, e.message);
    };
    checkStateAtClose = watchStateFile;
    const descriptors = new DescriptorWatch({
      error: (u) => logger.error({ open: u.open, limit: u.limit }, `${u.open} of the ${u.limit} file descriptors this process may open are in use: beyond the limit the system refuses buyers' connections, the market's and the node's own files; raise it (LimitNOFILE= in a systemd unit, ulimit -n in a shell) or take fewer connections`),
      info: (u) => logger.info({ open: u.open, limit: u.limit }, 'file descriptors: clear of the limit again'),
    });
    const keyFile = new KeyFileWatch(config.key, identity.providerId);
    const watchKeyFile = (): void => {
      const e = keyFile.check();
      if (e?.kind === 'wrong') logger.error({ key: config.key }, e.message);
      else if (e) logger.info({ key: config.key }, e.message);
    };
    // state.db's WAL past FALLBACK_CHECKPOINT_PAGES (its thread fell behind, or died): checkpointed
    // here, through its seal (only on files as SQLite left them), as SQLite's own checkpoint was.
    const stateWalBounded = (): void => {
      if (state.stopped || (stateSeal.index()?.mxFrame ?? 0) < FALLBACK_CHECKPOINT_PAGES) return;
      try {
        if (stateSeal.checkpoint(db)) watchStateFile();
      } catch (e) {
        logger.warn({ err: errSummary(e) }, 'state.db could not be checkpointed (tried again in 5 s)');
      }
    };
    // Model files, state.db, the key file, free space and file descriptors, every 5 s (the receipt log watches its own files).
    const fileWatch = setInterval(() => {
      watchDisk();
      descriptors.check();
      watchModelFiles(models.values(), logger);
      watchStateFile();
      stateWalBounded();
      watchKeyFile();
    }, 5000).unref();
    cleanup.push(['file watch', () => clearInterval(fileWatch)]);
    const service = new InferService({
      log,
      gate,
      idempotency,
      models,
      priceVersion: prices.payload.version,
      state,
      paidWorkRefused: () => diskLow ?? runtimeFailed() ?? state.stopped?.message.slice(0, 300),
      onInternalError: (err) => logger.error({ err: errSummary(err) }, 'request failed before any work (500 internal_error)'),
      observe: (e) => {
        metrics.requests.inc({ endpoint: e.endpoint, status: String(e.status) });
        if (e.code?.startsWith('ticket_')) metrics.ticketRefusals.inc({ reason: e.code });
        if (e.receipt) {
          metrics.receiptsSigned.inc({ status: e.receipt.status });
          metrics.tokens.inc({ direction: 'in', model: e.model }, e.receipt.inputTokens);
          metrics.tokens.inc({ direction: 'out', model: e.model }, e.receipt.outputTokens);
          metrics.earnings.add(e.model, e.receipt.costMicroUsd);
          metrics.requestDuration.observe({ endpoint: e.endpoint, model: e.model }, e.receipt.durationMs / 1000);
          if (e.receipt.firstTokenMs !== null) metrics.timeToFirstToken.observe({ model: e.model }, e.receipt.firstTokenMs / 1000);
        }
        // ids, counts and codes only: never prompt or output text. A refusal (no receipt) takes a
        // place in the refusal lines' budget; a request with a receipt is always a line.
        if (!e.receipt && e.status >= 400 && !refusalLines.take()) return;
        logger.info({ endpoint: e.endpoint, model: e.model, request_id: e.requestId, status: e.status, code: e.code, receipt_status: e.receipt?.status, input_tokens: e.receipt?.inputTokens, output_tokens: e.receipt?.outputTokens, remote_peer: e.remotePeer }, 'request');
      },
    });
    let host: Awaited<ReturnType<typeof createHost>>;
    try {
      host = await createHost({
        seed: identity.seed,
        listen: config.listen,
        ...p2pHostLimits(config.p2p),
        // Counted, never a line each: a stranger decides how often these happen.
        observer: {
          refused: (reason) => metrics.p2pConnectionsRefused.inc({ reason }),
          closedIdle: () => metrics.p2pConnectionsClosedIdle.inc(),
        },
      });
    } catch (e) {
      throw new NodeStartError(`listen: ${listenFailure(e as Error)}`, { cause: e });
    }
    cleanup.push(['libp2p host', () => host.stop()]);
    let stopped: Promise<void> | undefined;
    /** Set as stop() begins (before `stopped`, which its first steps run ahead of). */
    let stopping = false;
    let registration: Registration | undefined;
    // A handler that throws (the receipt log failing, a bug) is answered 500 internal_error by the
    // server; the operator sees why here: names, codes and a short message, never request text.
    const infer = await serveInfer(host, service, {
      // Refused before the request could be read (malformed, too large, too slow, over the bytes
      // budget): counted and logged like any request, so an operator sees such traffic.
      onRefused: (r) => {
        metrics.requests.inc({ endpoint: 'invalid', status: String(r.status) });
        if (r.code.startsWith('ticket_')) metrics.ticketRefusals.inc({ reason: r.code }); // (refused at the HEAD: see InferService.screen)
        if (refusalLines.take()) logger.info({ endpoint: null, status: r.status, code: r.code, remote_peer: r.remotePeer }, 'request');
      },
      onError: (err, at) => logger.error({ protocol: at.protocol, remote_peer: at.remotePeer, err: errSummary(err) }, 'request handler failed'),
    });
    inferServer = infer;
    cleanup.push(['infer protocol', () => infer.stop()]);
    const logServer = await serveLog(host, log, (version) => readPriceList(config.data_dir, version));
    cleanup.push(['log protocol', () => logServer.stop()]);
    /** The latest checkpoint stored (`log export` beside the node may have signed a later one), or this log's own when the files cannot be read (changed under it). */
    const latestCheckpointSize = (): number => {
      try {
        return log.latestCheckpoint()?.size ?? 0;
      } catch {
        return log.stats().lastCheckpointSize;
      }
    };
    /** What each model is (registration), and with live figures (capacity, /status). */
    // (`endpoints` only for a model sold for fewer than all: one without a chat template.)
    const describe = (m: ServedModel) => {
      const endpoints = endpointsServed(m.adapter.info);
      return { id: m.id, quantization: m.quantization, context: m.adapter.info.contextLength, slots: m.admission.slots, tokens_per_second: m.tokensPerSecond, ...(endpoints.length < PAID_ENDPOINTS.length ? { endpoints } : {}) };
    };
    /** What readiness and `accepting` are judged on (registration.ts). */
    // Free space below receipts.min_free_mb refuses all paid work; a model whose file was written
    // over in place refuses that model's (until a restart): the node goes on selling the others,
    // and /readyz says it is degraded.
    const modifiedModel = (m: ServedModel) => m.adapter.modelFileState?.() === 'modified';
    const workProblems = () => [diskLow, runtimeFailed()].filter((p): p is string => p !== undefined);
    const modelProblems = () => [...models.values()].filter(modifiedModel).map((m) => modelFileModified(m).message);
    const standing = () => [stopping, config.marketplace.public_keys.length > 0, registration?.status(), log.failure, state.failure, workProblems()] as const;
    /** Whether the node takes paid work now at all (the capacity snapshot's node-level flag; /status's is false too when no model takes any, and each model says its own). */
    const accepting = () => workRefused(...standing()).length === 0;
    const capacitySnapshot = () => ({
      price_version: prices.payload.version,
      attestation_tier: 'T1',
      accepting: accepting(),
      models: [...models.values()].map((m) => ({ ...describe(m), free_slots: Math.max(0, m.admission.free), queued: m.admission.queued, queue_limit: m.admission.queueLimit, ...(modifiedModel(m) ? { accepting: false as const } : {}) })),
    });
    const capacity = await serveCapacity(host, identity, capacitySnapshot);
    cleanup.push(['capacity protocol', () => capacity.stop()]);
    // The ops server has been answering since before the models loaded: from now on, for the serving node.
    serving.health = () => {
      if (log.failure) return { ok: false, reason: `the receipt log has stopped (${log.failure.message.slice(0, 2000)}): paid work is refused until the node is restarted` };
      const runtime = runtimeFailed();
      return runtime ? { ok: false, reason: runtime } : { ok: true };
    };
    serving.ready = () => {
      const [stop, keys, market, logFailure, stateFailure, problems] = standing();
      return readiness(stop, keys, market, logFailure, stateFailure, [...problems, ...modelProblems()]);
    };
    serving.status = () => ({
      provider_id: identity.providerId,
      peer_id: host.peerId.toString(),
      addresses: host.getMultiaddrs().map((a) => a.toString()),
      price_version: prices.payload.version,
      // (Each model's flag says whether it takes paid work now, the node's whether any does: a
      // node refusing all work no longer showed its models accepting, nor one whose only model is
      // refused itself accepting: s23 h7.)
      accepting: accepting() && [...models.values()].some((m) => !modifiedModel(m)),
      models: [...models.values()].map((m) => ({ ...describe(m), slots_in_use: m.admission.inUse, queued: m.admission.queued, accepting: accepting() && !modifiedModel(m) })),
      // (the latest checkpoint as stored: `log export` beside the node may have signed a later one)
      receipts: { ...log.stats(), lastCheckpointSize: latestCheckpointSize() },
      in_flight: infer.inFlight,
      uptime_s: Math.round(process.uptime()),
      marketplace: registration?.status() ?? null,
    });
    const addresses = host.getMultiaddrs().map((a) => a.toString());
    if (config.marketplace.url) {
      registration = startRegistration({
        marketUrl: config.marketplace.url,
        seed: identity.seed,
        providerId: identity.providerId,
        peerId: host.peerId.toString(),
        addresses: () => host.getMultiaddrs().map((a) => a.toString()),
        priceList: { envelope: prices.envelope, version: prices.payload.version },
        models: [...models.values()].map(describe),
        requestContracts: signTextRequestContracts(identity.seed, identity.providerId, [...models.values()].map((m) => ({ id: m.id, endpoints: endpointsServed(m.adapter.info) }))),
        tier: 'T1',
        trustedKeys: config.marketplace.public_keys,
        capacity: (at) => signCapacity(identity, capacitySnapshot(), at),
        logger,
      });
      const r = registration;
      cleanup.push(['marketplace registration', () => r.stop()]);
    }
    if (config.marketplace.public_keys.length === 0) {
      logger.warn({ ops: opsAddr.url }, 'no marketplace.public_keys configured: every paid request will be refused (ticket_invalid); the node says it is not accepting work and /readyz is 503');
    }
    logger.info({ provider_id: identity.providerId, peer_id: host.peerId.toString(), addresses, ops: opsAddr.url, price_version: prices.payload.version }, 'node started');
    return {
      providerId: identity.providerId,
      peerId: host.peerId.toString(),
      addresses,
      opsUrl: opsAddr.url,
      priceVersion: prices.payload.version,
      logger,
      stop(graceMs = 30_000) {
        stopping = true;
        stopped ??= (async () => {
          for (const m of models.values()) m.admission.close();
          // The market hears at once that this node takes no more work (accepting: false), not
          // at the next heartbeat: buyers sent here meanwhile would find it gone.
          const announced = registration?.announce(Math.min(2000, graceMs)) ?? Promise.resolve();
          if (!(await infer.drain(graceMs))) {
            logger.warn({ in_flight: infer.inFlight, grace_ms: graceMs }, 'requests still running after the grace period are cancelled');
            // Their runtimes stop; each still ends with its receipt in its trailer (s30 review: the
            // streams were reset first, and the buyers got a broken stream instead): a stream's
            // `cancelled`, for what was sent; a whole body's `failed`, billing nothing, as none was
            // sent. A buyer that does not read is cut off after a while.
            infer.cancel(new NodeStopping());
            if (!(await infer.idle(STOP_CANCEL_MS))) logger.warn({ in_flight: infer.inFlight }, `requests cancelled by the stop still writing their answers after ${STOP_CANCEL_MS / 1000} s are cut off`);
          }
          await announced;
          // The last answers are given time to be read before the connections close: a buyer that
          // opens a stream as the host stops has its connection reset, and a trailer it had received
          // but not yet read went with it (a completed request read as failed, and billed).
          await untilQuiet([infer, logServer, capacity], STOP_QUIET_MS, Math.min(STOP_QUIET_MAX_MS, graceMs));
          await undo(); // in reverse order of start: the protocols first, the runtimes, then the receipt log (it flushes every receipt, a cancelled one included), the data dir's lock last
          logger.info({}, 'node stopped');
        })();
        return stopped;
      },
    };
  } catch (e) {
    await undo();
    throw e;
  }
}
