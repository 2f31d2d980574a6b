// A libp2p host for the node, the gateway and tests: TCP + Noise + Yamux under the identity derived
// from the node's Ed25519 seed, and nothing else (no DHT, no identify, no discovery). Peers are dialled
// by full multiaddr (…/p2p/<peer id>); identify is not needed for that, nor for protocol negotiation,
// which multistream-select does per stream.
//
// On the public internet it bounds what strangers can hold (connection-limits.ts, docs/decisions.md
// "Connections from strangers"): a short handshake timeout and room for many handshakes at once,
// at most a few connections per address (address-cap.ts), and connections without a stream closed
// after a while (idle-connections.ts). What those limits do is told to an observer (HostOptions.observer;
// the node counts it in its metrics): this folder does not know the node's metrics, nor logs a
// line per refusal, which a stranger could ask for thousands of times a second.
import { createLibp2p } from 'libp2p';
import { tcp } from '@libp2p/tcp';
import { noise } from '@chainsafe/libp2p-noise';
import { yamux } from '@chainsafe/libp2p-yamux';
import type { Libp2p } from '@libp2p/interface';
import { libp2pPrivateKeyFromSeed, providerIdFromPeerId } from './peer-id.ts';
import { corkHostWrites } from './cork-writes.ts';
import { cacheProtocolMerges } from './protocol-merge-cache.ts';
import { lengthPrefixWithoutThrow } from './length-prefix-no-throw.ts';
import { hostLogger } from './quiet-logger.ts';
import { HOST_MAX_STREAM_WINDOW, STREAM_READ_BUFFER, STREAMS_PER_PROTOCOL } from './stream-limits.ts';
import { halfWindowUpdates } from './yamux-window-updates.ts';
import { addressCap } from './address-cap.ts';
import { idleStreamTracking, watchIdleConnections } from './idle-connections.ts';
import { DIAL_ONLY_IDLE_CONNECTION_MS, NODE_CONNECTION_LIMITS, type ConnectionLimits } from './connection-limits.ts';

export type Host = Libp2p;

/**
 * Why the host's own code refused an inbound socket. Only what this project decides: libp2p's own
 * refusals (its pending-handshake limit, its per-address rate `inboundConnectionThreshold`,
 * maxConnections) and its handshake timeout happen inside its connection manager and upgrader,
 * which announce them nowhere a host can listen (no event: a line in libp2p's debug log and a
 * count in libp2p's own metrics, which this host does not configure), so they are not told here.
 */
export type ConnectionRefusal = 'address_cap';

/**
 * Told what the host's connection limits did, as they do it. Each call is cheap and made at the rate
 * strangers connect: count, do not log a line each. A method that throws is ignored (it never
 * changes what the host does).
 */
export interface ConnectionObserver {
  /** An inbound socket refused before any handshake work, and closed. */
  refused?(reason: ConnectionRefusal): void;
  /** A connection closed for having had no stream for the idle time (its close begins). */
  closedIdle?(): void;
}

/**
 * The connection limits (connection-limits.ts; config.ts's `p2p` keys), each defaulting to the
 * node's (NODE_CONNECTION_LIMITS), except that a dial-only host closes its idle connections after
 * DIAL_ONLY_IDLE_CONNECTION_MS: before any node would.
 */
export interface HostOptions extends Partial<ConnectionLimits> {
  /** The node's 32-byte Ed25519 seed (NodeIdentity.seed). */
  seed: Uint8Array;
  /** Listen multiaddrs, e.g. ['/ip4/0.0.0.0/tcp/4001']; [] for a dial-only host (a gateway). */
  listen: string[];
  /** Told of each refusal and idle close (the node's metrics); none: nobody is told. */
  observer?: ConnectionObserver;
}

const warned = new Set<string>();
function warnOnce(tuning: string, pkg: string): void {
  if (warned.has(tuning)) return;
  warned.add(tuning);
  process.emitWarning(`libp2p tuning "${tuning}" is off: ${pkg} no longer has the shape it patches (see docs/decisions.md)`, 'SellerNodeWarning');
}

/** The limits a host applies: the options given, the defaults for the rest. */
export function connectionLimits(opts: HostOptions): ConnectionLimits {
  const defaults: ConnectionLimits = { ...NODE_CONNECTION_LIMITS, ...(opts.listen.length === 0 ? { idleConnectionMs: DIAL_ONLY_IDLE_CONNECTION_MS } : {}) };
  const limits = { ...defaults };
  for (const k of Object.keys(defaults) as (keyof ConnectionLimits)[]) limits[k] = opts[k] ?? defaults[k];
  return limits;
}

/** Calls an observer's method, ignoring what it throws (see ConnectionObserver). */
function tell(f: (() => void) | undefined): void {
  try {
    f?.();
  } catch {
    // (an observer's failure is not the host's: a refusal still refuses, a close still closes)
  }
}

/** Creates and starts a host. Call `host.stop()` to close every connection and listener. */
export async function createHost(opts: HostOptions): Promise<Host> {
  // Each returns false when its library has changed shape (an upgrade): said once, then run without.
  if (!halfWindowUpdates()) warnOnce('yamux half-window updates', '@chainsafe/libp2p-yamux');
  if (!lengthPrefixWithoutThrow()) warnOnce('Noise reads without an exception per read', '@libp2p/utils');
  if (!idleStreamTracking()) warnOnce('idle connections timed from their last stream', '@libp2p/utils');
  const limits = connectionLimits(opts);
  // Per address, handshaking or open (address-cap.ts): one host cannot take every place.
  const observer = opts.observer;
  const cap = addressCap(limits.maxConnectionsPerIp, observer?.refused && (() => tell(() => observer.refused?.('address_cap'))));
  const privateKey = libp2pPrivateKeyFromSeed(opts.seed);
  const logger = hostLogger();
  const host = await createLibp2p({
    privateKey,
    ...(logger ? { logger } : {}),
    addresses: { listen: opts.listen },
    transports: [tcp()],
    connectionEncrypters: [noise()],
    streamMuxers: [
      yamux({
        // Streams a peer opens on a new connection before it is fully set up here wait as "early"
        // streams; past yamux's default of 10 the whole connection is aborted, so a buyer's burst
        // of requests on a fresh connection lost every one of them. As many as a protocol takes.
        maxEarlyStreams: STREAMS_PER_PROTOCOL,
        streamOptions: { maxStreamWindowSize: HOST_MAX_STREAM_WINDOW, maxReadBufferLength: STREAM_READ_BUFFER },
      }),
    ],
    // (docs/decisions.md, "Connections from strangers") libp2p's defaults let 10 sockets that never
    // finish their handshake keep every new connection out for 10 s at a time.
    connectionManager: {
      maxConnections: limits.maxConnections,
      maxIncomingPendingConnections: limits.maxPendingConnections,
      inboundUpgradeTimeout: limits.handshakeTimeoutMs,
      inboundConnectionThreshold: limits.newConnectionsPerIpPerSecond,
    },
    connectionGater: cap.gater,
    services: {},
    start: false,
  });
  // Before start, so that the first connection (even one accepted at once) is covered too.
  cacheProtocolMerges(host);
  corkHostWrites(host);
  if (limits.idleConnectionMs > 0) {
    watchIdleConnections(host, { idleMs: limits.idleConnectionMs, ...(observer?.closedIdle && { onIdleClose: () => tell(() => observer.closedIdle?.()) }) });
  }
  await host.start();
  return host;
}

/** The provider id (hex Ed25519 public key) of a host. */
export function hostProviderId(host: Host): string {
  return providerIdFromPeerId(host.peerId);
}
