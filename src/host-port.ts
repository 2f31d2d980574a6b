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
 * left out only when a default is given. A host of digits only is refused: it is a port given
 * alone ("24037"), which the resolver would read as the IPv4 number 0.0.93.229.
 */
export function parseHostPort(s: string, defaultPort?: number): HostPort | undefined {
  const m = HOST_PORT.exec(s);
  if (!m) return undefined;
  const host = (m[1] ?? m[2])!;
  if (/^[0-9]+$/.test(host)) return undefined;
  const port = m[3] === undefined ? defaultPort : Number(m[3]);
  if (port === undefined || port > 65535) return undefined;
  return { host, port };
}

/**
 * For a listen address that is a port alone (the number 24037 or the text "24037"): the loopback
 * address the operator most likely meant, "127.0.0.1:24037"; otherwise undefined.
 */
export function portAloneSuggestion(v: unknown): string | undefined {
  const s = typeof v === 'number' ? String(v) : typeof v === 'string' ? v.trim() : undefined;
  if (s === undefined || !/^[0-9]{1,5}$/.test(s) || Number(s) > 65535) return undefined;
  return `127.0.0.1:${Number(s)}`;
}

/** The usage error for a refused `--listen`-style option: `--listen must be host:port, e.g. …; got "…"`. */
export function listenOptionProblem(option: string, got: string, example: string): string {
  const alone = portAloneSuggestion(got);
  return `${option} must be host:port, e.g. ${example}; got "${got}"${alone === undefined ? '' : ` (a port alone: write ${alone})`}`;
}

/** Whether `host` names the loopback interface (listen() warns otherwise). */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/**
 * Whether a Host header names this machine's loopback, any port: localhost, 127.0.0.0/8, [::1] or
 * ::ffff:127.x, in any spelling a URL parser takes for them (a trailing dot, 127.1,
 * [0:0:0:0:0:0:0:1], upper case).
 */
export function isLoopbackHostHeader(host: string): boolean {
  if (!/^[A-Za-z0-9.:[\]-]+$/.test(host)) return false; // (no userinfo, path or space for the parser to read past)
  let name: string;
  try {
    name = new URL(`http://${host}/`).hostname;
  } catch {
    return false;
  }
  if (name.endsWith('.')) name = name.slice(0, -1);
  return name === 'localhost' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(name) || name === '[::1]' || /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(name);
}

const LISTEN_WHY: Readonly<Record<string, string>> = {
  EADDRINUSE: 'address already in use',
  EADDRNOTAVAIL: 'no such address on this machine',
  EACCES: 'permission denied (ports below 1024 need privileges)',
};

/** Why listening failed, from its errno code, and what to do (`fix`: "pick another with --listen"); undefined for another code. */
export function listenWhy(code: unknown, fix: string): string | undefined {
  const why = typeof code === 'string' && Object.hasOwn(LISTEN_WHY, code) ? LISTEN_WHY[code] : undefined;
  return why && `${why} (${fix})`;
}

/** `<addr>: <why> (<fix>)` when `e` is a server's failure to listen (listenWhy); undefined otherwise. */
export function listenProblem(e: unknown, addr: string, fix: string): string | undefined {
  const { code, syscall } = (e ?? {}) as { code?: unknown; syscall?: unknown };
  const why = syscall === 'listen' || syscall === 'bind' ? listenWhy(code, fix) : undefined;
  return why && `${addr}: ${why}`;
}
