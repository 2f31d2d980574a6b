// Yamux window updates when half the receive window is spent, as hashicorp/yamux and go-yamux send
// them, instead of after every data frame.
//
// js-libp2p's yamux (@chainsafe/libp2p-yamux) tops the window up after each frame it receives: a
// stream of small frames (tokens) costs the receiver one more muxer frame, Noise message and socket
// write per frame, and the sender one more read and decryption. Waiting until half the window is
// spent is what the Go implementations do, and the protocol allows any schedule: the sender keeps at
// least half a window of credit, so it is never held up by the later update. A stream that is not
// yet established (its SYN or ACK rides on the update) or paused (no update at all: backpressure)
// takes the original path.
//
// The patch is applied to the YamuxStream class (a public export of the package) once, and only
// when the class still has the fields it relies on; otherwise yamux is left as it is.
import { StreamState, YamuxStream } from '@chainsafe/libp2p-yamux/stream';

interface WindowFields {
  state: StreamState;
  recvWindow: number;
  recvWindowCapacity: number;
}

const PATCHED = Symbol.for('seller-node.yamux-half-window-updates');

/** Installs the half-window rule (idempotent). Returns whether yamux now follows it. */
export function halfWindowUpdates(): boolean {
  const proto = YamuxStream.prototype as unknown as { sendWindowUpdate?: () => void; [PATCHED]?: true };
  if (proto[PATCHED]) return true;
  const original = proto.sendWindowUpdate;
  if (typeof original !== 'function' || typeof StreamState?.Established !== 'number') return false;
  proto.sendWindowUpdate = function (this: WindowFields) {
    if (
      this.state === StreamState.Established &&
      typeof this.recvWindow === 'number' &&
      typeof this.recvWindowCapacity === 'number' &&
      this.recvWindowCapacity * 2 >= this.recvWindow
    ) {
      return;
    }
    original.call(this);
  };
  proto[PATCHED] = true;
  return true;
}
