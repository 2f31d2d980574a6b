// Spying on a libp2p connection's TCP socket and reading raw stream bytes, for transport tests.
import type { Connection, Stream } from '@libp2p/interface';

export interface SocketSpy {
  writes: number;
  restore(): void;
}

/** Counts the write system calls (write or writev) of a connection's TCP socket. */
export function spyOnSocket(conn: Connection): SocketSpy {
  const socket = (conn as unknown as { maConn: { socket: Record<string, unknown> } }).maConn.socket;
  const spy = { writes: 0, restore: () => {} };
  const originals: Record<string, unknown> = {};
  for (const name of ['_write', '_writev']) {
    const original = socket[name] as (...a: unknown[]) => unknown;
    originals[name] = Object.hasOwn(socket, name) ? original : undefined;
    socket[name] = function (this: unknown, ...args: unknown[]) {
      spy.writes++;
      return original.apply(this, args);
    };
  }
  spy.restore = () => {
    for (const [name, original] of Object.entries(originals)) {
      if (original === undefined) delete socket[name];
      else socket[name] = original;
    }
  };
  return spy;
}

/** Reads `total` bytes from a stream. */
export async function readBytes(stream: Stream, total: number): Promise<number> {
  let got = 0;
  for await (const chunk of stream) {
    got += chunk.byteLength;
    if (got >= total) break;
  }
  return got;
}
