// Closing connections that carry no stream for a while, so that connections opened and left (by a
// peer gone quiet, a crashed client whose socket the kernel keeps, or on purpose) give their place
// back. Yamux's keepalive pings keep such a connection's socket busy, so TCP's own inactivity
// timeout never ends it.
//
// A connection is idle while it has no stream at all, in either direction; its clock starts when
// its last stream ends (or, with none, when it opened) and stops as a stream opens. A connection
// with a stream is never closed here, however long the stream is quiet (a long answer, a slow
// prompt): the close is decided when the timer fires, on the connection's own stream list.
//
// To see a stream the moment it opens (also one opened and ended between two looks), each
// connection's muxer instance has its `cleanUpStream` wrapped: libp2p 3's AbstractStreamMuxer calls
// it for every new stream, inbound (onRemoteStream) and outbound (createStream), before anything
// else sees the stream. Listening for the muxer's 'stream' event instead would re-deliver a new
// connection's early streams to every listener, libp2p's own handler included. When the muxer no
// longer has that method (an upgrade; `idleStreamTracking()` says so, and createHost warns once),
// connections are still never closed with a stream open, but a stream that opened and ended
// between two looks does not restart the clock.
import { AbstractStreamMuxer } from '@libp2p/utils';
import type { Connection, Libp2p, Stream } from '@libp2p/interface';

interface Muxer {
  cleanUpStream(stream: Stream): void;
}

function muxerOf(connection: Connection): Muxer | undefined {
  const muxer = (connection as unknown as { muxer?: unknown }).muxer;
  return muxer !== null && typeof muxer === 'object' && typeof (muxer as Muxer).cleanUpStream === 'function' ? (muxer as Muxer) : undefined;
}

export interface IdleCloseOptions {
  /** How long a connection may have no stream before it is closed (> 0). */
  idleMs: number;
  /** Told of each connection closed here, as its close begins (once per connection; must not throw). */
  onIdleClose?: (conn: Connection) => void;
}

/** Whether libp2p's muxers still have the method a new stream is seen through (see above). */
export function idleStreamTracking(): boolean {
  return typeof (AbstractStreamMuxer?.prototype as unknown as Partial<Muxer> | undefined)?.cleanUpStream === 'function';
}

/** Closes `host`'s connections after `idleMs` without a stream (those opened from now on). */
export function watchIdleConnections(host: Libp2p, opts: IdleCloseOptions): void {
  const timers = new Map<Connection, ReturnType<typeof setTimeout>>();
  const watched = new WeakSet<Stream>();

  const stopClock = (conn: Connection): void => {
    const t = timers.get(conn);
    if (t !== undefined) clearTimeout(t);
    timers.delete(conn);
  };
  const startClock = (conn: Connection): void => {
    stopClock(conn);
    const t = setTimeout(() => fire(conn), opts.idleMs);
    t.unref?.();
    timers.set(conn, t);
  };
  /** Watches a stream's end; once the last of the connection's streams has ended, the clock runs. */
  const watch = (conn: Connection, stream: Stream): void => {
    if (watched.has(stream)) return;
    watched.add(stream);
    // (The muxer's own 'close' listener, added first, has taken the stream off its list by now.)
    stream.addEventListener('close', () => onStreamEnd(conn), { once: true });
  };
  const onStreamEnd = (conn: Connection): void => {
    if (conn.status !== 'open') return;
    if (conn.streams.length === 0) startClock(conn);
    else for (const s of conn.streams) watch(conn, s);
  };
  const fire = (conn: Connection): void => {
    timers.delete(conn);
    if (conn.status !== 'open') return;
    if (conn.streams.length > 0) {
      // A stream this missed: never close under it; its end starts the clock again.
      for (const s of conn.streams) watch(conn, s);
      return;
    }
    opts.onIdleClose?.(conn);
    conn.close().catch((err: unknown) => conn.abort(err instanceof Error ? err : new Error(String(err))));
  };

  host.addEventListener('connection:open', (evt) => {
    const conn = evt.detail;
    const muxer = muxerOf(conn);
    if (muxer) {
      const cleanUpStream = muxer.cleanUpStream;
      muxer.cleanUpStream = function (this: Muxer, stream: Stream): void {
        cleanUpStream.call(this, stream);
        stopClock(conn);
        watch(conn, stream);
      };
    }
    for (const s of conn.streams) watch(conn, s);
    if (conn.streams.length === 0) startClock(conn);
  });
  host.addEventListener('connection:close', (evt) => stopClock(evt.detail));
}
