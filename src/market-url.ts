// The one way a marketplace base URL is written, for the node's registration and the gateway.

/** "http://h:p", "http://h:p/" and "http://h:p/v1" all name the same market: "http://h:p". */
export function normalizeMarketUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new TypeError(`market URL "${url}" is not a URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`market URL "${url}" must be http or https`);
  return u.toString().replace(/\/+$/, '').replace(/\/v1$/, '');
}
