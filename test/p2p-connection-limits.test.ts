// What strangers can hold of a node's libp2p connections (src/p2p/host.ts, connection-limits.ts,
// address-cap.ts, idle-connections.ts; docs/decisions.md "Connections from strangers"), on real
// libp2p over loopback. Linux routes all of 127.0.0.0/8 to the loopback, so a socket bound to
// 127.0.0.N reaches the node from "another address".
import crypto from 'node:crypto';
import path from 'node:path';
import type { Connection, Libp2p } from '@libp2p/interface';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { addressGroup } from '../src/p2p/address-cap.ts';
import { createHost, type Host, type HostOptions } from '../src/p2p/host.ts';
import type { RunningNode } from '../src/node.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { askNode } from './helpers/paid-ask.ts';
import { testKey } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';
import { clientFrom, echoNode, echoStream, nextText, openFrom, portOf, rawSockets } from './helpers/loopback-peers.ts';
import { until } from './helpers/wait.ts';

const seed = (): Uint8Array => new Uint8Array(crypto.randomBytes(32));

/** Things to stop after each test, last first. */
let stops: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const stop of stops.reverse()) await stop();
  stops = [];
});

/** A dial-only host of ours (a gateway's), from 127.0.0.1. */
async function dialOnly(opts: Partial<HostOptions> = {}): Promise<Host> {
  const host = await createHost({ seed: seed(), listen: [], ...opts });
  stops.push(() => host.stop());
  return host;
}

/** Whether a dial got a connection. */
const outcome = (dial: Promise<unknown>): Promise<'connected' | 'refused'> => dial.then(() => 'connected' as const, () => 'refused' as const);
/**
 * Resolves when `host` reports a connection closed whose remote peer is `peer`; rejects, naming
 * it, if that has not happened after 20 s (a bound on the wait, far above the idle times here).
 */
function closeOf(host: Libp2p, peer: Libp2p | Host): Promise<Connection> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      host.removeEventListener('connection:close', on);
      reject(new Error('timed out waiting for the connection to be closed'));
    }, 20_000);
    const on = (evt: CustomEvent<Connection>): void => {
      if (!evt.detail.remotePeer.equals(peer.peerId)) return;
      host.removeEventListener('connection:close', on);
      clearTimeout(timer);
      resolve(evt.detail);
    };
    host.addEventListener('connection:close', on);
  });
}

describe('address groups', () => {
  test('an IPv4 address; an IPv6 /64; an IPv4-mapped IPv6 address as its IPv4 address', () => {
    expect(addressGroup('203.0.113.7')).toBe('203.0.113.7');
    expect(addressGroup('2001:db8:1:2:3:4:5:6')).toBe('2001:db8:1:2::/64');
    expect(addressGroup('2001:db8:1:2::9')).toBe('2001:db8:1:2::/64');
    expect(addressGroup('2001:0DB8:0001:0002:ffff::1')).toBe('2001:db8:1:2::/64');
    expect(addressGroup('2001:db8::1')).toBe('2001:db8:0:0::/64');
    expect(addressGroup('::1')).toBe('0:0:0:0::/64');
    expect(addressGroup('fe80::1%eth0')).toBe('fe80:0:0:0::/64');
    expect(addressGroup('::ffff:198.51.100.4')).toBe('198.51.100.4');
    expect(addressGroup('::ffff:c633:6404')).toBe('198.51.100.4');
    expect(addressGroup('not an address')).toBeUndefined();
  });
});

describe('connection limits on loopback', () => {
  test("the host hands libp2p the node's limits: a short handshake timeout, room for many handshakes", async () => {
    const { node } = await echoNode(stops);
    const internals = node as unknown as { components: { connectionManager: Record<string, unknown>; upgrader: Record<string, unknown> } };
    expect(internals.components.upgrader.inboundUpgradeTimeout).toBe(5_000);
    expect(internals.components.connectionManager.maxIncomingPendingConnections).toBe(128);
    expect(internals.components.connectionManager.maxConnections).toBe(300);
    const { node: tuned } = await echoNode(stops, { handshakeTimeoutMs: 1500, maxPendingConnections: 7 });
    const t = tuned as unknown as typeof internals;
    expect(t.components.upgrader.inboundUpgradeTimeout).toBe(1500);
    expect(t.components.connectionManager.maxIncomingPendingConnections).toBe(7);
  });

  test('one address cannot hold more than its share, handshaking or open; other addresses still get in; a place freed is taken again', async () => {
    const { node, addr } = await echoNode(stops, { maxConnectionsPerIp: 3, newConnectionsPerIpPerSecond: 1000, handshakeTimeoutMs: 60_000, idleConnectionMs: 0 });
    const first = await Promise.all([1, 2, 3].map(() => clientFrom(stops, '127.0.0.2')));
    for (const c of first) await echoStream(c, addr);
    // A fourth connection from that address is refused while the three are open...
    const fourth = await clientFrom(stops, '127.0.0.2');
    expect(await outcome(fourth.dial(addr))).toBe('refused');
    expect(openFrom(node, fourth).length).toBe(0);
    // ...and the three it has are not disturbed by the refusal.
    for (const c of first) expect(openFrom(node, c).length).toBe(1);
    // Another address is not held back by it.
    await echoStream(await clientFrom(stops, '127.0.0.3'), addr);

    // Sockets that never finish a handshake count too: 3 of 5 held, the others closed at once,
    // and a real client from that address is refused while the three are held.
    const raw = await rawSockets(stops, portOf(addr), Array(5).fill('127.0.0.4'));
    await until('the node to close the two sockets over the cap', () => raw.closed() === 2);
    expect(await outcome((await clientFrom(stops, '127.0.0.4')).dial(addr))).toBe('refused');

    // One of the first three leaves: its place is free for the fourth.
    const gone = closeOf(node, first[0]!);
    await first[0]!.stop();
    await gone;
    await echoStream(fourth, addr);
    expect(openFrom(node, fourth).length).toBe(1);
  });

  test('idle connections are closed; one with a stream open, however quiet, never is', async () => {
    const { node, addr } = await echoNode(stops, { idleConnectionMs: 400 });
    // A: a stream held open and silent (a long answer whose model is still thinking).
    const a = await dialOnly({ idleConnectionMs: 0 });
    const held = await echoStream(a, addr, 'first');
    // B: connected, no stream ever.
    const b = await dialOnly({ idleConnectionMs: 0 });
    const bClosed = closeOf(node, b);
    await b.dial(addr);
    // B is closed by the node once idle; by then A's stream has been open (and quiet) longer than that.
    await bClosed;
    await until("B to see its connection closed", () => b.getConnections(node.peerId).length === 0);
    expect(openFrom(node, a).length).toBe(1);
    expect(held.status).toBe('open');
    held.send(Buffer.from('still here'));
    expect(await nextText(held)).toBe('still here');
    // Once A's stream has ended, A is idle too, and closed.
    const aClosed = closeOf(node, a);
    await held.close();
    await aClosed;
    expect(openFrom(node, a).length).toBe(0);
  });

  test("a connection used stream after stream is idle only between them: a gateway's reuse is kept", async () => {
    const { node, addr } = await echoNode(stops, { idleConnectionMs: 1500 });
    const client = await dialOnly({ idleConnectionMs: 0 });
    const ids = new Set<string>();
    // Short streams 100 ms apart, for over three idle times in all: each stream restarts the clock.
    for (let i = 0; i < 50; i++) {
      const s = await echoStream(client, addr, `r${i}`);
      await s.close();
      ids.add(client.getConnections(node.peerId)[0]!.id);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(ids.size).toBe(1);
    expect(openFrom(node, client).length).toBe(1);
  });

  test('a dial-only host (a gateway) closes its own idle connections, and dials again when next asked', async () => {
    const { node, addr } = await echoNode(stops, { idleConnectionMs: 0 });
    const gateway = await dialOnly({ idleConnectionMs: 300 });
    const closed = closeOf(gateway, node);
    const s = await echoStream(gateway, addr);
    await s.close();
    const conn = await closed;
    expect(conn.direction).toBe('outbound');
    await (await echoStream(gateway, addr, 'again')).close();
  });
});

describe('sockets that never handshake', () => {
  const market = testKey();
  const home = tempDir('p2p-limits-');
  let running: RunningNode | undefined;
  afterAll(async () => {
    await running?.stop();
    removeTemp(home);
  });

  test('40 of them, from 40 addresses, do not keep a paying buyer out; each is closed by the handshake timeout', async () => {
    running = await startTinyNode(path.join(home, 'node'), { publicKey: market.id });
    const node = running;
    const port = portOf(node.addresses[0]!);
    // All connected (in the node's accept queue) before the buyer's socket: libp2p takes them in
    // order, so each holds a handshake place when the buyer's arrives.
    const raw = await rawSockets(stops, port, Array.from({ length: 40 }, (_, i) => `127.0.0.${10 + i}`));
    const buyer = await dialOnly();
    const r = await askNode(buyer, node, market);
    expect(r.head.status).toBe(200);
    expect(r.trailer.receipt).toBeDefined();
    // None of them is kept: the node ends each after its handshake timeout.
    await until('the node to close every socket that never handshook', () => raw.closed() === 40, 20_000);
  });
});
