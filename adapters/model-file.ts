// What became of a model file since the runtime loaded and hashed it. The node reads the weights
// into its own memory by default (models[].mmap: false), and then nothing done to the file changes
// what it serves: the adapter reports any change as `replaced`. With mmap: true llama.cpp maps the
// file (shared), so a file written over in place changes the weights the node runs while receipts
// still name the hash taken at start: `modified`, and the model must not be served again until the
// node restarts and hashes it anew (a file cut short in place kills the process: SIGBUS). A file
// deleted, or replaced by renaming another over it, leaves the mapping on the old file, whose hash
// is still the truth: `replaced`, served on. The change time is compared too: a write with the old
// modification time put back (`touch -r`) still moves it; so does a chmod or a new hard link,
// which then costs a restart, never a wrong hash.
import fs from 'node:fs';

export interface FileIdentity {
  dev: number;
  ino: number;
  size: number;
  mtimeMs: number;
  /** Changed by any write (and by chmod, chown, a new link): unlike mtime, it cannot be set back. */
  ctimeMs: number;
}

export type ModelFileState = 'unchanged' | 'replaced' | 'modified';

/** The identity of a file now, or undefined when it is not there. */
export function fileIdentity(file: string): FileIdentity | undefined {
  try {
    const st = fs.statSync(file);
    return { dev: st.dev, ino: st.ino, size: st.size, mtimeMs: st.mtimeMs, ctimeMs: st.ctimeMs };
  } catch {
    return undefined;
  }
}

export function modelFileState(loaded: FileIdentity, now: FileIdentity | undefined): ModelFileState {
  if (!now || now.dev !== loaded.dev || now.ino !== loaded.ino) return 'replaced';
  return now.size === loaded.size && now.mtimeMs === loaded.mtimeMs && now.ctimeMs === loaded.ctimeMs ? 'unchanged' : 'modified';
}

/**
 * A model file as the runtime loaded it: `state()` says what became of it since, as often as asked.
 * Modified stays modified (the weights in memory were touched, whatever becomes of the file after);
 * weights read into memory (not mapped) are the bytes hashed at start whatever the file becomes, so
 * a file changed in place is, for what is served, one replaced.
 */
export class LoadedModelFile {
  readonly path: string;
  readonly identity: FileIdentity;
  readonly mapped: boolean;
  private seen: ModelFileState = 'unchanged';
  constructor(path: string, identity: FileIdentity, mapped: boolean) {
    this.path = path;
    this.identity = identity;
    this.mapped = mapped;
  }

  state(): ModelFileState {
    if (this.seen !== 'modified') this.seen = modelFileState(this.identity, fileIdentity(this.path));
    return this.seen === 'modified' && !this.mapped ? 'replaced' : this.seen;
  }
}

/**
 * What `file` is when it is not a regular file: 'a folder', 'a FIFO', 'a socket' or 'a device'
 * (a model must be read twice, at random: a FIFO would also hold its open for ever, and a socket
 * cannot be opened at all); undefined for a regular file. Throws the file system's error (ENOENT).
 */
export function notRegularFile(file: string): string | undefined {
  const st = fs.statSync(file);
  if (st.isFile()) return undefined;
  return st.isDirectory() ? 'a folder' : st.isFIFO() ? 'a FIFO' : st.isSocket() ? 'a socket' : 'a device';
}
