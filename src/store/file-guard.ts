// Whether the files a SQLite database lives in are still the ones it opened. SQLite goes on
// writing into a database (or its -wal) that was deleted or replaced while open, and everything
// written from then on is lost when the process ends: the receipt log stops, and the state store
// refuses paid work, as soon as this says so (checked every few seconds and at checkpoints).
// Files changed in place (the same inode: cut short, written over) are sqlite-seal.ts's; FileGuard
// can also note a file's size and modification time after this process's own writes (`seal()`),
// for a database no other connection writes (the dev market's, in exclusive locking mode).
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { fileIdentity } from '../../adapters/model-file.ts';
import type { SqliteSeal } from './sqlite-seal.ts';

/** A file's device and inode ("dev:ino"), or undefined when it is not there. */
export function fileId(file: string): string | undefined {
  const id = fileIdentity(file);
  return id && `${id.dev}:${id.ino}`;
}

/** A file's size and modification time, to the nanosecond ("size@mtime"), or undefined. */
function fileStamp(file: string): string | undefined {
  try {
    const st = fs.statSync(file, { bigint: true });
    return `${st.size}@${st.mtimeNs}`;
  } catch {
    return undefined;
  }
}

export class FileGuard {
  /** Each file, its identity once it has been seen (a -wal appears at a database's first write), and its stamp at the last seal(). */
  private readonly files: { path: string; id: string | undefined; stamp: string | undefined }[];
  private sealed = false;

  /** Watches the database file and its -wal, as they are now (or as they first appear). */
  constructor(dbPath: string) {
    this.files = [dbPath, `${dbPath}-wal`].map((p) => ({ path: p, id: fileId(p), stamp: undefined }));
  }

  /** The first of them deleted or replaced since it was seen, if any. */
  changed(): string | undefined {
    for (const f of this.files) {
      const now = fileId(f.path);
      if (f.id === undefined) f.id = now; // (not there yet: watched from when it is)
      else if (now !== f.id) return f.path;
    }
    return undefined;
  }

  /**
   * Notes both files' size and modification time as this process's writes left them: from then on
   * writtenOver() says when either changed otherwise. Call after every write (a commit may checkpoint).
   */
  seal(): void {
    this.sealed = true;
    for (const f of this.files) f.stamp = fileStamp(f.path);
  }

  /** The first file changed in place since seal() (written, cut short), if any. */
  writtenOver(): string | undefined {
    if (!this.sealed) return undefined;
    for (const f of this.files) if (f.stamp !== undefined && fileStamp(f.path) !== f.stamp) return f.path;
    return undefined;
  }
}

/**
 * Copies what `db` (an open connection to a deleted or replaced file) still reads to
 * `<name>.rescued-<ms>.db` beside it (mode 0600), and says what to do with it; or why it could not
 * (nothing half-made is left), that the caller tries again (the open connection still holds every
 * row: the copy must be made before the process ends), and then `ifFailed`: what the operator can
 * do if it never is (what a backup lacks depends on the file). `what` is in lower case, as in
 * "its 12 durable receipts".
 */
export function rescueDatabase(db: Database.Database, dbPath: string, what: string, ifFailed: string): { ok: boolean; message: string } {
  const rescued = path.join(path.dirname(dbPath), `${path.basename(dbPath).replace(/\.db$/, '')}.rescued-${Date.now()}.db`);
  let existed = true;
  try {
    existed = fs.existsSync(rescued);
    db.prepare('VACUUM INTO ?').run(rescued);
    fs.chmodSync(rescued, 0o600);
    return { ok: true, message: `${what.charAt(0).toUpperCase()}${what.slice(1)} were copied to ${rescued}: stop the node, move that file to ${dbPath} (and remove ${dbPath}-wal and -shm if they are there) and start again.` };
  } catch (e) {
    // (A copy cut short by a full disk or a size limit is no copy: it goes, unless it was there before.)
    if (!existed) {
      for (const f of [rescued, `${rescued}-journal`]) {
        try {
          fs.rmSync(f, { force: true });
        } catch {
          // (its folder gone or replaced: nothing there to remove)
        }
      }
    }
    return {
      ok: false,
      message: `Copying ${what} out failed (${(e as Error).message}). The node still holds them and tries again every few seconds while it runs: free space on the data dir's disk if it is full (a deleted file frees none while the node holds it open), and do not stop the node before it says the copy is made. If it stops first: ${ifFailed}`,
    };
  }
}

/**
 * rescueDatabase for a database whose files were changed in place (sqlite-seal.ts): what the
 * connection still reads, as it reads it, or, when that fails (the pages a WAL cut short no longer
 * holds), the database file as it is (for a cut WAL: as its last checkpoint left it). `dbFd` is this
 * process's descriptor of it (never closed here: that would drop SQLite's locks).
 */
export function rescueChangedDatabase(db: Database.Database, dbPath: string, dbFd: number, what: string, ifFailed: string): { ok: boolean; message: string } {
  const read = rescueDatabase(db, dbPath, what, ifFailed);
  if (read.ok) {
    const at = /copied to (.+?): stop the node/.exec(read.message)?.[1];
    let sound = false;
    try {
      const copy = new Database(at!, { readonly: true, fileMustExist: true });
      try {
        sound = copy.pragma('quick_check(1)', { simple: true }) === 'ok';
      } finally {
        copy.close();
      }
    } catch {
      // (not a database: the file instead)
    }
    if (sound) return { ok: true, message: `${read.message} (It holds what the node still read through the changed files: rows from another time may be among them.)` };
    for (const f of [at!, `${at}-journal`]) fs.rmSync(f, { force: true });
  }
  const rescued = path.join(path.dirname(dbPath), `${path.basename(dbPath).replace(/\.db$/, '')}.rescued-${Date.now()}.db`);
  try {
    if (dbFd < 0) throw new Error('the node holds no descriptor of it');
    const out = fs.openSync(rescued, 'wx', 0o600);
    try {
      const buf = Buffer.alloc(1024 * 1024);
      for (let at = 0; ; ) {
        const n = fs.readSync(dbFd, buf, 0, buf.length, at);
        if (n <= 0) break;
        for (let w = 0; w < n; ) w += fs.writeSync(out, buf, w, n - w, at + w);
        at += n;
      }
      fs.fsyncSync(out);
    } finally {
      fs.closeSync(out);
    }
    return { ok: true, message: `${what.charAt(0).toUpperCase()}${what.slice(1)} as the database file holds them (as of its last checkpoint: what its -wal held since is not in it) were copied to ${rescued}: stop the node, move that file to ${dbPath} (and remove ${dbPath}-wal and -shm if they are there) and start again.` };
  } catch (e) {
    fs.rmSync(rescued, { force: true });
    return { ok: false, message: read.ok ? `Copying ${what} out failed (${(e as Error).message}). If the node stops: ${ifFailed}` : read.message };
  }
}

/**
 * What a DatabaseRescue check found: the files just found gone, or changed in place (what, as in
 * "was cut short in place (…)"), and the copy's outcome; or a copy that failed before now made.
 */
export type RescueEvent =
  | { kind: 'gone'; file: string; copy: { ok: boolean; message: string } }
  | { kind: 'changed'; file: string; what: string; copy: { ok: boolean; message: string } }
  | { kind: 'made'; message: string };

/**
 * A database's files watched while it is in use; once they are deleted or replaced, what its
 * connection still holds is copied out (rescueDatabase), and a copy that failed (a full disk: the
 * deleted file frees no space while it is held open) is tried again at each later check until it
 * is made. `what` and `ifFailed` are read at each try (a log's receipt count grows until it stops).
 */
export class DatabaseRescue {
  private state: 'watching' | 'failed' | 'done' = 'watching';
  /** How the files were found: deleted or replaced, or changed in place (the seal's problem). */
  private found: 'gone' | 'changed' = 'gone';
  private readonly files: FileGuard;
  private readonly db: Database.Database;
  private readonly dbPath: string;
  private readonly what: () => string;
  private readonly ifFailed: () => string;
  private readonly seal: SqliteSeal | undefined;

  /** `seal`: the files are also watched for changes in place (receipt-log.ts does its own). */
  constructor(db: Database.Database, dbPath: string, what: () => string, ifFailed: () => string, seal?: SqliteSeal) {
    this.files = new FileGuard(dbPath);
    this.db = db;
    this.dbPath = dbPath;
    this.what = what;
    this.ifFailed = ifFailed;
    this.seal = seal;
  }

  /** Whether a check found the files changed in place (not deleted or replaced): nothing may be checkpointed into them. */
  get changedInPlace(): boolean {
    return this.state !== 'watching' && this.found === 'changed';
  }

  /** Looks at the files (or tries a failed copy again); what there is to say, if anything. */
  check(): RescueEvent | undefined {
    if (this.state === 'done') return undefined;
    const gone = this.state === 'failed' ? undefined : this.files.changed();
    const changed = this.state === 'watching' && !gone ? this.seal?.check() : undefined;
    if (this.state === 'watching' && !gone && !changed) return undefined;
    if (changed) this.found = 'changed';
    const copy = this.found === 'changed' ? rescueChangedDatabase(this.db, this.dbPath, this.seal!.dbFd, this.what(), this.ifFailed()) : rescueDatabase(this.db, this.dbPath, this.what(), this.ifFailed());
    if (this.state === 'failed') {
      if (!copy.ok) return undefined; // (said when it first failed; said again once made)
      this.state = 'done';
      return { kind: 'made', message: copy.message };
    }
    this.state = copy.ok ? 'done' : 'failed';
    return changed ? { kind: 'changed', file: changed.file, what: changed.what, copy } : { kind: 'gone', file: gone!, copy };
  }
}
