// Transport tests' tools: a loopback host pair that streams bytes on request, a spy on a libp2p
// connection's TCP socket, and reading raw stream bytes.
import crypto from 'node:crypto';
import type { Connection, Stream } from '@libp2p/interface';
import { createHost, type Host } from '../../src/p2p/host.ts';

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

/**
 * Two hosts on loopback: a server that answers each request "<count> <size>" on `proto` with
 * `count` random messages of `size` bytes (waiting for drain; with `turnEach`, a turn of the event
 * loop between messages, so each leaves on its own), and a dial-only client.
 */
export async function startBlastPair(proto: string, seedByte: number, opts: { turnEach?: boolean } = {}): Promise<{ server: Host; client: Host; open(): Promise<{ stream: Stream; conn: Connection }>; stop(): Promise<void> }> {
  const server = await createHost({ seed: new Uint8Array(32).fill(seedByte), listen: ['/ip4/127.0.0.1/tcp/0'] });
  const client = await createHost({ seed: new Uint8Array(32).fill(seedByte + 1), listen: [] });
  const addr = server.getMultiaddrs()[0]!;
  await server.handle(proto, async (stream) => {
    try {
      for await (const chunk of stream) {
        const [count, size] = new TextDecoder().decode(chunk.subarray()).split(' ').map(Number);
        for (let i = 0; i < count!; i++) {
          if (!stream.send(crypto.randomBytes(size!))) await new Promise((r) => stream.addEventListener('drain', r, { once: true }));
          if (opts.turnEach) await new Promise((r) => setImmediate(r));
        }
      }
      await stream.close();
    } catch (e) {
      stream.abort(e as Error);
    }
  });
  return {
    server,
    client,
    async open() {
      const stream = await client.dialProtocol(addr, proto);
      return { stream, conn: client.getConnections(server.peerId)[0]! };
    },
    async stop() {
      await client.stop();
      await server.stop();
    },
  };
}
