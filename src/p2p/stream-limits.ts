// Stream counts and buffer sizes shared by the host's muxer configuration, the request protocols
// and the stream readers.

/** Streams one connection may have open for one request protocol, each way (and early streams: see host.ts). */
export const STREAMS_PER_PROTOCOL = 128;

/**
 * The largest yamux receive window our hosts grant a stream (libp2p's default is 16 MiB). It bounds what
 * a peer can have in flight on one stream, and so the memory a paused stream can hold: 4 MiB still moves
 * 40 MB/s per stream over a 100 ms round trip.
 */
export const HOST_MAX_STREAM_WINDOW = 4 * 1024 * 1024;

/**
 * libp2p resets a stream whose unread buffer exceeds `maxReadBufferLength` (default 4 MiB), but yamux
 * keeps sending until the receive window is spent. A reader that pauses for backpressure needs room for
 * a full window, or a slow consumer gets its stream reset. Sized for yamux's default 16 MiB window, so
 * it also holds on hosts not made by createHost().
 */
export const STREAM_READ_BUFFER = 16 * 1024 * 1024 + 4 * 1024 * 1024;
