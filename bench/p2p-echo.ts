// Request rate over libp2p on loopback, two hosts in this process, one connection, one request at a
// time or several in flight: (a) a bare libp2p echo (open a stream, write one small message, read it back, close) as the
// baseline, and (b) the same exchange through request-stream (HEAD + small body → HEAD + DATA + TRAILER).
// The ratio framed/bare is the cost of the framing layer on top of stream setup.
// Given some work, it also times (c) the bare echo whose handler does that work before it answers:
// the node's benchmark passes the runtime's one-token call, so (c) is the most any node could reach.
import { createHost, type Host } from '../src/p2p/host.ts';
import { handleRequests, readResponse, request } from '../src/p2p/request-stream.ts';
import type { Multiaddr } from '@multiformats/multiaddr';
import type { Stream } from '@libp2p/interface';
import { timed } from './lib.ts';

const BARE = '/bench/echo-bare/1.0.0';
const FRAMED = '/bench/echo-framed/1.0.0';
const WITH_WORK = '/bench/echo-work/1.0.0';

async function bareEcho(client: Host, addr: Multiaddr, msg: Uint8Array, protocol = BARE): Promise<void> {
  const stream = await client.dialProtocol(addr, protocol);
  stream.send(msg);
  await stream.close();
  let got = 0;
  for await (const chunk of stream) got += chunk.byteLength;
  if (got !== msg.length) throw new Error(`bare echo returned ${got} bytes, expected ${msg.length}`);
}

async function framedEcho(client: Host, addr: Multiaddr, msg: Uint8Array): Promise<void> {
  const r = await readResponse(await request(client, addr, FRAMED, { endpoint: '/echo' }, msg));
  if (r.body.length !== msg.length || r.head.status !== 200) throw new Error('framed echo returned the wrong response');
}

/** Requests per second of each exchange, measured in alternating rounds so drift hits both alike. */
async function rates(n: number, kinds: Array<() => Promise<void>>, concurrency: number, rounds = 4): Promise<number[]> {
  for (const one of kinds) await timed(one, Math.min(200, n), concurrency); // warm-up: JIT, yamux windows
  const ms = kinds.map(() => 0);
  const per = Math.max(1, Math.ceil(n / rounds));
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < kinds.length; k++) ms[k]! += await timed(kinds[k]!, per, concurrency);
  }
  return ms.map((t) => (per * rounds) / (t / 1000));
}

/**
 * Echo rates over one connection, `concurrency` requests in flight (1: one at a time). With `work`,
 * also the rate of the bare echo whose handler awaits `work()` after reading and before answering.
 */
export async function benchP2pEcho(n: number, concurrency = 1, work?: () => Promise<void>): Promise<{ bare: number; framed: number; withWork?: number }> {
  const server = await createHost({ seed: new Uint8Array(32).fill(0xb1), listen: ['/ip4/127.0.0.1/tcp/0'] });
  const client = await createHost({ seed: new Uint8Array(32).fill(0xb2), listen: [] });
  try {
    const echo = (before?: () => Promise<void>) => async (stream: Stream) => {
      try {
        const got: Array<Parameters<Stream['send']>[0]> = [];
        for await (const chunk of stream) {
          if (before) got.push(chunk);
          else stream.send(chunk);
        }
        if (before) await before();
        for (const chunk of got) stream.send(chunk);
        await stream.close();
      } catch (e) {
        stream.abort(e as Error);
      }
    };
    await server.handle(BARE, echo());
    if (work) await server.handle(WITH_WORK, echo(work));
    await handleRequests(server, FRAMED, async (req, res) => {
      await res.head({ status: 200 });
      await res.data(req.body);
      await res.trailer({ ok: true });
    });
    const addr = server.getMultiaddrs()[0]!;
    const msg = new TextEncoder().encode('{"model":"tiny","prompt":"hello"}');
    const kinds = [() => bareEcho(client, addr, msg), () => framedEcho(client, addr, msg)];
    if (work) kinds.push(() => bareEcho(client, addr, msg, WITH_WORK));
    const [bare = 0, framed = 0, withWork] = await rates(n, kinds, concurrency);
    const fmt = (x: number) => Math.round(x).toLocaleString('en-US');
    const worked = withWork === undefined ? '' : `, bare with the work in its handler ${fmt(withWork)} req/s (${(withWork / bare).toFixed(3)})`;
    process.stdout.write(
      `p2p echo, loopback, ${concurrency === 1 ? 'one at a time' : `${concurrency} in flight`} (n=${n}): bare libp2p ${fmt(bare)} req/s, request-stream ${fmt(framed)} req/s, ratio ${(framed / bare).toFixed(3)}${worked}\n`,
    );
    return { bare, framed, withWork };
  } finally {
    await client.stop();
    await server.stop();
  }
}

if (import.meta.main) await benchP2pEcho(Number(process.argv[2] ?? 2000), Number(process.argv[3] ?? 1));
