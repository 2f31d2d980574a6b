// createHost (src/p2p/host.ts) says once, as a process warning, when a libp2p tuning cannot be
// applied because its library no longer has the shape the patch relies on, and starts the host
// anyway. The libraries' classes are replaced with stand-ins that lack the patched method, for a
// fresh copy of host.ts and of its two tuning modules (the same mocking as
// test/yamux-window-updates.test.ts and test/length-prefix-no-throw.test.ts): the tuning modules'
// own checks run and refuse. libp2p itself, loaded from node_modules, keeps the real classes.
import { afterEach, describe, expect, test, vi } from 'vitest';
import { createHost } from '../src/p2p/host.ts';
import { testKey } from './helpers/receipts.ts';

type CreateHost = typeof createHost;

/** A fresh host.ts whose tuning modules see a yamux stream class and/or a length-prefix decoder without the patched method. */
async function hostOver(broken: { yamux: boolean; utils: boolean }): Promise<CreateHost> {
  vi.resetModules();
  if (broken.yamux) {
    vi.doMock('@chainsafe/libp2p-yamux/stream', async (original) => ({ ...(await original<object>()), YamuxStream: class NoWindowUpdate {} }));
  }
  if (broken.utils) {
    vi.doMock('@libp2p/utils', async (original) => ({ ...(await original<object>()), LengthPrefixedDecoder: class NoDecode {} }));
  }
  try {
    const fresh = await import('../src/p2p/host.ts');
    expect(fresh.createHost).not.toBe(createHost);
    return fresh.createHost;
  } finally {
    vi.doUnmock('@chainsafe/libp2p-yamux/stream');
    vi.doUnmock('@libp2p/utils');
    vi.resetModules();
  }
}

/** The SellerNodeWarning messages process.emitWarning was given while `run` ran. */
async function warningsDuring(run: () => Promise<void>): Promise<string[]> {
  const spy = vi.spyOn(process, 'emitWarning').mockImplementation(() => {});
  try {
    await run();
    return (spy.mock.calls as unknown[][]).filter((c) => c[1] === 'SellerNodeWarning').map((c) => String(c[0]));
  } finally {
    spy.mockRestore();
  }
}

/** Starts a dial-only host with `create`, checks it is up, and stops it. */
async function startAndStop(create: CreateHost): Promise<void> {
  const host = await create({ seed: testKey().seed, listen: [] });
  try {
    expect(host.status).toBe('started');
  } finally {
    await host.stop();
  }
}

afterEach(() => {
  vi.doUnmock('@chainsafe/libp2p-yamux/stream');
  vi.doUnmock('@libp2p/utils');
});

const YAMUX = 'libp2p tuning "yamux half-window updates" is off: @chainsafe/libp2p-yamux no longer has the shape it patches (see docs/decisions.md)';
const NOISE = 'libp2p tuning "Noise reads without an exception per read" is off: @libp2p/utils no longer has the shape it patches (see docs/decisions.md)';

describe('createHost: a tuning whose library changed shape', () => {
  test('libraries with the expected shape: no warning', async () => {
    expect(await warningsDuring(() => startAndStop(createHost))).toEqual([]);
  });

  test('yamux without sendWindowUpdate: one warning naming the tuning and the package, however many hosts start; the host still runs', async () => {
    const create = await hostOver({ yamux: true, utils: false });
    expect(await warningsDuring(() => startAndStop(create))).toEqual([YAMUX]);
    expect(await warningsDuring(async () => {
      await startAndStop(create);
      await startAndStop(create);
    })).toEqual([]);
  });

  test('a length-prefix decoder without decode(): its own warning, once', async () => {
    const create = await hostOver({ yamux: false, utils: true });
    expect(await warningsDuring(async () => {
      await startAndStop(create);
      await startAndStop(create);
    })).toEqual([NOISE]);
  });

  test('both changed: one warning each, once each', async () => {
    const create = await hostOver({ yamux: true, utils: true });
    expect(await warningsDuring(async () => {
      await startAndStop(create);
      await startAndStop(create);
    })).toEqual([YAMUX, NOISE]);
  });
});
