// "HOST:PORT" as the CLI and the config take it: "127.0.0.1:9464", "localhost:11436",
// "[::1]:11435". One grammar for every listen address, so they all accept and refuse the same.

export interface HostPort {
  /** Without brackets for IPv6. */
  host: string;
  port: number;
}

const HOST_PORT = /^(?:\[([0-9a-fA-F:.]+)\]|([^\s:[\]]+))(?::([0-9]{1,5}))?$/;

/**
 * Host and port, or undefined when `s` is not HOST:PORT with a port up to 65535. The port may be
 * left out only when a default is given.
 */
export function parseHostPort(s: string, defaultPort?: number): HostPort | undefined {
  const m = HOST_PORT.exec(s);
  if (!m) return undefined;
  const port = m[3] === undefined ? defaultPort : Number(m[3]);
  if (port === undefined || port > 65535) return undefined;
  return { host: (m[1] ?? m[2])!, port };
}
