import { describe, expect, test } from 'vitest';
import { hostLogger } from '../src/p2p/quiet-logger.ts';

describe('hostLogger', () => {
  test('without DEBUG: loggers that are off at every scope and can be called', () => {
    const logger = hostLogger({});
    expect(logger).toBeDefined();
    const log = logger!.forComponent('libp2p:test');
    const scoped = log.newScope('stream').newScope('deeper');
    for (const l of [log, scoped]) {
      expect(l.enabled).toBe(false);
      expect(() => {
        l('message %s', 'x');
        l.error('error %e', new Error('x'));
        l.trace('trace');
      }).not.toThrow();
    }
  });

  test('with DEBUG set: libp2p keeps its own logger', () => {
    expect(hostLogger({ DEBUG: 'libp2p:*' })).toBeUndefined();
  });
});
