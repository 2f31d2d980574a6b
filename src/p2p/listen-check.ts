// The libp2p host listens once every model has loaded (minutes for a real model on a GPU). Its TCP
// addresses are tried before any model loads, so that a port in use is named at once, not after
// the loads. Each is bound and released in turn (libp2p binds them again later), and judged as
// libp2p's transport manager judges them: every address must listen, except that when every IPv4
// one does and every IPv6 one fails, the host is taken to have no IPv6 and starts on IPv4.
import net from 'node:net';

/**
 * Binds and releases each `/ip4|ip6/<address>/tcp/<port>` address. Rejects, as libp2p would refuse
 * them, with one line a failure, `<multiaddr>: <error message>`, as libp2p's own listen failure reads.
 */
export async function tryListenAddresses(listen: readonly string[]): Promise<void> {
  const failed: { addr: string; v6: boolean; message: string }[] = [];
  let v4 = 0;
  let v6 = 0;
  for (const addr of listen) {
    const [, family, host, proto, port] = addr.split('/');
    if ((family !== 'ip4' && family !== 'ip6') || proto !== 'tcp' || !host || !Number.isInteger(Number(port))) continue;
    if (family === 'ip4') v4++;
    else v6++;
    const message = await new Promise<string | undefined>((resolve) => {
      const server = net.createServer();
      server.once('error', (e) => resolve(e.message));
      // (ipv6Only for an IPv6 address, as @libp2p/tcp listens)
      server.listen({ host, port: Number(port), ipv6Only: family === 'ip6' }, () => server.close(() => resolve(undefined)));
    });
    if (message !== undefined) failed.push({ addr, v6: family === 'ip6', message });
  }
  const noIpv6 = v4 > 0 && v6 > 0 && failed.length === v6 && failed.every((f) => f.v6);
  if (failed.length && !noIpv6) throw new Error(failed.map((f) => `${f.addr}: ${f.message}`).join('\n'));
}
