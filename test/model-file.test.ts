// A model file written over in place while the node serves it (llama.cpp maps it shared, so the
// running weights change under the hash taken at start) is refused until a restart; one deleted or
// replaced by a rename leaves the loaded file mapped, and is served on.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { fileIdentity, modelFileState } from '../adapters/model-file.ts';
import { watchModelFiles } from '../src/node.ts';
import { workRefused } from '../src/registration.ts';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'model-file-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('modelFileState', () => {
  test('unchanged; written in place (size or mtime) is modified; deleted or renamed over is replaced', async () => {
    const f = path.join(dir, 'a.bin');
    fs.writeFileSync(f, 'weights');
    const loaded = fileIdentity(f)!;
    expect(modelFileState(loaded, fileIdentity(f))).toBe('unchanged');
    fs.utimesSync(f, new Date(), new Date(Date.now() + 5000));
    expect(modelFileState(loaded, fileIdentity(f))).toBe('modified');
    fs.appendFileSync(f, '!');
    const grown = fileIdentity(f)!;
    expect(modelFileState({ ...grown, mtimeMs: loaded.mtimeMs, ctimeMs: grown.ctimeMs }, grown)).toBe('modified'); // the size alone tells
    // Written in place with its size and modification time put back (touch -r): the change time tells.
    const stamp = new Date(1_700_000_000_000); // (a whole second: utimes keeps it exactly)
    fs.utimesSync(f, stamp, stamp);
    const before = fileIdentity(f)!;
    await new Promise((r) => setTimeout(r, 30)); // (inode times move by the kernel's clock tick, a few ms)
    fs.writeFileSync(f, Buffer.alloc(before.size, 1), { flag: 'r+' });
    fs.utimesSync(f, stamp, stamp);
    const after = fileIdentity(f)!;
    expect([after.size, after.mtimeMs]).toEqual([before.size, before.mtimeMs]);
    expect(modelFileState(before, after)).toBe('modified');
    const other = path.join(dir, 'b.bin');
    fs.writeFileSync(other, 'new weights');
    fs.renameSync(other, f);
    expect(modelFileState(loaded, fileIdentity(f))).toBe('replaced');
    fs.rmSync(f);
    expect(modelFileState(loaded, fileIdentity(f))).toBe('replaced');
  });
});

describe('the embedded runtime watches the file it loaded', () => {
  test('a running adapter that mapped its file reports it modified after an in-place write, and replaced after a rename over it', async () => {
    const model = path.join(dir, 'tiny.gguf');
    writeTinyLlama(model);
    const adapter = new LlamaEmbeddedAdapter({ modelPath: model, contextLength: 256, mmap: true });
    await adapter.start();
    try {
      expect(adapter.modelFileState()).toBe('unchanged');
      fs.appendFileSync(model, Buffer.alloc(32)); // in place: same inode, the mapped pages untouched
      expect(adapter.modelFileState()).toBe('modified');
      // Deleted or renamed over afterwards, it stays modified: the weights in memory were touched.
      const moved = path.join(dir, 'moved.gguf');
      fs.renameSync(model, moved);
      expect(adapter.modelFileState()).toBe('modified');
      fs.renameSync(moved, model);
    } finally {
      await adapter.stop();
    }
    const again = new LlamaEmbeddedAdapter({ modelPath: model, contextLength: 256, mmap: true });
    await again.start();
    try {
      expect(again.modelFileState()).toBe('unchanged'); // a restart hashes and watches the file as it is now
      const fresh = path.join(dir, 'fresh.gguf');
      writeTinyLlama(fresh);
      fs.renameSync(fresh, model);
      expect(again.modelFileState()).toBe('replaced');
    } finally {
      await again.stop();
    }
  });

  test('a running adapter that read its weights into memory (the default) reports an in-place write as replaced: what it serves is what it hashed', async () => {
    const model = path.join(dir, 'tiny.gguf');
    writeTinyLlama(model);
    const adapter = new LlamaEmbeddedAdapter({ modelPath: model, contextLength: 256 });
    await adapter.start();
    try {
      expect(adapter.modelFileState()).toBe('unchanged');
      fs.appendFileSync(model, Buffer.alloc(32));
      expect(adapter.modelFileState()).toBe('replaced');
    } finally {
      await adapter.stop();
    }
  });
});

describe('the node tells the operator once, and stops saying it takes work', () => {
  test('watchModelFiles: one error line for a modified file, one warning for a replaced one, nothing for an unchanged one; repeated checks add nothing', () => {
    const lines: { level: string; obj: Record<string, unknown>; msg: string }[] = [];
    const logger = { warn: (obj: object, msg: string) => void lines.push({ level: 'warn', obj: obj as Record<string, unknown>, msg }), error: (obj: object, msg: string) => void lines.push({ level: 'error', obj: obj as Record<string, unknown>, msg }) };
    const state = { a: 'unchanged', b: 'unchanged', c: 'unchanged' } as Record<string, 'unchanged' | 'modified' | 'replaced'>;
    const models = ['a', 'b', 'c'].map((id) => ({ id, adapter: { info: { modelSha256: `${id}`.repeat(64) }, modelFileState: () => state[id]! } })) as never[];
    watchModelFiles(models, logger as never);
    expect(lines).toEqual([]);
    state.a = 'modified';
    state.b = 'replaced';
    watchModelFiles(models, logger as never);
    watchModelFiles(models, logger as never);
    expect(lines.map((l) => [l.level, l.obj.model])).toEqual([['error', 'a'], ['warn', 'b']]);
    expect(lines[0]!.msg).toMatch(/^model a: its file was modified in place while the node served it, .* the node serves it again once restarted: its requests are refused \(503 no_capacity\) until then$/);
    expect(lines[1]!.msg).toMatch(/^model b: its file was changed, deleted or replaced; the node serves on with the weights it loaded/);
    expect(workRefused(false, true, undefined, undefined, undefined, ['model a: its file was modified'])).toEqual(['model a: its file was modified']);
  });
});
