// Whether a WAL-mode SQLite database's files were changed in place by another program while this
// process has them open: its -wal cut short (`: > receipts.db-wal`, `truncate -s 0`) or written
// over, or the database file written over (`cp old-backup/receipts.db data/receipts.db` writes into
// the same inode). FileGuard (file-guard.ts) sees a file deleted or replaced (another inode); these
// keep the inode, and SQLite carries on: its next checkpoint copies WAL frames into the database,
// mixing old and new pages (or the zeros of a cut WAL) into a file that may no longer open.
//
// The -wal: SQLite's own wal-index (the -shm file's header) says how many frames the WAL holds,
// their salts and the last frame's checksum. Every SQLite writer, in any process, writes a frame
// before the index names it, so a WAL that does not hold the frame its index names as the last, with
// those salts and that checksum, was changed by something else. Stateless: other connections and
// processes (log export beside a running node) writing the file never look like a change.
//
// The database file: in WAL mode SQLite writes it only in a checkpoint. Its size and modification
// time are recorded after this process's own checkpoints, which all run through `checkpoint()` or
// `own()` (the connections are opened with SQLite's automatic checkpoint off): marked busy in
// memory shared by the process's threads (a check from another thread while one runs is skipped),
// looked at first, recorded after (when the WAL index shows it copied something). Any other change
// was made by something else: nothing else may checkpoint a node's databases while it runs
// (seller-node's own tools never do; a program that did would be taken for one changing them).
//
// File descriptors: POSIX drops all of a process's locks on a file when any descriptor of it is
// closed, SQLite's included. So the files are opened once a process (per database file, shared by
// every seal on it), read with pread, and closed only once the last seal is released, after the
// connections that use it are closed. Worker threads are handed the descriptors and never close them.
import fs from 'node:fs';
import os from 'node:os';

/** What a check found changed: the file, and what (a sentence fragment, as in "its file X was …"). */
export interface SealProblem {
  file: string;
  what: string;
}

/** The wal-index header as the checks use it. */
export interface WalIndex {
  /** The WAL's salts (hex): new each time SQLite starts the WAL over (which it does only once all of it is copied into the database). */
  gen: string;
  salt: Buffer;
  pageSize: number;
  /** Frames the WAL holds (committed). */
  mxFrame: number;
  /** The database's size in pages as of the last commit. */
  nPage: number;
  /** The last frame's checksum. */
  cksum: [number, number];
  /** Frames already copied into the database (by checkpoints). */
  nBackfill: number;
}

/** Descriptors of a database's files (-1: not there when opened), and its shared state. */
export interface SharedSeal {
  db: string;
  fds: { db: number; wal: number; shm: number };
  state: SharedArrayBuffer;
}

const LITTLE = os.endianness() === 'LE';
const u32 = (b: Buffer, at: number): number => (LITTLE ? b.readUInt32LE(at) : b.readUInt32BE(at));
/** The wal-index header is two copies of 48 bytes, then the checkpoint info (nBackfill at 96). */
const INDEX_BYTES = 136;
const WAL_MAGIC = [0x377f0682, 0x377f0683];

function pread(fd: number, buf: Buffer, at: number): number {
  try {
    return fs.readSync(fd, buf, 0, buf.length, at);
  } catch {
    return -1;
  }
}

/** The wal-index header; 'none' (no WAL in use), or 'unsettled' (being written this moment). */
export function readWalIndex(shmFd: number, buf: Buffer = Buffer.alloc(INDEX_BYTES)): WalIndex | 'none' | 'unsettled' {
  if (shmFd < 0 || pread(shmFd, buf, 0) < INDEX_BYTES) return 'none';
  if (buf.compare(buf, 0, 48, 48, 96) !== 0) return 'unsettled';
  if (buf[12] !== 1 || u32(buf, 0) !== 3007000) return 'none'; // (not initialised, or not a format this reads)
  const raw = LITTLE ? buf.readUInt16LE(14) : buf.readUInt16BE(14);
  return {
    gen: buf.toString('hex', 32, 40),
    salt: Buffer.from(buf.subarray(32, 40)),
    pageSize: (raw & 0xfe00) + ((raw & 1) << 16),
    mxFrame: u32(buf, 16),
    nPage: u32(buf, 20),
    cksum: [u32(buf, 24), u32(buf, 28)],
    nBackfill: u32(buf, 96),
  };
}

const sameHeader = (a: WalIndex, b: WalIndex): boolean => a.mxFrame === b.mxFrame && a.salt.equals(b.salt) && a.cksum[0] === b.cksum[0] && a.cksum[1] === b.cksum[1];

/**
 * Whether a checkpoint may have written the database file between two readings of the index, one
 * just before a checkpoint of this process's and one just after it: its backfill count raised, or
 * the WAL started over (salts changed) when frames were left to copy before, or copied from since.
 * (A checkpoint that found everything copied already writes nothing; a TRUNCATE one then only
 * starts the WAL over.)
 */
function backfilledSince(base: WalIndex, now: WalIndex): boolean {
  if (now.salt.equals(base.salt)) return now.nBackfill > base.nBackfill;
  return base.nBackfill < base.mxFrame || now.nBackfill > 0;
}

const mib = (n: number | bigint): string => `${(Number(n) / 1048576).toFixed(1)} MiB`;

/** Shared-state layout: int32 [lock, busy, has a record]; float64 [size, mtime ms]. */
const I32 = 4;
const F64 = 2;
const STATE_BYTES = I32 * 4 + F64 * 8;

interface Entry {
  key: string;
  shared: SharedSeal;
  refs: number;
}
/** Per database file (device:inode) in this process. */
const entries = new Map<string, Entry>();

function openRead(file: string): number {
  try {
    return fs.openSync(file, 'r');
  } catch {
    return -1;
  }
}

export class SqliteSeal {
  readonly db: string;
  private readonly fds: { db: number; wal: number; shm: number };
  private readonly lock: Int32Array;
  private readonly base: Float64Array;
  private readonly entry: Entry | undefined;
  private readonly indexBuf = Buffer.alloc(INDEX_BYTES);
  private readonly walHead = Buffer.alloc(32);
  private readonly frameHead = Buffer.alloc(24);
  /** The database header's bytes 24 to 96: change counter, page count, …, the count's version-valid-for. */
  private readonly dbHead = Buffer.alloc(72);
  private released = false;

  private constructor(shared: SharedSeal, entry?: Entry) {
    this.db = shared.db;
    this.fds = shared.fds;
    this.lock = new Int32Array(shared.state, 0, I32);
    this.base = new Float64Array(shared.state, I32 * 4, F64);
    this.entry = entry;
  }

  /**
   * The seal of `dbPath` in this process, opened once its connection has the WAL in use (its -wal
   * and -shm are there). Release it after closing the connections that use it.
   */
  static attach(dbPath: string): SqliteSeal {
    const st = fs.statSync(dbPath);
    const key = `${st.dev}:${st.ino}`;
    let entry = entries.get(key);
    if (!entry) {
      const state = new SharedArrayBuffer(STATE_BYTES);
      entry = { key, refs: 0, shared: { db: dbPath, fds: { db: openRead(dbPath), wal: openRead(`${dbPath}-wal`), shm: openRead(`${dbPath}-shm`) }, state } };
      entries.set(key, entry);
    }
    entry.refs++;
    const seal = new SqliteSeal(entry.shared, entry);
    if (Atomics.load(seal.lock, 2) === 0) seal.locked(() => seal.rebaseline());
    return seal;
  }

  /** A seal made in a worker thread from `share()`'s value: it never closes the descriptors. */
  static shared(shared: SharedSeal): SqliteSeal {
    return new SqliteSeal(shared);
  }

  /** What a worker thread needs to check (and checkpoint) the same files. */
  share(): SharedSeal {
    return { db: this.db, fds: this.fds, state: this.lock.buffer as SharedArrayBuffer };
  }

  /** The database file's descriptor (read only), for copying what it holds; -1 when it could not be opened. */
  get dbFd(): number {
    return this.fds.db;
  }

  /** Releases this seal; the last one of a file closes its descriptors (its connections must be closed by then). */
  release(): void {
    if (this.released || !this.entry) return;
    this.released = true;
    if (--this.entry.refs > 0) return;
    entries.delete(this.entry.key);
    for (const fd of Object.values(this.fds)) {
      if (fd < 0) continue;
      try {
        fs.closeSync(fd);
      } catch {
        // (already closed)
      }
    }
  }

  private locked<T>(run: () => T): T {
    while (Atomics.compareExchange(this.lock, 0, 0, 1) !== 0) Atomics.wait(this.lock, 0, 1, 1);
    try {
      return run();
    } finally {
      Atomics.store(this.lock, 0, 0);
      Atomics.notify(this.lock, 0, 1);
    }
  }

  /** The wal-index header as it stands (retried while a writer changes it), or undefined. */
  index(): WalIndex | undefined {
    for (let i = 0; i < 8; i++) {
      const r = readWalIndex(this.fds.shm, this.indexBuf);
      if (r === 'none') return undefined;
      if (r !== 'unsettled') return r;
    }
    return undefined;
  }

  /** Records the database file's size and modification time as they are now. */
  private rebaseline(): void {
    let size = -1;
    let mtime = -1;
    try {
      const st = fs.fstatSync(this.fds.db);
      size = st.size;
      mtime = st.mtimeMs; // (to a fraction of a microsecond)
    } catch {
      // (no descriptor: the file is not checked)
    }
    this.base.set([size, mtime]);
    Atomics.store(this.lock, 2, 1);
  }

  /**
   * The -wal as its index says it is, or why not: its header and its last frame (the index's
   * mxFrame) carry the index's salts, and that frame its checksum. A mismatch is read again
   * between two readings of the index: a writer that starts the WAL over changes the index first,
   * so a WAL read while that happens is retried, never taken for a change.
   */
  walProblem(): SealProblem | undefined {
    if (this.fds.wal < 0 || this.fds.shm < 0) return undefined;
    const file = `${this.db}-wal`;
    for (let attempt = 0; attempt < 8; attempt++) {
      const a = this.index();
      if (!a || a.mxFrame === 0) return undefined; // (an empty WAL: nothing in it to lose)
      const frameBytes = a.pageSize + 24;
      const end = 32 + a.mxFrame * frameBytes;
      const gotHead = pread(this.fds.wal, this.walHead, 0);
      const gotFrame = pread(this.fds.wal, this.frameHead, end - frameBytes);
      const cut = gotHead < 32 || gotFrame < 24;
      const header = !cut && WAL_MAGIC.includes(this.walHead.readUInt32BE(0)) && this.walHead.subarray(16, 24).equals(a.salt);
      const last = !cut && this.frameHead.subarray(8, 16).equals(a.salt) && this.frameHead.readUInt32BE(16) === a.cksum[0] && this.frameHead.readUInt32BE(20) === a.cksum[1];
      if (header && last) return undefined;
      const b = this.index();
      if (!b || !sameHeader(a, b)) continue;
      if (cut) {
        let size = 'shorter';
        try {
          size = `${fs.fstatSync(this.fds.wal).size} bytes`;
        } catch {
          // (said without its size)
        }
        return { file, what: `was cut short in place (it is ${size}; SQLite's index of it names ${a.mxFrame} frames, ${end} bytes, not yet all copied into the database)` };
      }
      if (!header) return { file, what: "was written over in place (its header is not the one SQLite's index of it names)" };
      return { file, what: `was written over in place (its frame ${a.mxFrame} is not the one SQLite's index of it names as its last)` };
    }
    return undefined; // (writers kept changing it: judged at the next check)
  }

  /** The database file as this process's checkpoints left it, or why not; undefined too while a checkpoint of this process runs. */
  dbProblem(): SealProblem | undefined {
    return this.locked(() => (Atomics.load(this.lock, 1) > 0 ? undefined : this.dbProblemLocked()));
  }

  /** dbProblem's judgement, under the lock. */
  private dbProblemLocked(): SealProblem | undefined {
    if (this.fds.db < 0) return undefined;
    let size: number;
    let mtime: number;
    try {
      const st = fs.fstatSync(this.fds.db);
      size = st.size;
      mtime = st.mtimeMs; // (to a fraction of a microsecond)
    } catch {
      return undefined;
    }
    const [baseSize, baseMtime] = Array.from(this.base);
    if (size === baseSize && mtime === baseMtime) {
      const idx = this.index();
      return idx && this.shapeProblem(idx);
    }
    const sized = size === baseSize ? `still ${mib(size)}` : `${mib(baseSize!)} before, ${mib(size)} now`;
    return { file: this.db, what: `was written over in place (${sized}, modified at ${new Date(mtime).toISOString()}, by no checkpoint of the node's)` };
  }

  /**
   * With all of the WAL copied into it, the database file as the index says it is, or why not: its
   * size nPage pages and its header's page count nPage (a checkpoint that copies the last frames
   * sets both; an older copy written over it has fewer, mostly). The header's count only when it
   * says it is valid (its version-valid-for number is the change counter). Read between two
   * readings of the index: one that changed meanwhile (a commit, a checkpoint) says nothing.
   */
  private shapeProblem(idx: WalIndex): SealProblem | undefined {
    if (idx.nBackfill !== idx.mxFrame || idx.nPage === 0 || this.fds.db < 0) return undefined;
    let size: number;
    try {
      size = fs.fstatSync(this.fds.db).size;
    } catch {
      return undefined;
    }
    const head = pread(this.fds.db, this.dbHead, 24) === 72;
    const pages = head ? this.dbHead.readUInt32BE(4) : -1;
    const valid = head && this.dbHead.readUInt32BE(0) === this.dbHead.readUInt32BE(68);
    const again = this.index();
    if (!again || !sameHeader(idx, again) || again.nBackfill !== idx.nBackfill || again.nPage !== idx.nPage) return undefined;
    if (size === idx.nPage * idx.pageSize && (pages === idx.nPage || (head && !valid))) return undefined;
    return { file: this.db, what: `was written over in place (it is ${mib(size)}, ${pages < 0 ? 'no' : pages} pages by its header, where SQLite's index, its WAL all copied in, says ${idx.nPage} pages)` };
  }

  /** Both files: the -wal first (the loss a checkpoint would make worse soonest). */
  check(opts: { db?: boolean } = {}): SealProblem | undefined {
    return this.walProblem() ?? (opts.db === false ? undefined : this.dbProblem());
  }

  /**
   * Runs a checkpoint of this process's (`PRAGMA wal_checkpoint(mode)` on `db`) once both files are
   * as they should be, marked busy while it runs, and records the database file as it left it.
   * When they are not, it is not run and the problem is returned.
   */
  checkpoint(db: { pragma(source: string): unknown }, mode: 'PASSIVE' | 'TRUNCATE' = 'PASSIVE'): SealProblem | undefined {
    return this.own(() => void db.pragma(`wal_checkpoint(${mode})`));
  }

  /**
   * Runs `write` (which may checkpoint) as checkpoint() runs one: only on files as they should be,
   * recorded after. `write` must not commit: a commit may start the WAL over, and a checkpoint
   * after it in the same `write` then leaves the index as one that copied nothing would, so the
   * record would stay and the file's change be taken for another program's (commit first, then own()).
   */
  own(write: () => void): SealProblem | undefined {
    const wal = this.walProblem();
    if (wal) return wal;
    // (judged and marked busy under one lock: no other thread's check falls between; while another
    // checkpoint of this process runs the file cannot be judged, and SQLite runs one at a time)
    let before: WalIndex | undefined;
    const problem = this.locked(() => {
      const p = Atomics.load(this.lock, 1) > 0 ? undefined : this.dbProblemLocked();
      if (!p) {
        Atomics.add(this.lock, 1, 1);
        before = this.index();
      }
      return p;
    });
    if (problem) return problem;
    let shape: SealProblem | undefined;
    try {
      write();
    } finally {
      this.locked(() => {
        // The file as it left it, when it may have written it (the index shows a checkpoint): one
        // that copied nothing (all copied already) leaves the record as it was, so that a change
        // made meanwhile by something else is still seen; and one that copied the WAL whole left
        // the file as the index says (else something wrote it meanwhile, and the record stays).
        const after = this.index();
        shape = after && this.shapeProblem(after);
        if (!shape && (!before || !after || backfilledSince(before, after))) this.rebaseline();
        Atomics.sub(this.lock, 1, 1);
      });
    }
    return shape;
  }
}
