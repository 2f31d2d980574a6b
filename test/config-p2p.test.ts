// The `p2p` keys of the node's config: the connection limits its libp2p host applies
// (src/p2p/connection-limits.ts, docs/decisions.md "Connections from strangers").
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { ConfigError, loadConfig, p2pHostLimits, parseConfig } from '../src/config.ts';
import { DIAL_ONLY_IDLE_CONNECTION_MS, MIN_NODE_IDLE_CONNECTION_MS, NODE_CONNECTION_LIMITS } from '../src/p2p/connection-limits.ts';
import { connectionLimits } from '../src/p2p/host.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

const base = '/srv/node';

function refused(text: string, env: NodeJS.ProcessEnv = {}): { key: string; message: string } {
  try {
    parseConfig(text, base, env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return { key: (e as ConfigError).key, message: (e as Error).message };
  }
  throw new Error('expected the config to be refused');
}

describe('config p2p', () => {
  test('defaults, as config.example.yaml writes them, and as the host applies them', () => {
    const defaults = { max_connections: 300, max_connections_per_ip: 8, max_pending_connections: 128, handshake_timeout_ms: 5000, new_connections_per_ip_per_second: 5, idle_connection_ms: 300_000 };
    expect(parseConfig('', base).p2p).toEqual(defaults);
    expect(loadConfig(path.join(REPO_ROOT, 'config.example.yaml'), {}).p2p).toEqual(defaults);
    expect(p2pHostLimits(parseConfig('', base).p2p)).toEqual(NODE_CONNECTION_LIMITS);
    // A listening host takes the node's limits; a dial-only one (a gateway) closes its idle
    // connections sooner than any node may.
    expect(connectionLimits({ seed: new Uint8Array(32), listen: ['/ip4/0.0.0.0/tcp/0'] })).toEqual(NODE_CONNECTION_LIMITS);
    expect(connectionLimits({ seed: new Uint8Array(32), listen: [] })).toEqual({ ...NODE_CONNECTION_LIMITS, idleConnectionMs: DIAL_ONLY_IDLE_CONNECTION_MS });
    expect(DIAL_ONLY_IDLE_CONNECTION_MS).toBeLessThan(MIN_NODE_IDLE_CONNECTION_MS);
    expect(connectionLimits({ seed: new Uint8Array(32), listen: [], idleConnectionMs: 0, maxConnectionsPerIp: 2 })).toMatchObject({ idleConnectionMs: 0, maxConnectionsPerIp: 2, maxConnections: 300 });
  });

  test('set in the file or the environment', () => {
    const c = parseConfig('p2p:\n  max_connections: 1000\n  max_connections_per_ip: 32\n  idle_connection_ms: 0\n', base, { SELLER_NODE_P2P__HANDSHAKE_TIMEOUT_MS: '2000' });
    expect(c.p2p).toEqual({ max_connections: 1000, max_connections_per_ip: 32, max_pending_connections: 128, handshake_timeout_ms: 2000, new_connections_per_ip_per_second: 5, idle_connection_ms: 0 });
  });

  test('refused, naming the key', () => {
    expect(refused('p2p: 5')).toEqual({ key: 'p2p', message: 'config: p2p: expected a mapping' });
    expect(refused('p2p: { max_conections: 5 }')).toEqual({ key: 'p2p.max_conections', message: 'config: p2p.max_conections: unknown key' });
    expect(refused('p2p: { max_connections: 0 }')).toEqual({ key: 'p2p.max_connections', message: 'config: p2p.max_connections: expected a whole number from 1 to 100000' });
    expect(refused('p2p: { max_connections_per_ip: 2.5 }').key).toBe('p2p.max_connections_per_ip');
    expect(refused('p2p: { max_connections: 10, max_connections_per_ip: 11 }')).toEqual({ key: 'p2p.max_connections_per_ip', message: 'config: p2p.max_connections_per_ip: 11 is more than p2p.max_connections (10): expected at most that' });
    expect(refused('p2p: { max_pending_connections: "many" }').key).toBe('p2p.max_pending_connections');
    expect(refused('p2p: { handshake_timeout_ms: 100 }')).toEqual({ key: 'p2p.handshake_timeout_ms', message: 'config: p2p.handshake_timeout_ms: expected a whole number from 500 to 60000' });
    expect(refused('p2p: { new_connections_per_ip_per_second: 0 }').key).toBe('p2p.new_connections_per_ip_per_second');
    expect(refused('p2p: { idle_connection_ms: 30000 }')).toEqual({
      key: 'p2p.idle_connection_ms',
      message: 'config: p2p.idle_connection_ms: expected 0 (never) or a whole number from 120000 to 86400000: gateways close their own idle connections after 90000 ms, and a node must not close one first',
    });
    expect(refused('', { SELLER_NODE_P2P__MAX_CONNECTIONS_PER_IP: '0' })).toEqual({
      key: 'p2p.max_connections_per_ip',
      message: 'config: p2p.max_connections_per_ip: expected a whole number from 1 to 100000 (from environment variable SELLER_NODE_P2P__MAX_CONNECTIONS_PER_IP)',
    });
  });
});
