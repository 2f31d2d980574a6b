// The node's connection limits on the public internet, and their defaults (config.ts takes them
// from here; docs/decisions.md, "Connections from strangers", says why each is what it is).
// No imports: config.ts reads these without loading libp2p.

export interface ConnectionLimits {
  /** Most open connections (libp2p's maxConnections). */
  maxConnections: number;
  /** Most inbound connections, handshaking or open, from one address (an IPv4 address, an IPv6 /64). */
  maxConnectionsPerIp: number;
  /** Most inbound connections handshaking at once, from everyone (libp2p's maxIncomingPendingConnections). */
  maxPendingConnections: number;
  /** How long an inbound connection may take to finish its handshake (Noise and Yamux; libp2p's inboundUpgradeTimeout). */
  handshakeTimeoutMs: number;
  /** New inbound connections one address may open a second (libp2p's inboundConnectionThreshold). */
  newConnectionsPerIpPerSecond: number;
  /** A connection without a stream for this long is closed; 0: never. */
  idleConnectionMs: number;
}

/** A node's limits (a host that listens). */
export const NODE_CONNECTION_LIMITS: Readonly<ConnectionLimits> = Object.freeze({
  maxConnections: 300,
  maxConnectionsPerIp: 8,
  maxPendingConnections: 128,
  handshakeTimeoutMs: 5_000,
  newConnectionsPerIpPerSecond: 5,
  idleConnectionMs: 300_000,
});

/**
 * How long a dial-only host (a gateway) keeps a connection without streams before closing it
 * itself. Shorter than any idle time a node may be configured with (MIN_NODE_IDLE_CONNECTION_MS),
 * so that the gateway, not the node, ends an idle connection: a node that closed it just as the
 * gateway sent a request on it would cost that request.
 */
export const DIAL_ONLY_IDLE_CONNECTION_MS = 90_000;

/** The shortest idle time a node's config may set (other than 0, never). */
export const MIN_NODE_IDLE_CONNECTION_MS = 120_000;
