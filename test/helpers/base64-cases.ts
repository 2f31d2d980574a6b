// Base64 strictness cases shared by the decoder's tests (bytes, the browser path, DSSE's PAE).
import crypto from 'node:crypto';

/**
 * Strings a lenient decoder accepts but strict standard base64 refuses. Node's decoder reads the
 * low byte of each UTF-16 unit: U+0141 as "A", U+012D as "-", U+013D as "=".
 */
export const LENIENT_BASE64 = ['QQ', 'QQ=', 'QR==', 'QUI', 'QUJ=', 'Q Q==', 'QQ==\n', '-_8=', 'QQ==QQ==', '====', 'A===', '\u0141AAA', 'QUJD\u0141AAA', 'QQ\u013D=', '\u012DAAA', 'QUJ\u00e9'];

/** The alphabet's edges plus what a lenient decoder skips, maps or reads by its low byte. */
export const FUZZ_BASE64_CHARS = 'AQgwBC+/=-_ \n\\\u0141\u012D\u013D\u00c1';

/**
 * `count` random strings of 4 or 8 characters from `chars`, each with whether it is canonical:
 * Buffer decodes it and re-encodes the very same text (the definition the strict decoders must meet).
 */
export function* base64Candidates(count: number, chars = FUZZ_BASE64_CHARS): Generator<{ s: string; canonical: boolean; bytes: Buffer }> {
  const rand = crypto.randomBytes(count * 9);
  for (let i = 0; i < count; i++) {
    const len = 4 * (1 + (rand[i * 9]! % 2));
    let s = '';
    for (let j = 0; j < len; j++) s += chars[rand[i * 9 + 1 + j]! % chars.length]!;
    const bytes = Buffer.from(s, 'base64');
    yield { s, canonical: bytes.toString('base64') === s, bytes };
  }
}
