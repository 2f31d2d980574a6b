// Raw bytes of the request-stream framing for tests that send what no client of ours would.

/** A frame length as the framing writes it: an unsigned LEB128 varint. */
export function varint(n: number): number[] {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return out;
}
