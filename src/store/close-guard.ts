// SQLite's last connection to a WAL database checkpoints the WAL into the database file as it
// closes, then deletes the -wal and -shm (sqlite3WalClose, from sqlite3PagerClose); better-sqlite3
// cannot turn that off (SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE is not exposed). Once another program
// changed the files in place (an older copy written over the database, the -wal cut short), that
// checkpoint would copy the node's pages into what the other program left and delete the -wal
// that held them. A close guard is a read-only connection to the same file, opened with the store
// and read once, then idle: closed after the store's own connection, it keeps that close from
// checkpointing. The checkpoint is made only under an EXCLUSIVE lock on the database file, which
// SQLite refuses while another connection of the process holds SHARED (a connection in WAL mode
// holds it from its first read until it closes: unixLock, "another thread in this same process is
// still holding a shared lock"), and the guard's own close cannot take it on its read-only
// descriptor (fcntl F_WRLCK: EBADF). Opened with the store, not at the stop: a connection that
// opens a database file found empty deletes its -wal. (docs/decisions.md, "files changed in place")
import Database from 'better-sqlite3';

export class CloseGuard {
  private readonly guard: Database.Database;

  private constructor(guard: Database.Database) {
    this.guard = guard;
  }

  /** Opens the guard of `file`, whose store's connection has already read it (WAL mode). */
  static open(file: string): CloseGuard {
    const guard = new Database(file, { readonly: true, fileMustExist: true });
    try {
      guard.pragma('schema_version', { simple: true });
    } catch (e) {
      guard.close();
      throw e;
    }
    return new CloseGuard(guard);
  }

  /**
   * Closes `db` and the guard. Normally the guard first, so that db's close makes its final
   * checkpoint; after the files were changed in place, the guard last, so that nothing is
   * checkpointed into them and the -wal stays.
   */
  closeWith(db: Database.Database, filesChanged: boolean): void {
    try {
      if (!filesChanged) this.guard.close();
      if (db.open) db.close();
    } finally {
      this.release();
    }
  }

  /** Closes the guard alone (the store failed to open). */
  release(): void {
    if (this.guard.open) this.guard.close();
  }
}
