// Whether the files a SQLite database lives in are still the ones it opened. SQLite goes on
// writing into a database (or its -wal) that was deleted or replaced while open, and everything
// written from then on is lost when the process ends: the receipt log stops, and the state store
// refuses paid work, as soon as this says so (checked every few seconds and at checkpoints).
import fs from 'node:fs';
import path from 'node:path';
import type Database from 'better-sqlite3';
import { fileIdentity } from '../../adapters/model-file.ts';

/** A file's device and inode ("dev:ino"), or undefined when it is not there. */
export function fileId(file: string): string | undefined {
  const id = fileIdentity(file);
  return id && `${id.dev}:${id.ino}`;
}

export class FileGuard {
  /** Each file, and its identity once it has been seen (a -wal appears at a database's first write). */
  private readonly files: { path: string; id: string | undefined }[];

  /** Watches the database file and its -wal, as they are now (or as they first appear). */
  constructor(dbPath: string) {
    this.files = [dbPath, `${dbPath}-wal`].map((p) => ({ path: p, id: fileId(p) }));
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

/** What a DatabaseRescue check found: the files just found gone (and the copy's outcome), or a copy that failed before now made. */
export type RescueEvent = { kind: 'gone'; file: string; copy: { ok: boolean; message: string } } | { kind: 'made'; message: string };

/**
 * A database's files watched while it is in use; once they are deleted or replaced, what its
 * connection still holds is copied out (rescueDatabase), and a copy that failed (a full disk: the
 * deleted file frees no space while it is held open) is tried again at each later check until it
 * is made. `what` and `ifFailed` are read at each try (a log's receipt count grows until it stops).
 */
export class DatabaseRescue {
  private state: 'watching' | 'failed' | 'done' = 'watching';
  private readonly files: FileGuard;
  private readonly db: Database.Database;
  private readonly dbPath: string;
  private readonly what: () => string;
  private readonly ifFailed: () => string;

  constructor(db: Database.Database, dbPath: string, what: () => string, ifFailed: () => string) {
    this.files = new FileGuard(dbPath);
    this.db = db;
    this.dbPath = dbPath;
    this.what = what;
    this.ifFailed = ifFailed;
  }

  /** Looks at the files (or tries a failed copy again); what there is to say, if anything. */
  check(): RescueEvent | undefined {
    if (this.state === 'done') return undefined;
    const gone = this.state === 'failed' ? undefined : this.files.changed();
    if (this.state === 'watching' && !gone) return undefined;
    const copy = rescueDatabase(this.db, this.dbPath, this.what(), this.ifFailed());
    if (this.state === 'failed') {
      if (!copy.ok) return undefined; // (said when it first failed; said again once made)
      this.state = 'done';
      return { kind: 'made', message: copy.message };
    }
    this.state = copy.ok ? 'done' : 'failed';
    return { kind: 'gone', file: gone!, copy };
  }
}
