import { describe, expect, test } from 'vitest';
import { parseHostPort } from '../src/host-port.ts';
import { parseListen } from '../src/cli/gateway.ts';

describe('HOST:PORT', () => {
  test('names, IPv4, bracketed IPv6 (mapped IPv4 too), ports 0 to 65535', () => {
    expect(parseHostPort('127.0.0.1:9464')).toEqual({ host: '127.0.0.1', port: 9464 });
    expect(parseHostPort('localhost:0')).toEqual({ host: 'localhost', port: 0 });
    expect(parseHostPort('[::1]:65535')).toEqual({ host: '::1', port: 65535 });
    expect(parseHostPort('[::ffff:127.0.0.1]:80')).toEqual({ host: '::ffff:127.0.0.1', port: 80 });
  });
  test('the port may be left out only where there is a default', () => {
    expect(parseHostPort('127.0.0.1')).toBeUndefined();
    expect(parseHostPort('127.0.0.1', 11435)).toEqual({ host: '127.0.0.1', port: 11435 });
    expect(parseListen('[::1]')).toEqual({ host: '::1', port: 11435 });
  });
  test('refused: ports above 65535 or not decimal, bare IPv6, spaces, empty parts', () => {
    for (const bad of ['127.0.0.1:65536', '127.0.0.1:99999', '127.0.0.1:-1', '127.0.0.1:80a', '::1:80', '[::1', '[x]:80', 'a b:80', ':80', '127.0.0.1:', '', '[]:80']) {
      expect(parseHostPort(bad), bad).toBeUndefined();
    }
    expect(() => parseListen('127.0.0.1:70000')).toThrow(/--listen must be HOST:PORT/);
  });
});
