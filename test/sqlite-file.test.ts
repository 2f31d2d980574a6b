// openWritableSqlite: a SQLite file this process writes, or an error naming the file and why.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { openWritableSqlite } from '../src/sqlite-file.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sqlite-file-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('openWritableSqlite', () => {
  test('opens (and creates) a file it may write', () => {
    const db = openWritableSqlite(path.join(dir, 'a.db'));
    db.exec('CREATE TABLE t (x)');
    db.close();
    expect(fs.existsSync(path.join(dir, 'a.db'))).toBe(true);
  });
  test('a missing folder and a folder where the file goes are named with the file', () => {
    const missing = path.join(dir, 'nope', 'b.db');
    expect(() => openWritableSqlite(missing)).toThrow(`${missing}: its folder ${path.join(dir, 'nope')}: not found`);
    const folder = path.join(dir, 'c.db');
    fs.mkdirSync(folder);
    expect(() => openWritableSqlite(folder)).toThrow(`${folder}: unable to open database file`);
  });
});
