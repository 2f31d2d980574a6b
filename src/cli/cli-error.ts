/** An error the CLI reports in one line on stderr, with its exit code. */
export class CliError extends Error {
  readonly exitCode: number;
  constructor(message: string, exitCode = 1) {
    super(message);
    this.exitCode = exitCode;
  }
}

/** Parses a positive (or zero, with min 0) integer option; commander calls it per value. */
export function intOption(name: string, min = 1, max = Number.MAX_SAFE_INTEGER) {
  return (v: string): number => {
    if (!/^(0|[1-9][0-9]*)$/.test(v)) throw new CliError(`${name} must be a whole number, got "${v}"`, 2);
    const n = Number(v);
    if (n < min || n > max) throw new CliError(`${name} must be between ${min} and ${max}, got ${v}`, 2);
    return n;
  };
}
