// What a command prints of its input (an envelope's payloadType, a file name in an export, a
// message quoting either) made safe for a terminal. A raw escape sequence there could move the
// cursor, erase the FAIL line and print a forged "OK" in its place (s23 h3); control and format
// characters (C0, DEL, C1, zero-width and bidirectional controls, line and paragraph separators,
// the byte-order mark) are shown as \u escapes instead. `--json` output is escaped by JSON itself.

const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;

/** One line of output, with every control or format character escaped (`\u001b`). */
export function printable(line: string): string {
  return line.replace(UNSAFE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** Lines joined for output, each made printable. */
export function printLines(lines: readonly string[]): string {
  return lines.map(printable).join('\n') + '\n';
}
