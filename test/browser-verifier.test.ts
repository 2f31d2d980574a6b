// The package export `seller-node/verifier` (attestation/verifier.ts) must run unchanged in a
// browser. This test proves it end to end:
//   1. esbuild bundles it for the browser with no `node:` module and no Node built-in anywhere in
//      its import graph, and the bundle text holds no require()/import of one;
//   2. real data is signed in Node by the project's own ReceiptLog (receipts, a checkpoint, a C2SP
//      proof bundle);
//   3. headless Chromium loads the bundle and verifies that data (and rejects tampered copies with
//      the same error codes Node gives), with no `process` and no `Buffer`, so the pure-JS paths
//      (@noble/*, hand-written base64/hex) are the ones that ran.
import { builtinModules } from 'node:module';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as esbuild from 'esbuild';
import type { BrowserContext, Page } from 'playwright-core';
import { launchChromium } from './helpers/chromium.ts';
import { fromBase64, toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { formatProofBundle } from '../attestation/tlog-proof.ts';
import * as nodeVerifier from '../attestation/verifier.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { readVectorJson, REPO_ROOT } from './helpers/vectors.ts';

const RECEIPTS = 20;
const PROVEN_INDEX = 13;

interface Ed25519Vector {
  priv: string;
  pub: string;
  msg: string;
  sig: string;
}

/** Everything the page is asked to check, as plain JSON. */
interface PageInput {
  provider: string;
  otherProvider: string;
  lines: string[];
  note: string;
  bundle: string;
  tampered: Record<string, string>;
  tamperedLogs: Record<string, string[]>;
  tamperedBundles: Record<string, string>;
  vectors: Ed25519Vector[];
}

type Outcome = { ok: true } | { ok: false; code: string };

interface PageOutput {
  env: { process: string; buffer: string; require: string; getBuiltinModule: string; userAgent: string };
  receipt: { ok: boolean; code?: string; seq?: string; provider?: string; payloadMatchesBase64?: boolean };
  allReceipts: Outcome[];
  tampered: Record<string, Outcome>;
  log: { ok: boolean; code?: string; receipts?: number; checkpoints?: number; size?: number; rootHash?: string; latestSize?: number };
  tamperedLogs: Record<string, Outcome>;
  proof: { ok: boolean; code?: string; index?: number; seq?: string; checkpointSize?: number; checkpointRoot?: string };
  proofPinned: Outcome;
  proofWrongProvider: Outcome;
  tamperedBundles: Record<string, Outcome>;
  vectors: { valid: boolean; flippedSig: boolean; flippedMsg: boolean | null; flippedKey: boolean }[];
}

function outcome(r: { ok: boolean; error?: { code: string } }): Outcome {
  return r.ok ? { ok: true } : { ok: false, code: r.error!.code };
}

/** Replaces the character at `i` with a different character of the standard base64 alphabet. */
function swapBase64Char(s: string, i: number): string {
  const c = s[i]!;
  return s.slice(0, i) + (c === 'A' ? 'B' : 'A') + s.slice(i + 1);
}

function withEnvelope(line: string, edit: (env: { payloadType: string; payload: string; signatures: { keyid?: string; sig: string }[] }) => void): string {
  const env = JSON.parse(line);
  edit(env);
  return JSON.stringify(env);
}

function isNodeBuiltin(spec: string): boolean {
  if (spec.startsWith('node:')) return true;
  const bare = spec.split('/')[0]!;
  return builtinModules.includes(spec) || builtinModules.includes(bare);
}

let tmp: string;
let log: ReceiptLog | undefined;
let context: BrowserContext | undefined;
let server: http.Server | undefined;
let bundleText: string;
let metafile: esbuild.Metafile;
let input: PageInput;
let rootHashB64: string;
let provenSeq: string;
const served: string[] = [];

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'seller-node-browser-'));

  // 1. The browser bundle, exactly as a web app would build the package export.
  const built = await esbuild.build({
    absWorkingDir: REPO_ROOT,
    entryPoints: ['attestation/verifier.ts'],
    bundle: true,
    platform: 'browser',
    format: 'esm',
    write: false,
    metafile: true,
    logLevel: 'silent',
  });
  expect(built.errors).toEqual([]);
  expect(built.outputFiles).toHaveLength(1);
  bundleText = built.outputFiles[0]!.text;
  metafile = built.metafile;

  // 2. Real signed data from the project's own receipt log.
  const seed = globalThis.crypto.getRandomValues(new Uint8Array(32));
  log = ReceiptLog.open({ path: path.join(tmp, 'receipts.sqlite'), seed, threads: 0, checkpointIntervalMs: 0 });
  const appended = await Promise.all(Array.from({ length: RECEIPTS }, (_, i) => log!.append(syntheticReceiptBody(i))));
  const lines = appended.map((a) => a.line);
  expect(appended.map((a) => a.seq)).toEqual(Array.from({ length: RECEIPTS }, (_, i) => String(i)));
  expect([...log.lines()]).toEqual(lines);
  const note = log.checkpoint();
  expect(typeof note).toBe('string');
  rootHashB64 = toBase64(log.root(RECEIPTS));
  provenSeq = appended[PROVEN_INDEX]!.seq;
  const bundle = formatProofBundle({
    index: PROVEN_INDEX,
    proof: log.inclusionProof(PROVEN_INDEX, RECEIPTS),
    checkpointNote: note!,
    extra: utf8(lines[PROVEN_INDEX]!),
  });
  const provider = log.providerId;

  // Tampered copies, all made from real receipts.
  const target = lines[5]!;
  const payloadLen = (JSON.parse(target) as { payload: string }).payload.length;
  const tampered: Record<string, string> = {
    // One base64 character of the payload changed to another valid one: other bytes, same signature.
    payloadCharSwapped: withEnvelope(target, (e) => {
      e.payload = swapBase64Char(e.payload, Math.floor(payloadLen / 2));
    }),
    // One payload character replaced by a non-base64 character.
    payloadNotBase64: withEnvelope(target, (e) => {
      const i = Math.floor(payloadLen / 3);
      e.payload = e.payload.slice(0, i) + '!' + e.payload.slice(i + 1);
    }),
    // One signature byte changed (in R), then re-encoded as valid base64.
    signatureByteChanged: withEnvelope(target, (e) => {
      const sig = fromBase64(e.signatures[0]!.sig)!;
      sig[10] = sig[10]! ^ 0x01;
      e.signatures[0]!.sig = toBase64(sig);
    }),
    // One signature byte changed in S.
    signatureSByteChanged: withEnvelope(target, (e) => {
      const sig = fromBase64(e.signatures[0]!.sig)!;
      sig[40] = sig[40]! ^ 0x80;
      e.signatures[0]!.sig = toBase64(sig);
    }),
    truncated: target.slice(0, -7),
  };
  // Strict-base64 edge cases. In the browser these run bytes.ts's hand-written decoder (no Buffer);
  // in Node its Buffer round trip. Both must refuse them alike (compared with Node below).
  const payloadOf = (l: string) => (JSON.parse(l) as { payload: string }).payload;
  const padded = lines.find((l) => payloadOf(l).endsWith('='))!;
  const sigOf = (l: string) => (JSON.parse(l) as { signatures: { sig: string }[] }).signatures[0]!.sig;
  // A random 64-byte signature holds two or more of '+' and '/' with probability ~3/4; among 20, one does.
  const plusOrSlash = (t: string) => t.match(/[+/]/g)?.length ?? 0;
  const sigWithPlusOrSlash = lines.find((l) => plusOrSlash(sigOf(l)) >= 2)!;
  const urlSafe = (t: string) => t.replaceAll('+', '-').replaceAll('/', '_');
  expect(padded).toBeDefined();
  expect(sigWithPlusOrSlash).toBeDefined();
  Object.assign(tampered, {
    // Last data character before the padding with a nonzero unused bit: decodes to the same bytes
    // leniently, so only a strict decoder notices.
    payloadPadBitsSet: withEnvelope(padded, (e) => {
      const pad = e.payload.endsWith('==') ? 2 : 1;
      const i = e.payload.length - pad - 1;
      const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
      e.payload = e.payload.slice(0, i) + B64[B64.indexOf(e.payload[i]!) | 1]! + e.payload.slice(i + 1);
    }),
    // DSSE lets a producer write base64 unpadded or URL-safe: the same bytes, still verified.
    payloadUnpadded: withEnvelope(padded, (e) => {
      e.payload = e.payload.replace(/=+$/, '');
    }),
    signatureBase64url: withEnvelope(sigWithPlusOrSlash, (e) => {
      e.signatures[0]!.sig = urlSafe(e.signatures[0]!.sig);
    }),
    // But not the two alphabets mixed in one string (which Node's Buffer would decode leniently).
    payloadMixedAlphabets: withEnvelope(target, (e) => {
      e.payload = e.payload.slice(0, 1) + '-+' + e.payload.slice(3);
    }),
    signatureMixedAlphabets: withEnvelope(sigWithPlusOrSlash, (e) => {
      e.signatures[0]!.sig = e.signatures[0]!.sig.replace(/[+/]/, (c) => (c === '+' ? '-' : '_'));
    }),
    // A base64url character in a string that is otherwise standard, with no "+" or "/": read as
    // URL-safe, it is other bytes, and the signature says so.
    payloadOneUrlChar: withEnvelope(target, (e) => {
      const i = Math.floor(payloadLen / 4);
      e.payload = e.payload.slice(0, i) + '-' + e.payload.slice(i + 1);
    }),
  });
  const tamperedLogs: Record<string, string[]> = {
    missingReceipt: lines.filter((_, i) => i !== 7),
    swappedReceipts: lines.map((l, i) => (i === 3 ? lines[4]! : i === 4 ? lines[3]! : l)),
    tamperedReceipt: lines.map((l, i) => (i === 5 ? tampered.payloadCharSwapped! : l)),
    truncatedLog: lines.slice(0, RECEIPTS - 1),
  };
  const bundleLines = bundle.split('\n');
  // bundleLines: header, extra, index, proof hashes..., '', note lines
  const firstHash = bundleLines.findIndex((l) => l.startsWith('index ')) + 1;
  const tamperedBundles: Record<string, string> = {
    proofHashChanged: bundleLines.map((l, i) => (i === firstHash ? toBase64(fromBase64(l)!.map((b, j) => (j === 0 ? b ^ 1 : b))) : l)).join('\n'),
    wrongIndex: bundle.replace(`\nindex ${PROVEN_INDEX}\n`, `\nindex ${PROVEN_INDEX - 1}\n`),
    otherReceiptAsExtra: bundle.replace(/\nextra [^\n]+\n/, `\nextra ${toBase64(utf8(lines[PROVEN_INDEX - 1]!))}\n`),
    // The note signature is base64(keyID[4] || sig[64]): char 0 lies in the key ID, char 20 in the signature.
    checkpointKeyIdChanged: bundle.replace(/(\u2014 \S+ )(\S)/, (_m, a: string, c: string) => a + (c === 'A' ? 'B' : 'A')),
    checkpointSignatureChanged: bundle.replace(/(\u2014 \S+ \S{20})(\S)/, (_m, a: string, c: string) => a + (c === 'A' ? 'B' : 'A')),
  };

  // Every tampered copy really differs from what it was made from (no silent no-op edits).
  for (const [k, l] of Object.entries(tampered)) expect(lines, k).not.toContain(l);
  for (const [k, b] of Object.entries(tamperedBundles)) expect(b, k).not.toBe(bundle);

  const otherSeed = globalThis.crypto.getRandomValues(new Uint8Array(32));
  const otherProvider = toHex(ed25519PublicKey(otherSeed)); // a second, unrelated provider
  const vectors = readVectorJson<Ed25519Vector[]>('ed25519', 'noble-ed25519', 'rfc8032-ed25519.json');

  input = { provider, otherProvider, lines, note: note!, bundle, tampered, tamperedLogs, tamperedBundles, vectors };

  // 3. A local page that loads the bundle as an ES module, served from 127.0.0.1 only.
  const html =
    '<!doctype html><meta charset="utf-8"><title>verifier</title><link rel="icon" href="data:,">' +
    '<script type="module">import * as V from "/verifier.js"; globalThis.__verifier = V; globalThis.__verifierLoaded = true;</script>';
  server = http.createServer((req, res) => {
    served.push(req.url ?? '');
    if (req.url === '/') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(html);
    } else if (req.url === '/verifier.js') {
      res.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' }).end(bundleText);
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
  context = await launchChromium(path.join(tmp, 'chromium-profile'));
}, 60_000);

afterAll(async () => {
  await context?.close().catch(() => {});
  if (server) await new Promise<void>((resolve) => server!.close(() => resolve()));
  await log?.close();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
}, 60_000);

describe('seller-node/verifier in a browser', () => {
  it('exports every function of the README\'s verifier API', () => {
    const api = ['verifyReceipt', 'verifyTicket', 'verifyCheckpoint', 'verifyInclusion', 'verifyConsistency', 'verifyCheckpointConsistency', 'verifyLog', 'verifyReceiptProof', 'ed25519Verify'];
    expect(api.filter((name) => typeof (nodeVerifier as Record<string, unknown>)[name] !== 'function')).toEqual([]);
  });

  it('bundles for the browser without any Node module', () => {
    const inputs = Object.keys(metafile.inputs);
    expect(inputs).toContain('attestation/verifier.ts');
    expect(inputs.some((p) => p.startsWith('node_modules/@noble/ed25519/'))).toBe(true);
    expect(inputs.some((p) => p.startsWith('node_modules/@noble/hashes/'))).toBe(true);
    // Only the verifier's own files and @noble: nothing of the node (src/, SQLite, workers).
    const foreign = inputs.filter((p) => !/^attestation\/[a-z0-9-]+\.ts$/.test(p) && !p.startsWith('node_modules/@noble/'));
    expect(foreign).toEqual([]);
    expect(inputs).not.toContain('attestation/signer-pool.ts');
    expect(inputs).not.toContain('attestation/signer-worker.ts');

    const offending: string[] = [];
    let imports = 0;
    for (const [file, info] of Object.entries(metafile.inputs)) {
      for (const imp of info.imports) {
        imports++;
        for (const spec of [imp.path, imp.original].filter((s): s is string => typeof s === 'string')) {
          if (isNodeBuiltin(spec)) offending.push(`${file} -> ${spec}`);
        }
        if (imp.external) offending.push(`${file} -> ${imp.path} (external)`);
      }
    }
    expect(imports).toBeGreaterThan(20);
    expect(offending).toEqual([]);

    // The bundle text: no require() of anything, no static or dynamic import of a node: module or
    // a built-in, and no esbuild require shim.
    const builtinAlt = builtinModules.map((m) => m.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')).join('|');
    const loads = new RegExp(`(?:\\brequire\\s*\\(|\\bimport\\s*\\(|\\bfrom\\s*)\\s*["'\`](?:node:[^"'\`]*|(?:${builtinAlt})(?:/[^"'\`]*)?)["'\`]`);
    expect(bundleText).not.toMatch(loads);
    expect(bundleText).not.toMatch(/\brequire\s*\(/);
    expect(bundleText).not.toMatch(/\b__require\b/);
    expect(bundleText).not.toMatch(/^\s*import\s/m); // fully bundled: no import statement left
    // A node: module may only be named in a run-time lookup behind `process` (platform.ts's
    // process.getBuiltinModule?.("node:crypto")), which is absent in a browser.
    const lookups = /getBuiltinModule\?\.\(\s*"node:[a-z_/]+"\s*\)/g;
    expect(bundleText.replace(lookups, '')).not.toMatch(/node:/);
    // The regex above would catch a real import (proves the check can fail).
    expect('import x from "node:fs";').toMatch(loads);
    expect('const c = require("crypto");').toMatch(loads);
  });

  it('verifies real receipts, a log and a proof bundle in Chromium, on the pure-JS paths', async () => {
    const page: Page = await context!.newPage();
    const pageErrors: string[] = [];
    const foreignRequests: string[] = [];
    const origin = `http://127.0.0.1:${(server!.address() as AddressInfo).port}`;
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    page.on('console', (m) => {
      if (m.type() === 'error') pageErrors.push(m.text());
    });
    page.on('request', (r) => {
      if (!r.url().startsWith(origin + '/')) foreignRequests.push(r.url());
    });
    await page.goto(origin + '/');
    await page.waitForFunction(() => (globalThis as { __verifierLoaded?: boolean }).__verifierLoaded === true, undefined, { timeout: 20_000 });

    const t0 = performance.now();
    const out: PageOutput = await page.evaluate((inp: PageInput): PageOutput => {
      type V = typeof import('../attestation/verifier.ts');
      const v = (globalThis as unknown as { __verifier: V }).__verifier;
      const g = globalThis as Record<string, unknown>;
      const res = (r: { ok: boolean; error?: { code: string } }) => (r.ok ? { ok: true as const } : { ok: false as const, code: r.error!.code });
      const hex = (s: string) => {
        const b = new Uint8Array(s.length / 2);
        for (let i = 0; i < b.length; i++) b[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
        return b;
      };
      const b64 = (bytes: Uint8Array) => {
        let s = '';
        for (const x of bytes) s += String.fromCharCode(x);
        return btoa(s);
      };
      const flip = (b: Uint8Array, i: number) => {
        const c = b.slice();
        c[i] = c[i]! ^ 0x01;
        return c;
      };
      const mapRes = (o: Record<string, unknown>, f: (x: never) => { ok: boolean; error?: { code: string } }) => {
        const r: Record<string, { ok: true } | { ok: false; code: string }> = {};
        for (const [k, x] of Object.entries(o)) r[k] = res(f(x as never));
        return r;
      };

      const env = {
        process: typeof g.process,
        buffer: typeof g.Buffer,
        require: typeof g.require,
        getBuiltinModule: typeof (g.process as { getBuiltinModule?: unknown } | undefined)?.getBuiltinModule,
        userAgent: navigator.userAgent,
      };

      const one = v.verifyReceipt(inp.lines[5]!, { provider: inp.provider });
      const receipt = one.ok
        ? { ok: true, seq: one.value.payload.seq, provider: one.value.payload.provider, payloadMatchesBase64: b64(one.value.payloadBytes) === JSON.parse(inp.lines[5]!).payload }
        : { ok: false, code: one.error.code };
      const allReceipts = inp.lines.map((l) => res(v.verifyReceipt(l, { provider: inp.provider })));
      const tampered = mapRes(inp.tampered, (l: string) => v.verifyReceipt(l, { provider: inp.provider }));
      tampered.wrongProvider = res(v.verifyReceipt(inp.lines[5]!, { provider: inp.otherProvider }));

      const lg = v.verifyLog({ provider: inp.provider, receipts: inp.lines, checkpoints: [inp.note] });
      const log = lg.ok
        ? { ok: true, receipts: lg.value.receipts, checkpoints: lg.value.checkpoints, size: lg.value.size, rootHash: lg.value.rootHash, latestSize: lg.value.latestCheckpoint?.size }
        : { ok: false, code: lg.error.code };
      const tamperedLogs = mapRes(inp.tamperedLogs, (ls: string[]) => v.verifyLog({ provider: inp.provider, receipts: ls, checkpoints: [inp.note] }));

      const pr = v.verifyReceiptProof(inp.bundle);
      const proof = pr.ok
        ? { ok: true, index: pr.value.index, seq: pr.value.receipt.payload.seq, checkpointSize: pr.value.checkpoint.size, checkpointRoot: b64(pr.value.checkpoint.rootHash) }
        : { ok: false, code: pr.error.code };
      const proofPinned = res(v.verifyReceiptProof(inp.bundle, { provider: inp.provider }));
      const proofWrongProvider = res(v.verifyReceiptProof(inp.bundle, { provider: inp.otherProvider }));
      const tamperedBundles = mapRes(inp.tamperedBundles, (b: string) => v.verifyReceiptProof(b));

      const vectors = inp.vectors.map((t) => {
        const sig = hex(t.sig);
        const msg = hex(t.msg);
        const pub = hex(t.pub);
        return {
          valid: v.ed25519Verify(sig, msg, pub),
          flippedSig: v.ed25519Verify(flip(sig, 0), msg, pub),
          flippedMsg: msg.length === 0 ? null : v.ed25519Verify(sig, flip(msg, msg.length - 1), pub),
          flippedKey: v.ed25519Verify(sig, msg, flip(pub, 0)),
        };
      });

      return { env, receipt, allReceipts, tampered, log, tamperedLogs, proof, proofPinned, proofWrongProvider, tamperedBundles, vectors };
    }, input);
    const elapsedMs = performance.now() - t0;
    await page.close();

    // The page really is a browser without Node globals: nodeCrypto() found nothing, Buffer is absent.
    expect(out.env.userAgent).toMatch(/Chrome\//);
    expect(out.env.process).toBe('undefined');
    expect(out.env.buffer).toBe('undefined');
    expect(out.env.require).toBe('undefined');
    expect(out.env.getBuiltinModule).toBe('undefined');

    // A genuine receipt verifies; so does every receipt of the log.
    expect(out.receipt).toEqual({ ok: true, seq: '5', provider: input.provider, payloadMatchesBase64: true });
    expect(out.allReceipts).toEqual(input.lines.map(() => ({ ok: true })));

    // Tampered receipts fail, each for its own reason.
    expect(out.tampered).toEqual({
      payloadCharSwapped: { ok: false, code: 'signature_invalid' },
      payloadNotBase64: { ok: false, code: 'payload_not_base64' },
      signatureByteChanged: { ok: false, code: 'signature_invalid' },
      signatureSByteChanged: { ok: false, code: 'signature_invalid' },
      truncated: { ok: false, code: 'envelope_not_json' },
      payloadPadBitsSet: { ok: false, code: 'payload_not_base64' },
      payloadUnpadded: { ok: true },
      signatureBase64url: { ok: true },
      payloadMixedAlphabets: { ok: false, code: 'payload_not_base64' },
      signatureMixedAlphabets: { ok: false, code: 'signature_malformed' },
      payloadOneUrlChar: { ok: false, code: /[+/]/.test((JSON.parse(input.lines[5]!) as { payload: string }).payload) ? 'payload_not_base64' : 'signature_invalid' },
      wrongProvider: { ok: false, code: 'unknown_key' },
    });

    // The whole log with its checkpoint.
    expect(out.log).toEqual({ ok: true, receipts: RECEIPTS, checkpoints: 1, size: RECEIPTS, rootHash: rootHashB64, latestSize: RECEIPTS });
    expect(out.tamperedLogs).toEqual({
      missingReceipt: { ok: false, code: 'seq_gap' },
      swappedReceipts: { ok: false, code: 'seq_out_of_order' },
      tamperedReceipt: { ok: false, code: 'signature_invalid' },
      truncatedLog: { ok: false, code: 'checkpoint_size_exceeds_log' },
    });

    // The self-contained proof bundle, with and without a pinned provider.
    expect(out.proof).toEqual({ ok: true, index: PROVEN_INDEX, seq: provenSeq, checkpointSize: RECEIPTS, checkpointRoot: rootHashB64 });
    expect(out.proofPinned).toEqual({ ok: true });
    expect(out.proofWrongProvider).toEqual({ ok: false, code: 'provider_mismatch' }); // the bundle names another provider
    expect(out.tamperedBundles).toEqual({
      proofHashChanged: { ok: false, code: 'proof_root_mismatch' },
      wrongIndex: { ok: false, code: 'proof_root_mismatch' },
      otherReceiptAsExtra: { ok: false, code: 'proof_root_mismatch' },
      checkpointKeyIdChanged: { ok: false, code: 'note_no_known_signature' },
      checkpointSignatureChanged: { ok: false, code: 'signature_invalid' },
    });

    // RFC 8032 §7.1 vectors on noble's strict verifier.
    expect(out.vectors).toHaveLength(input.vectors.length);
    expect(out.vectors.length).toBeGreaterThanOrEqual(4);
    for (const [i, r] of out.vectors.entries()) {
      expect(r, `vector ${i}`).toEqual({ valid: true, flippedSig: false, flippedMsg: input.vectors[i]!.msg.length === 0 ? null : false, flippedKey: false });
    }

    // Node (native OpenSSL + Buffer paths) gives exactly the same answers on the same inputs.
    const nodeTampered: Record<string, Outcome> = {};
    for (const [k, l] of Object.entries(input.tampered)) nodeTampered[k] = outcome(nodeVerifier.verifyReceipt(l, { provider: input.provider }));
    nodeTampered.wrongProvider = outcome(nodeVerifier.verifyReceipt(input.lines[5]!, { provider: input.otherProvider }));
    expect(out.tampered).toEqual(nodeTampered);
    const nodeLogs: Record<string, Outcome> = {};
    for (const [k, ls] of Object.entries(input.tamperedLogs)) nodeLogs[k] = outcome(nodeVerifier.verifyLog({ provider: input.provider, receipts: ls, checkpoints: [input.note] }));
    expect(out.tamperedLogs).toEqual(nodeLogs);
    const nodeBundles: Record<string, Outcome> = {};
    for (const [k, b] of Object.entries(input.tamperedBundles)) nodeBundles[k] = outcome(nodeVerifier.verifyReceiptProof(b));
    expect(out.tamperedBundles).toEqual(nodeBundles);
    expect(outcome(nodeVerifier.verifyReceiptProof(input.bundle))).toEqual({ ok: true });

    expect(pageErrors).toEqual([]);
    expect(foreignRequests).toEqual([]);
    expect(served).toEqual(['/', '/verifier.js']);
    expect(elapsedMs).toBeLessThan(30_000);
  }, 60_000);
});
