// Noise's message reader without an exception per socket read.
//
// @chainsafe/libp2p-noise cuts the encrypted byte stream into messages with @libp2p/utils'
// LengthPrefixedDecoder: after the last whole message of a read it asks for one more length
// prefix, and the prefix reader throws a RangeError on the empty buffer to end the loop. That
// throw (a fresh RangeError, stack trace and all, from deep inside an event dispatch) came to ~5 %
// of the event loop's busy time while the node streamed tokens. Here the length reader answers "a
// message of 0 bytes" for an empty buffer instead: every prefix is at least one byte long, so the
// loop sees too few bytes for the message and stops, as it did after the throw, and the next read
// goes on as before. A decoder only ever reads a prefix at the start of its buffer, so nothing
// else changes.
//
// The patch is applied to the class (a public export of @libp2p/utils) once, and only when it still
// has the shape it relies on; otherwise it is left as it is.
import { LengthPrefixedDecoder } from '@libp2p/utils';

type LengthReader = (data: { byteLength: number }) => number;

interface DecoderFields {
  encodingLength?: (n: number) => number;
  lengthDecoder: LengthReader;
  [GUARDED]?: true;
}

const PATCHED = Symbol.for('seller-node.length-prefix-no-throw');
const GUARDED = Symbol.for('seller-node.length-prefix-no-throw.guarded');

/** Installs the empty-buffer answer (idempotent). Returns whether the decoder now follows it. */
export function lengthPrefixWithoutThrow(): boolean {
  const proto = LengthPrefixedDecoder.prototype as unknown as { decode?: (buf: unknown) => unknown; [PATCHED]?: true };
  if (proto[PATCHED]) return true;
  const original = proto.decode;
  if (typeof original !== 'function') return false;
  proto.decode = function (this: DecoderFields, buf: unknown) {
    // Only a decoder whose prefixes are at least a byte long (Noise's are 2) may answer "0 bytes"
    // for an empty buffer: with a 0-byte prefix the decoder would never see too few bytes.
    if (!this[GUARDED] && typeof this.lengthDecoder === 'function' && typeof this.encodingLength === 'function' && this.encodingLength(0) >= 1) {
      const read = this.lengthDecoder;
      this.lengthDecoder = (data) => (data.byteLength === 0 ? 0 : read(data));
      this[GUARDED] = true;
    }
    return original.call(this, buf);
  };
  proto[PATCHED] = true;
  return true;
}
