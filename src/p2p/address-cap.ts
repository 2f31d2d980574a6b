// At most N inbound connections from one address, counted from the moment libp2p takes the socket
// (before the handshake) until the socket closes, so neither sockets that never finish their
// handshake nor idle upgraded connections from one host can take every place the node has.
//
// Enforced in libp2p's connection gater (denyInboundConnection), which the upgrader calls for
// every inbound socket right after the connection manager's own checks (pending count, rate per
// address, maxConnections) and before any handshake work; a refused socket is closed at once and
// its place among the pending ones freed.
//
// "One address": an IPv4 address; an IPv6 /64 (one host's, or one subscriber's, prefix: a host
// picks any address in it for each connection); an IPv4-mapped IPv6 address (a dual-stack
// listener's view of an IPv4 client) as that IPv4 address.
import { isIPv4, isIPv6 } from 'node:net';
import type { ConnectionGater, MultiaddrConnection } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';

/** The eight 16-bit groups of an IPv6 address, or undefined when it is not one. */
function ipv6Groups(address: string): number[] | undefined {
  let s = address.split('%')[0]!; // (a zone, fe80::1%eth0, is not part of the address)
  if (!isIPv6(s)) return undefined;
  const v4 = /^(.*:)(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  if (v4) {
    const [a, b, c, d] = v4.slice(2).map(Number) as [number, number, number, number];
    s = `${v4[1]}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const halves = s.split('::');
  const head = halves[0] ? halves[0].split(':') : [];
  const tail = halves.length > 1 && halves[1] ? halves[1].split(':') : [];
  const groups = halves.length > 1 ? [...head, ...Array<string>(8 - head.length - tail.length).fill('0'), ...tail] : head;
  return groups.length === 8 ? groups.map((g) => parseInt(g, 16)) : undefined;
}

/** The key connections from `address` (an IP address) are counted under; undefined for anything else. */
export function addressGroup(address: string): string | undefined {
  if (isIPv4(address)) return address;
  const g = ipv6Groups(address);
  if (!g) return undefined;
  if (g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0xffff) {
    return `${g[6]! >> 8}.${g[6]! & 0xff}.${g[7]! >> 8}.${g[7]! & 0xff}`;
  }
  return `${g.slice(0, 4).map((x) => x.toString(16)).join(':')}::/64`;
}

/** The address group of a multiaddr's first /ip4 or /ip6 part; undefined when it has none. */
export function multiaddrGroup(ma: Multiaddr): string | undefined {
  const ip = ma.getComponents().find((c) => c.name === 'ip4' || c.name === 'ip6');
  return ip?.value === undefined ? undefined : addressGroup(ip.value);
}

export interface AddressCap {
  /** The gater's part: libp2p calls it for each inbound socket; true refuses the socket. */
  readonly gater: Required<Pick<ConnectionGater, 'denyInboundConnection'>>;
  /** Inbound connections (handshaking or open) counted for an address group now. */
  count(group: string): number;
  /** Sockets refused so far for being over the cap. */
  readonly refused: number;
}

/**
 * A per-address cap of `max` inbound connections (see the top of this file). `onRefused` is told of
 * each socket refused (after the count, before libp2p closes it); it must not throw, and it is
 * called at the rate a stranger connects, so it should only count (no log line each).
 */
export function addressCap(max: number, onRefused?: () => void): AddressCap {
  const counts = new Map<string, number>();
  let refused = 0;
  const release = (group: string): void => {
    const n = (counts.get(group) ?? 1) - 1;
    if (n > 0) counts.set(group, n);
    else counts.delete(group);
  };
  return {
    gater: {
      denyInboundConnection(maConn: MultiaddrConnection): boolean {
        const group = multiaddrGroup(maConn.remoteAddr);
        if (group === undefined) return false; // (not an IP connection: nothing to count it by)
        // Already gone (closed while libp2p looked at it): nothing to hold a place for.
        if (maConn.status !== 'open' && maConn.status !== 'closing') return false;
        const n = counts.get(group) ?? 0;
        if (n >= max) {
          refused++;
          onRefused?.();
          return true;
        }
        counts.set(group, n + 1);
        // Every end of a connection (closed, aborted, reset; before or after its upgrade) is this
        // socket's 'close' event, once.
        maConn.addEventListener('close', () => release(group), { once: true });
        return false;
      },
    },
    count: (group) => counts.get(group) ?? 0,
    get refused() {
      return refused;
    },
  };
}
