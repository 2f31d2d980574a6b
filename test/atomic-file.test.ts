// writeFileAtomic (src/atomic-file.ts): a reader sees the old file or the whole new one, and a write
// that fails leaves the folder as it was: the old target, and no temporary file beside it.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test, vi } from 'vitest';
import { writeAllSync, writeFileAtomic } from '../src/atomic-file.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'atomic-file-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

let n = 0;
/** A new empty folder for one test. */
function folder(): string {
  const d = path.join(root, String(n++));
  fs.mkdirSync(d);
  return d;
}

const write = (text: string) => (fd: number) => void fs.writeSync(fd, text);

describe('writeFileAtomic', () => {
  test('replaces the content of an existing file, and leaves nothing else in the folder', () => {
    const d = folder();
    const file = path.join(d, 'list.json');
    writeFileAtomic(file, write('first version, rather longer than the second'));
    expect(fs.readFileSync(file, 'utf8')).toBe('first version, rather longer than the second');
    writeFileAtomic(file, write('second'));
    expect(fs.readFileSync(file, 'utf8')).toBe('second'); // replaced, not overwritten in place (no tail of the first)
    expect(fs.readdirSync(d)).toEqual(['list.json']);
  });

  test('a write callback that throws: the error reaches the caller, the old file is intact, no temporary file is left', () => {
    const d = folder();
    const file = path.join(d, 'list.json');
    fs.writeFileSync(file, 'old content');
    const failure = new Error('disk full (simulated by the callback)');
    expect(() =>
      writeFileAtomic(file, (fd) => {
        fs.writeSync(fd, 'half of the new con'); // some bytes went to the temporary file first
        throw failure;
      }),
    ).toThrow(failure);
    expect(fs.readFileSync(file, 'utf8')).toBe('old content');
    expect(fs.readdirSync(d)).toEqual(['list.json']);
    // ... and a new target that never existed is not created either.
    expect(() => writeFileAtomic(path.join(d, 'new.json'), () => { throw failure; })).toThrow(failure);
    expect(fs.readdirSync(d)).toEqual(['list.json']);
  });

  test('a rename that fails (the target is a non-empty folder) throws, and no temporary file is left', () => {
    const d = folder();
    const target = path.join(d, 'target');
    fs.mkdirSync(target);
    fs.writeFileSync(path.join(target, 'inside'), 'kept'); // (permissions do not stop root; a file cannot replace a folder)
    let err: unknown;
    try {
      writeFileAtomic(target, write('new content'));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(Error);
    expect((err as NodeJS.ErrnoException).code).toBe('EISDIR');
    expect((err as NodeJS.ErrnoException).syscall).toBe('rename');
    expect((err as NodeJS.ErrnoException).path).toBe(target); // the target named, not the temporary file
    expect(fs.readdirSync(d)).toEqual(['target']); // the filled temporary file was removed
    expect(fs.readFileSync(path.join(target, 'inside'), 'utf8')).toBe('kept');
  });

  test('a file system error names the target as its path: a write on the descriptor (ENOSPC-like, no path of its own) and an open that fails', () => {
    const d = folder();
    const file = path.join(d, 'out.json');
    let err: NodeJS.ErrnoException | undefined;
    try {
      writeFileAtomic(file, () => {
        throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', syscall: 'write' });
      });
    } catch (e) {
      err = e as NodeJS.ErrnoException;
    }
    expect([err?.code, err?.path]).toEqual(['ENOSPC', file]);
    const inMissing = path.join(d, 'no-such-folder', 'out.json');
    try {
      writeFileAtomic(inMissing, write('x'));
    } catch (e) {
      err = e as NodeJS.ErrnoException;
    }
    expect([err?.code, err?.path]).toEqual(['ENOENT', inMissing]);
    // An error that is not the file system's is passed on untouched.
    const plain = new Error('the caller failed');
    expect(() => writeFileAtomic(file, () => { throw plain; })).toThrow(plain);
    expect((plain as { path?: unknown }).path).toBeUndefined();
  });

  test('mode is applied exactly, whatever the umask (a strict one and none at all)', () => {
    const d = folder();
    const old = process.umask(0o077);
    try {
      writeFileAtomic(path.join(d, 'public'), write('x'), 0o644);
      writeFileAtomic(path.join(d, 'group'), write('x'), 0o664);
      process.umask(0);
      writeFileAtomic(path.join(d, 'private'), write('x'), 0o600);
      // A target that exists with another mode gets the mode asked for (the new file replaces it).
      fs.writeFileSync(path.join(d, 'was-open'), 'x', { mode: 0o666 });
      fs.chmodSync(path.join(d, 'was-open'), 0o666);
      writeFileAtomic(path.join(d, 'was-open'), write('y'), 0o640);
    } finally {
      process.umask(old);
    }
    const mode = (name: string) => fs.statSync(path.join(d, name)).mode & 0o777;
    expect(mode('public')).toBe(0o644);
    expect(mode('group')).toBe(0o664);
    expect(mode('private')).toBe(0o600);
    expect(mode('was-open')).toBe(0o640);
    expect(fs.readFileSync(path.join(d, 'was-open'), 'utf8')).toBe('y');
  });
});

describe('writeAllSync', () => {
  test('a write that takes only part of the bytes (a size limit reached mid-write) is carried on until all are written', () => {
    const file = path.join(folder(), 'short');
    const real = fs.writeSync;
    const calls: number[] = [];
    // write(2) as it is under a limit: at most 7 bytes a call.
    const spy = vi.spyOn(fs, 'writeSync').mockImplementation(((fd: number, data: Uint8Array) => {
      calls.push(data.length);
      return real(fd, data.subarray(0, 7));
    }) as unknown as typeof fs.writeSync);
    try {
      writeFileAtomic(file, (fd) => writeAllSync(fd, 'ünïcödé text of thirty bytes or so'));
    } finally {
      spy.mockRestore();
    }
    expect(fs.readFileSync(file, 'utf8')).toBe('ünïcödé text of thirty bytes or so');
    expect(calls.length).toBeGreaterThan(1);
  });

  test('a write that makes no progress is an error (EIO), never taken as done; a later error is thrown as it is', () => {
    const d = folder();
    const file = path.join(d, 'stuck');
    const spy = vi.spyOn(fs, 'writeSync').mockReturnValue(0);
    try {
      expect(() => writeFileAtomic(file, (fd) => writeAllSync(fd, 'abc'))).toThrow(/short write: 3 bytes not written/);
    } finally {
      spy.mockRestore();
    }
    expect(fs.readdirSync(d)).toEqual([]);
    const real = fs.writeSync;
    let first = true;
    const limit = vi.spyOn(fs, 'writeSync').mockImplementation(((fd: number, data: Uint8Array) => {
      if (!first) throw Object.assign(new Error('EFBIG: file too large, write'), { code: 'EFBIG' });
      first = false;
      return real(fd, data.subarray(0, 2));
    }) as unknown as typeof fs.writeSync);
    try {
      expect(() => writeFileAtomic(file, (fd) => writeAllSync(fd, 'abcdef'))).toThrow(expect.objectContaining({ code: 'EFBIG', path: file }));
    } finally {
      limit.mockRestore();
    }
    expect(fs.readdirSync(d)).toEqual([]);
  });
});
