// The one way a marketplace base URL is written and checked, for the node's registration, its
// config and the gateway.
import { fetchPortProblem } from './fetch-ports.ts';

/** What is wrong with `url` as a marketplace base URL, or undefined when nothing is. */
export function marketUrlProblem(url: string): string | undefined {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return 'expected an http(s) URL';
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return 'expected an http(s) URL';
  return fetchPortProblem(u.port === '' ? (u.protocol === 'https:' ? 443 : 80) : Number(u.port));
}

/** "http://h:p", "http://h:p/" and "http://h:p/v1" all name the same market: "http://h:p". */
export function normalizeMarketUrl(url: string): string {
  const problem = marketUrlProblem(url);
  if (problem) throw new TypeError(`market URL "${url}": ${problem}`);
  return new URL(url).toString().replace(/\/+$/, '').replace(/\/v1$/, '');
}
