/** A model file refused before any reader is given it; the message names the file and the fault. */
export class GgufFileError extends Error {
  override name = 'GgufFileError';
}
