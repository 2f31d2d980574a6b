import { describe, expect, test } from 'vitest';
import { listenOptionProblem, parseHostPort, portAloneSuggestion } from '../src/host-port.ts';
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
    expect(() => parseListen('127.0.0.1:70000')).toThrow('--listen must be host:port, e.g. 127.0.0.1:11435; got "127.0.0.1:70000"');
  });
  test('a port alone is no host: refused with or without a default port, with the address it likely meant', () => {
    // The resolver would read "24037" as the IPv4 number 0.0.93.229 and the gateway fail with EADDRNOTAVAIL.
    for (const bad of ['24037', '0', '24037:80']) {
      expect(parseHostPort(bad), bad).toBeUndefined();
      expect(parseHostPort(bad, 11435), bad).toBeUndefined();
    }
    expect(() => parseListen('24037')).toThrow('--listen must be host:port, e.g. 127.0.0.1:11435; got "24037" (a port alone: write 127.0.0.1:24037)');
    expect(() => parseListen(' 24037 ')).toThrow(/\(a port alone: write 127\.0\.0\.1:24037\)$/);
    // names that only start or end with digits are still names
    expect(parseHostPort('1host:80')).toEqual({ host: '1host', port: 80 });
    expect(parseHostPort('10.0.0.5', 11435)).toEqual({ host: '10.0.0.5', port: 11435 });
  });
  test('portAloneSuggestion: numbers and digit strings up to 65535 only', () => {
    expect(portAloneSuggestion(24564)).toBe('127.0.0.1:24564');
    expect(portAloneSuggestion('9464')).toBe('127.0.0.1:9464');
    for (const no of [65536, 1.5, -1, '70000', 'abc', '127.0.0.1:1', '', null, undefined, true, [80]]) expect(portAloneSuggestion(no), String(no)).toBeUndefined();
    expect(listenOptionProblem('--listen', 'a:b:c', '127.0.0.1:1')).toBe('--listen must be host:port, e.g. 127.0.0.1:1; got "a:b:c"');
  });
});
