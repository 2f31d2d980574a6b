// Opening a request stream without waiting a round trip for protocol negotiation.
//
// libp2p 3's dialProtocol runs multistream-select to the end before it hands a stream over: the
// client writes "/multistream/1.0.0\n" and the protocol id, waits for the node to echo both, and only
// then may send its request (its `negotiateFully: false` option is declared but unused). That is one
// network round trip before every request. go-libp2p clients select "lazily" instead: they write the
// two lines and the first request bytes together and read the echo in front of the answer; a libp2p
// listener (js, go, rust) hands the bytes that follow the protocol id on to the protocol's handler.
// This module opens the raw muxed stream for that and says which bytes go first and come back first.
//
// It reaches into the connection for its stream muxer (`connection.muxer`, libp2p 3.3's Connection
// class; the version is pinned, see docs/decisions.md): when that is not there, the caller falls back
// to dialProtocol and negotiates as before.
import type { Connection, Stream } from '@libp2p/interface';
import { concatBytes } from '../../attestation/bytes.ts';

const MULTISTREAM = '/multistream/1.0.0';
const encoder = new TextEncoder();

/** One multistream-select message: uvarint(length) ‖ text ‖ "\n" (every length here is < 2^14). */
function mssMessage(text: string): Uint8Array {
  const bytes = encoder.encode(`${text}\n`);
  if (bytes.length >= 1 << 14) throw new RangeError('a protocol id must be shorter than 16 KiB');
  const prefix = bytes.length < 0x80 ? Uint8Array.of(bytes.length) : Uint8Array.of((bytes.length & 0x7f) | 0x80, bytes.length >> 7);
  const out = new Uint8Array(prefix.length + bytes.length);
  out.set(prefix);
  out.set(bytes, prefix.length);
  return out;
}

/**
 * The bytes a client sends first to select `protocol`, which are also exactly the bytes a listener
 * that speaks it answers first (it echoes the multistream header, then the protocol id).
 */
export function selectPreamble(protocol: string): Uint8Array {
  let bytes = preambles.get(protocol);
  if (!bytes) preambles.set(protocol, (bytes = concatBytes(HEADER, mssMessage(protocol))));
  return bytes;
}

const HEADER = mssMessage(MULTISTREAM);
/** Preambles by protocol id (a client speaks a handful). */
const preambles = new Map<string, Uint8Array>();

/** How many of the preamble's bytes are the multistream header (the rest is the protocol id). */
export const HEADER_BYTES = HEADER.length;

interface RawMuxer {
  createStream(options?: object): Stream | Promise<Stream>;
}

function muxerOf(connection: Connection): RawMuxer | undefined {
  const muxer = (connection as unknown as { muxer?: unknown }).muxer;
  return muxer !== null && typeof muxer === 'object' && typeof (muxer as RawMuxer).createStream === 'function' ? (muxer as RawMuxer) : undefined;
}

/**
 * A new outbound stream on `connection` on which nothing has been negotiated yet: the caller
 * writes selectPreamble(protocol) before its own bytes and checks the same bytes come back first.
 * The stream is labelled with `protocol` so that libp2p's stream counts include it. Undefined when
 * the connection's muxer is out of reach (use the connection's newStream then).
 */
export async function openUnnegotiated(connection: Connection, protocol: string): Promise<Stream | undefined> {
  const muxer = muxerOf(connection);
  if (!muxer || connection.status !== 'open' || connection.limits != null) return undefined;
  const stream = await muxer.createStream({});
  stream.protocol = protocol;
  return stream;
}
