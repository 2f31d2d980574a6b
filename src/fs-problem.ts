// File system failures in words an operator can act on. The usual one is a data dir made by
// another user (`sudo seller-node init`, then the service runs as itself): Node's own messages
// ("EACCES: permission denied, open …") are terse, and existsSync() answers false as if the file
// were missing. (SQLite files: src/sqlite-file.ts.)
import fs from 'node:fs';
import path from 'node:path';

/** Why a file system call failed: a few words from its code, else its message. */
export function fsProblem(e: unknown): string {
  const code = (e as { code?: unknown } | null)?.code;
  switch (code) {
    case 'ENOENT':
      // (mkdir's ENOENT under a folder that exists: a file system that makes no folders, such as
      // /proc, or a mount gone stale; make-folder.ts)
      return (e as { syscall?: unknown }).syscall === 'mkdir' ? 'no folder can be made there (the file system says "no such file or folder": /proc, or a mount gone stale?)' : 'not found';
    case 'EACCES':
    case 'EPERM':
      return `permission denied to this user (uid ${process.getuid?.() ?? '?'}): run seller-node as the user who owns it, or change its permissions`;
    case 'ENOTDIR':
      return 'a folder on its path is a file';
    case 'EISDIR':
      return 'it is a folder';
    case 'ENXIO':
      // (open(2) of a Unix socket, or of a device with nothing behind it)
      return 'it is a socket or an absent device, not a regular file';
    case 'EROFS':
      return 'the file system is read-only';
    case 'ENOSPC':
      return 'no space left on the device';
    case 'EFBIG':
    case 'EDQUOT':
      return 'the file system refused the write (a size limit or quota)';
    default:
      return (e as Error | null)?.message ?? String(e);
  }
}

/** Why a folder could not be made (fs.mkdirSync): fsProblem's words, and a file in the way named as such. */
export function folderProblem(e: unknown): string {
  const { code, syscall, path: made } = (e ?? {}) as { code?: unknown; syscall?: unknown; path?: unknown };
  if (code === 'EEXIST' || code === 'ENOTDIR') return 'it, or a folder on its path, is a file, not a folder';
  // (the folder that refused is the one above the first that was missing, not the one named)
  if ((code === 'EACCES' || code === 'EPERM') && syscall === 'mkdir' && typeof made === 'string') return `it cannot be made: this user (uid ${process.getuid?.() ?? '?'}) may not write in ${path.dirname(made)}`;
  return fsProblem(e);
}

/**
 * undefined when this user may use `file` so (`mode`: fs.constants.R_OK…; by default, that it
 * exists); 'missing' when it does not exist; else why not.
 */
export function accessProblem(file: string, mode: number = fs.constants.F_OK): 'missing' | string | undefined {
  try {
    fs.accessSync(file, mode);
    return undefined;
  } catch (e) {
    return (e as { code?: unknown }).code === 'ENOENT' ? 'missing' : fsProblem(e);
  }
}

/** Whether `e` is a file system (errno) error, whose code fsProblem can put in words. */
export function isErrnoError(e: unknown): boolean {
  return /^E[A-Z]+$/.test(String((e as { code?: unknown } | null)?.code));
}
