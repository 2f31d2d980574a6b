// What the node's connection limits do, in its metrics (src/p2p/host.ts's ConnectionObserver, wired
// in src/node.ts to src/ops/metrics.ts): seller_p2p_connections_refused_total{reason} and
// seller_p2p_connections_closed_idle_total, on real libp2p over loopback. Linux routes all of
// 127.0.0.0/8 to the loopback, so a socket bound to 127.0.0.N reaches the node from "another
// address". Nothing here times anything: each test waits (polls) for what it expects.
import crypto from 'node:crypto';
import path from 'node:path';
import { multiaddr } from '@multiformats/multiaddr';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { createMetrics, type Metrics } from '../src/ops/metrics.ts';
import { createHost, type ConnectionObserver, type Host } from '../src/p2p/host.ts';
import type { RunningNode } from '../src/node.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { testKey } from './helpers/receipts.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';
import { clientFrom, echoNode, echoStream, nextText, openFrom, portOf, rawSockets } from './helpers/loopback-peers.ts';
import { until } from './helpers/wait.ts';

const REFUSED = 'seller_p2p_connections_refused_total{reason="address_cap"}';
const CLOSED_IDLE = 'seller_p2p_connections_closed_idle_total';
const seed = (): Uint8Array => new Uint8Array(crypto.randomBytes(32));

/** Things to stop after each test, last first. */
let stops: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const stop of stops.reverse()) await stop();
  stops = [];
});

/** The value of `series` (name plus label set, as prom-client prints it) in exposition text; undefined when absent. */
function value(text: string, series: string): number | undefined {
  const l = text.split('\n').find((x) => x.startsWith(`${series} `));
  return l === undefined ? undefined : Number(l.slice(series.length + 1));
}

/** The node's /metrics text. */
async function scrape(node: RunningNode): Promise<string> {
  return (await fetch(`${node.opsUrl}/metrics`)).text();
}

/** The observer the node wires (src/node.ts), on `metrics`. */
function observerOf(metrics: Metrics): ConnectionObserver {
  return {
    refused: (reason) => metrics.p2pConnectionsRefused.inc({ reason }),
    closedIdle: () => metrics.p2pConnectionsClosedIdle.inc(),
  };
}

/** A dial-only host of ours that never closes its own connections. */
async function dialOnly(): Promise<Host> {
  const host = await createHost({ seed: seed(), listen: [], idleConnectionMs: 0 });
  stops.push(() => host.stop());
  return host;
}


describe("a node's /metrics", () => {
  const market = testKey();
  const home = tempDir('p2p-metrics-');
  let running: RunningNode | undefined;
  afterAll(async () => {
    await running?.stop();
    removeTemp(home);
  });

  test('counts sockets refused over the per-address cap (reason address_cap), from 0; not those of other addresses', async () => {
    // A long handshake timeout: the silent sockets the cap admits stay until the test ends.
    running = await startTinyNode(path.join(home, 'node'), { publicKey: market.id, extra: 'p2p: { max_connections_per_ip: 2, handshake_timeout_ms: 60000, new_connections_per_ip_per_second: 1000 }' });
    const node = running;
    const before = await scrape(node);
    expect(before).toContain('# TYPE seller_p2p_connections_refused_total counter');
    expect(before).toContain('# HELP seller_p2p_connections_refused_total Inbound libp2p connections refused by the node before any handshake, by reason');
    expect(before).toContain(`# TYPE ${CLOSED_IDLE} counter`);
    expect(value(before, REFUSED)).toBe(0); // (there from the start: an alert on its increase sees the first)
    expect(value(before, CLOSED_IDLE)).toBe(0);

    // Five silent sockets from one address: two held, three refused and closed at once.
    const raw = await rawSockets(stops, portOf(node.addresses[0]!), Array(5).fill('127.0.0.5'));
    await until('the node to close the three sockets over the cap', () => raw.closed() === 3);
    await until('seller_p2p_connections_refused_total to count the three', async () => value(await scrape(node), REFUSED) === 3);

    // A client from another address gets in, and is not counted.
    const other = await clientFrom(stops, '127.0.0.6');
    await other.dial(multiaddr(node.addresses[0]!));
    // A real client from the full address is refused, and counted.
    const refused = await clientFrom(stops, '127.0.0.5');
    await expect(refused.dial(multiaddr(node.addresses[0]!))).rejects.toThrow();
    await until('seller_p2p_connections_refused_total to count the fourth', async () => value(await scrape(node), REFUSED) === 4);
    expect(value(await scrape(node), REFUSED)).toBe(4);
    expect(value(await scrape(node), CLOSED_IDLE)).toBe(0);
  });
});

describe('a host with the metrics observer', () => {
  test('counts each connection closed idle, once; never one with a stream open', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const closedIdle = async (): Promise<number | undefined> => value(await metrics.registry.metrics(), CLOSED_IDLE);
    const { node, addr } = await echoNode(stops, { idleConnectionMs: 400, observer: observerOf(metrics) });
    // A: a stream held open and silent. B: connected, no stream ever.
    const a = await dialOnly();
    const held = await echoStream(a, addr, 'first');
    const b = await dialOnly();
    await b.dial(addr);
    await until('the node to close B, idle', () => b.getConnections(node.peerId).length === 0);
    await until('seller_p2p_connections_closed_idle_total to count B', async () => (await closedIdle()) === 1);
    // A's stream has been open longer than the idle time: A is neither closed nor counted.
    expect(openFrom(node, a).length).toBe(1);
    held.send(Buffer.from('still here'));
    expect(await nextText(held)).toBe('still here');
    expect(await closedIdle()).toBe(1);
    // Once A's stream has ended, A is idle too: closed and counted.
    await held.close();
    await until('the node to close A, idle', () => openFrom(node, a).length === 0);
    await until('seller_p2p_connections_closed_idle_total to count A', async () => (await closedIdle()) === 2);
    expect(value(await metrics.registry.metrics(), REFUSED)).toBe(0);
  });

  test('counts refusals over the cap; a connection a client closes itself is not an idle close', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const scrapeHost = async (series: string): Promise<number | undefined> => value(await metrics.registry.metrics(), series);
    const { node, addr } = await echoNode(stops, { maxConnectionsPerIp: 1, newConnectionsPerIpPerSecond: 1000, idleConnectionMs: 60_000, observer: observerOf(metrics) });
    const first = await clientFrom(stops, '127.0.0.7');
    await (await echoStream(first, addr)).close();
    const second = await clientFrom(stops, '127.0.0.7');
    await expect(second.dial(addr)).rejects.toThrow();
    await until('seller_p2p_connections_refused_total to count the refusal', async () => (await scrapeHost(REFUSED)) === 1);
    // The first leaves on its own (well within the idle time): its place is free, and no idle close is counted.
    await first.stop();
    await until('the node to see the first client gone', () => node.getConnections(first.peerId).length === 0);
    await echoStream(second, addr);
    expect(await scrapeHost(REFUSED)).toBe(1);
    expect(await scrapeHost(CLOSED_IDLE)).toBe(0);
  });

  test("an observer that throws changes nothing the host does: refusals still refuse, idle connections still close", async () => {
    let told = 0;
    const observer: ConnectionObserver = {
      refused: () => {
        told++;
        throw new Error('observer broken');
      },
      closedIdle: () => {
        told++;
        throw new Error('observer broken');
      },
    };
    const { node, addr } = await echoNode(stops, { maxConnectionsPerIp: 1, newConnectionsPerIpPerSecond: 1000, idleConnectionMs: 300, observer });
    const raw = await rawSockets(stops, portOf(addr), ['127.0.0.8', '127.0.0.8']);
    await until('the node to close the socket over the cap', () => raw.closed() >= 1);
    const client = await dialOnly();
    await client.dial(addr);
    await until('the node to close the idle connection', () => client.getConnections(node.peerId).length === 0);
    await until('the observer to be told of both', () => told >= 2);
  });
});
