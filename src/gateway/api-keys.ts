// Optional API keys for the gateway, as the spec has them: every route but the /models ones needs
// `Authorization: Bearer <key>` (or, as MCP apps send it, `X-Service-API-Key: <key>`); a missing or
// unknown key is 401. Without keys the gateway serves whoever reaches it, which is why it listens on
// the loopback by default. Keys are kept as their SHA-256 only, and a presented key is looked up by
// its hash, so no comparison runs over the secret itself.
import fs from 'node:fs';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { sha256Hex } from '../../attestation/hash.ts';
import { fsProblem } from '../fs-problem.ts';
import { GatewayError } from './errors.ts';

/** What a key must look like: 16 to 256 visible ASCII characters (the spec's are `sk-svc-v1-<secret>`). */
const KEY_RE = /^[\x21-\x7e]{16,256}$/;

/** Reads an API keys file: one key a line; blank lines and lines starting with # are skipped. Throws with the line at fault. */
export function readApiKeysFile(file: string): string[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new Error(`cannot read the API keys file ${file}: ${fsProblem(e)}`);
  }
  const keys: string[] = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) return;
    if (!KEY_RE.test(line)) throw new Error(`${file}:${i + 1}: an API key is 16 to 256 visible ASCII characters, without spaces`);
    keys.push(line);
  });
  if (keys.length === 0) throw new Error(`${file} holds no API key`);
  return keys;
}

/** The onRequest check for `keys` (routes under /v1/models are open, as the spec has them). */
export function apiKeyCheck(keys: readonly string[]): (req: FastifyRequest, reply: FastifyReply) => Promise<void> {
  for (const k of keys) if (!KEY_RE.test(k)) throw new TypeError('gateway: an API key is 16 to 256 visible ASCII characters, without spaces');
  const known = new Set(keys.map((k) => sha256Hex(k)));
  return async (req, reply) => {
    const path = req.url.split('?')[0]!;
    if ((req.method === 'GET' || req.method === 'HEAD') && (path === '/v1/models' || path.startsWith('/v1/models/'))) return;
    const auth = req.headers.authorization;
    const bearer = typeof auth === 'string' ? /^Bearer[ \t]+(.*)$/is.exec(auth)?.[1]?.trim() : undefined;
    const alt = req.headers['x-service-api-key'];
    const presented = bearer ?? (typeof alt === 'string' ? alt.trim() : undefined);
    if (presented === undefined || presented === '') throw unauthorized(reply, 'missing_api_key', 'this gateway needs an API key: send Authorization: Bearer <key>');
    if (!known.has(sha256Hex(presented))) throw unauthorized(reply, 'invalid_api_key', 'the API key is not one this gateway accepts');
  };
}

/** A 401, with the challenge HTTP asks of one (RFC 9110 §11.6.1). */
function unauthorized(reply: FastifyReply, code: string, message: string): GatewayError {
  void reply.header('www-authenticate', 'Bearer');
  return new GatewayError(401, code, message);
}
