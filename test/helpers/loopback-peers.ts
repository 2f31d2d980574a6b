// Peers on real libp2p over loopback for the connection-limit tests: a listening echo host of
// ours on 127.0.0.1, and plain libp2p clients whose sockets leave from another 127.0.0.N (Linux
// routes all of 127.0.0.0/8 to the loopback). Each registers its stop in `stops`.
import crypto from 'node:crypto';
import net from 'node:net';
import { noise } from '@chainsafe/libp2p-noise';
import { yamux } from '@chainsafe/libp2p-yamux';
import type { Connection, Libp2p, Stream } from '@libp2p/interface';
import { tcp, type TCPSocketOptions } from '@libp2p/tcp';
import type { Multiaddr } from '@multiformats/multiaddr';
import { createLibp2p } from 'libp2p';
import { expect } from 'vitest';
import { createHost, type Host, type HostOptions } from '../../src/p2p/host.ts';
import { libp2pPrivateKeyFromSeed } from '../../src/p2p/peer-id.ts';

export const ECHO = '/test/echo/1.0.0';
export const randomSeed = (): Uint8Array => new Uint8Array(crypto.randomBytes(32));
type Stops = (() => Promise<unknown> | unknown)[];

/** A listening host on 127.0.0.1 answering ECHO: each chunk sent back, the stream open until the client ends it. */
export async function echoNode(stops: Stops, opts: Partial<HostOptions> = {}): Promise<{ node: Host; addr: Multiaddr }> {
  const node = await createHost({ seed: randomSeed(), listen: ['/ip4/127.0.0.1/tcp/0'], ...opts });
  stops.push(() => node.stop());
  await node.handle(ECHO, async (stream) => {
    try {
      for await (const chunk of stream) stream.send(chunk.subarray());
      await stream.close();
    } catch {
      stream.abort(new Error('echo failed'));
    }
  });
  return { node, addr: node.getMultiaddrs()[0]! };
}

/** A plain libp2p client whose sockets leave from `ip` (127.0.0.N). */
export async function clientFrom(stops: Stops, ip: string): Promise<Libp2p> {
  const client = await createLibp2p({
    privateKey: libp2pPrivateKeyFromSeed(randomSeed()),
    transports: [tcp({ dialOpts: { localAddress: ip } as TCPSocketOptions })],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
  });
  stops.push(() => client.stop());
  return client;
}

/** The next chunk a stream reads, as text. */
export async function nextText(stream: Stream): Promise<string> {
  for await (const chunk of stream) return Buffer.from(chunk.subarray()).toString('utf8');
  throw new Error('the stream ended');
}

/** Opens an ECHO stream and checks one round trip on it; the stream is left open. */
export async function echoStream(client: Libp2p, addr: Multiaddr, text = 'ping'): Promise<Stream> {
  const stream = await client.dialProtocol(addr, ECHO);
  stream.send(Buffer.from(text));
  expect(await nextText(stream)).toBe(text);
  return stream;
}

/** Raw TCP sockets to `port`, one from each of `ips`, connected and then silent (no handshake ever). */
export async function rawSockets(stops: Stops, port: number, ips: string[]): Promise<{ sockets: net.Socket[]; closed: () => number }> {
  let closed = 0;
  const sockets = await Promise.all(
    ips.map(
      (ip) =>
        new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect({ host: '127.0.0.1', port, localAddress: ip }, () => resolve(s));
          s.on('error', () => {}); // (a reset by the node is what some tests wait for)
          s.once('error', reject);
          s.on('close', () => closed++);
        }),
    ),
  );
  stops.push(() => sockets.forEach((s) => s.destroy()));
  return { sockets, closed: () => closed };
}

export const portOf = (addr: Multiaddr | string): number => Number(addr.toString().split('/tcp/')[1]!.split('/')[0]);
/** The node's connections from `peer`'s host, open. */
export const openFrom = (node: Host, peer: Libp2p): Connection[] => node.getConnections(peer.peerId).filter((c) => c.status === 'open');
