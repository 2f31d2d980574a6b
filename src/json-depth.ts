// How deeply a JSON text nests, found without parsing it. JSON.parse of 8 MiB of nesting
// ([[[[…]]]], ~4 million levels) held the event loop ~1.1 s, and any key holder could send that to
// the gateway for free, or to a node under a ticket (s24 hB); a scan of the bytes costs ~10 ms for
// 8 MiB, microseconds for a usual body. No request nests anywhere near MAX_JSON_DEPTH (a tool's
// JSON Schema a few dozen levels). Every body is scanned, so the limit is the same whatever its size.

/** The deepest nesting of objects and arrays a request body may have. */
export const MAX_JSON_DEPTH = 512;

/**
 * Whether UTF-8 JSON text nests objects and arrays more than `max` deep (brackets inside strings
 * do not count). Malformed text is for JSON.parse to refuse: this only looks at the brackets.
 */
export function nestsDeeperThan(bytes: Uint8Array, max = MAX_JSON_DEPTH): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const c = bytes[i]!;
    if (inString) {
      if (c === 0x5c) i++; // (a backslash escapes the next byte: \" and \\ stay inside)
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}
