// Small text files an operator names (the config, the node key, the API keys file, price lists),
// read whole without ever waiting: readFileSync on a FIFO blocks the thread until a writer comes
// (for ever, with the gateway's API keys file read again on a timer), and on a device such as
// /dev/zero it reads until memory runs out. Opened without blocking, checked, then read.
import fs from 'node:fs';

/** The most a file read here may hold; a config or keys file is kilobytes. */
export const MAX_TEXT_FILE = 16 * 1024 * 1024;

/**
 * The file's text (UTF-8). Throws the file system's error (ENOENT, EACCES…: fsProblem words it),
 * EISDIR for a folder, ENOTREG for anything else not a regular file, ETOOLARGE beyond `maxBytes`.
 */
export function readTextFile(file: string, maxBytes = MAX_TEXT_FILE): string {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (st.isDirectory()) throw errno('EISDIR', 'it is a folder');
    if (!st.isFile()) throw errno('ENOTREG', `it is ${st.isFIFO() ? 'a FIFO' : st.isSocket() ? 'a socket' : 'a device'}, not a regular file`);
    if (st.size > maxBytes) throw errno('ETOOLARGE', `it holds ${st.size} bytes, more than the ${maxBytes} such a file may`);
    return fs.readFileSync(fd, 'utf8');
  } finally {
    fs.closeSync(fd);
  }
}

function errno(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}
