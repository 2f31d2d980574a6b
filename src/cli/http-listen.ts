// The `--listen host:port` of the HTTP servers the CLI starts (market, gateway): the grammar every
// listen address shares, and no port that fetch clients refuse to connect to.
import { fetchPortProblem } from '../fetch-ports.ts';
import { listenOptionProblem, parseHostPort, type HostPort } from '../host-port.ts';
import { CliError } from './cli-error.ts';

/** `s` as host and port (`defaultPort` when it names none), or a usage error (exit 2) like `example`. */
export function parseHttpListen(s: string, example: string, defaultPort?: number): HostPort {
  const hp = parseHostPort(s.trim(), defaultPort);
  if (!hp) throw new CliError(listenOptionProblem('--listen', s, example), 2);
  const problem = fetchPortProblem(hp.port);
  if (problem) throw new CliError(`--listen: ${problem}`, 2);
  return hp;
}
