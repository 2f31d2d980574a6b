// The folder rules of design.md, checked on the source: attestation/ imports nothing from src/ or
// adapters/, adapters/ nothing from src/, and everything the verifier entry reaches is free of
// `node:` modules (the browser test proves it runs; this names the file that would break it).
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';

const ROOT = path.resolve(import.meta.dirname, '..');

/** Every module specifier in a source file: static imports, re-exports, side-effect and dynamic imports. */
function specifiers(source: string): string[] {
  const out: string[] = [];
  const patterns = [/\bfrom\s*['"]([^'"]+)['"]/g, /\bimport\s*['"]([^'"]+)['"]/g, /\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g];
  for (const re of patterns) for (const m of source.matchAll(re)) out.push(m[1]!);
  return out;
}

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...sourceFiles(rel));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) out.push(rel);
  }
  return out;
}

/** Relative imports of `file` that land in one of `forbidden` (top-level folders). */
function crossings(file: string, source: string, forbidden: string[]): string[] {
  return specifiers(source)
    .filter((s) => s.startsWith('.'))
    .filter((s) => forbidden.includes(path.relative(ROOT, path.resolve(ROOT, path.dirname(file), s)).split(path.sep)[0]!))
    .map((s) => `${file} imports ${s}`);
}

/**
 * The specifiers a file loads as soon as it is imported: not its dynamic `import()`s, and not its
 * `import type` / `export type` statements (erased by the compiler).
 */
function eagerSpecifiers(source: string): string[] {
  const eager = source.replace(/\bimport\s*\(\s*['"][^'"]+['"]\s*\)/g, '').replace(/^\s*(?:import|export)\s+type\b[^;]*;/gm, '');
  return specifiers(eager);
}

/** Files reachable from `entry` by relative imports, with every bare or `node:` specifier they use. */
function graph(entry: string, scan: (source: string) => string[] = specifiers): Map<string, string[]> {
  const seen = new Map<string, string[]>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    const specs = scan(fs.readFileSync(path.join(ROOT, file), 'utf8'));
    seen.set(file, specs.filter((s) => !s.startsWith('.')));
    for (const s of specs.filter((x) => x.startsWith('.'))) visit(path.relative(ROOT, path.resolve(ROOT, path.dirname(file), s)));
  };
  visit(entry);
  return seen;
}

describe('module boundaries (design.md, Folders)', () => {
  test('the specifier scan sees every import form, so the rules below can fail', () => {
    const src = [
      "import { a } from '../src/x.ts';",
      'import {\n  b,\n  c,\n} from "../adapters/y.ts";',
      "export { d } from './z.ts';",
      "import '../src/side-effect.ts';",
      "const m = await import('../src/lazy.ts');",
      "import type { T } from 'node:fs';",
    ].join('\n');
    expect(specifiers(src).sort()).toEqual(['../adapters/y.ts', '../src/lazy.ts', '../src/side-effect.ts', '../src/x.ts', './z.ts', 'node:fs'].sort());
    expect(crossings('attestation/f.ts', src, ['src', 'adapters'])).toHaveLength(4);
    expect(crossings('adapters/gguf/f.ts', "import x from '../../src/a.ts';", ['src'])).toEqual(['adapters/gguf/f.ts imports ../../src/a.ts']);
    expect(crossings('adapters/gguf/f.ts', "import x from '../runtime-adapter.ts';", ['src'])).toEqual([]);
  });

  test('attestation/ imports nothing from src/ or adapters/', () => {
    const files = sourceFiles('attestation');
    expect(files.length).toBeGreaterThan(10);
    expect(files.flatMap((f) => crossings(f, fs.readFileSync(path.join(ROOT, f), 'utf8'), ['src', 'adapters']))).toEqual([]);
  });

  test('adapters/ imports nothing from src/', () => {
    const files = sourceFiles('adapters');
    expect(files.length).toBeGreaterThan(2);
    expect(files.flatMap((f) => crossings(f, fs.readFileSync(path.join(ROOT, f), 'utf8'), ['src']))).toEqual([]);
  });

  test('nothing the verifier entry reaches imports a node: module', () => {
    const g = graph('attestation/verifier.ts');
    expect(g.size).toBeGreaterThan(10);
    const nodeImports = [...g].flatMap(([file, specs]) => specs.filter((s) => s.startsWith('node:')).map((s) => `${file} imports ${s}`));
    expect(nodeImports).toEqual([]);
    // The signer pool (node:worker_threads, piscina) is outside the verifier's graph by design.
    expect(g.has('attestation/signer-pool.ts')).toBe(false);
  });

  // The CLI loads what a command needs when it runs: `--help`, `verify`, `audit`, `log` start in
  // ~0.3 s instead of ~1.4 s with llama.cpp, libp2p and fastify loaded up front.
  test('the CLI entry loads no runtime, libp2p or HTTP server until a command needs it', () => {
    const heavy = (spec: string) => spec === 'node-llama-cpp' || spec === 'libp2p' || spec.startsWith('@libp2p/') || spec.startsWith('@chainsafe/') || spec === 'fastify';
    const eager = [...graph('src/cli/main.ts', eagerSpecifiers)].flatMap(([file, specs]) => specs.filter(heavy).map((s) => `${file} loads ${s}`));
    expect(eager).toEqual([]);
    // (and the scan can see it: the whole graph, dynamic imports included, does reach them)
    expect([...graph('src/cli/main.ts')].some(([, specs]) => specs.some(heavy))).toBe(true);
    expect(eagerSpecifiers("import type { A } from 'fastify';\nconst x = await import('libp2p');\nimport { b } from 'node-llama-cpp';")).toEqual(['node-llama-cpp']);
  });
});
