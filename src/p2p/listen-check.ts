// The libp2p host listens once every model has loaded (minutes for a real model on a GPU). Its TCP
// addresses with a fixed port are tried before any model loads, so that a port in use is named at
// once, not after the loads. (Each is bound and released in turn; libp2p binds them again later.)
import net from 'node:net';

/**
 * Binds and releases each `/ip4|ip6/<address>/tcp/<port>` address whose port is not 0. Rejects
 * with one line a failure, `<multiaddr>: <error message>`, as libp2p's own listen failure reads.
 */
export async function tryListenAddresses(listen: readonly string[]): Promise<void> {
  const failed: string[] = [];
  for (const addr of listen) {
    const [, family, host, proto, port] = addr.split('/');
    if ((family !== 'ip4' && family !== 'ip6') || proto !== 'tcp' || !host || Number(port) === 0 || !Number.isInteger(Number(port))) continue;
    await new Promise<void>((resolve) => {
      const server = net.createServer();
      server.once('error', (e) => {
        failed.push(`${addr}: ${e.message}`);
        resolve();
      });
      // (v6 alone: whether libp2p's socket also takes v4 is its own matter)
      server.listen({ host, port: Number(port), exclusive: true, ...(family === 'ip6' ? { ipv6Only: true } : {}) }, () => server.close(() => resolve()));
    });
  }
  if (failed.length) throw new Error(failed.join('\n'));
}
