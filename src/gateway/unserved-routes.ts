// The spec's routes this gateway does not serve yet answer 501 `not_supported`, naming what is
// missing, rather than 404 (which a client reads as an unknown model or resource).
import type { FastifyInstance } from 'fastify';
import { GatewayError } from './errors.ts';

/** What each unserved family is, in the refusal's words. */
const UNSERVED: readonly { method: 'GET' | 'POST' | 'DELETE'; url: string; why: string }[] = [
  ...['/v1/decisions', '/v1/decisions/flash-jev'].map((url) => ({ method: 'POST' as const, url, why: 'decisions are not sold by this marketplace\'s nodes yet' })),
  ...['/v1/images/generations', '/v1/videos', '/v1/audio/speech', '/v1/audio/transcriptions', '/v1/audio/generations', '/v1/music/generations', '/v1/workflows'].map((url) => ({ method: 'POST' as const, url, why: 'media jobs are not sold by this marketplace\'s nodes yet' })),
  { method: 'GET', url: '/v1/jobs', why: 'media jobs are not sold by this marketplace\'s nodes yet' },
  { method: 'GET', url: '/v1/jobs/:id', why: 'media jobs are not sold by this marketplace\'s nodes yet' },
  { method: 'DELETE', url: '/v1/jobs/:id', why: 'media jobs are not sold by this marketplace\'s nodes yet' },
  { method: 'GET', url: '/v1/artifacts/:id', why: 'media jobs (and their artifacts) are not sold by this marketplace\'s nodes yet' },
  { method: 'POST', url: '/v1/artifacts/:id/link', why: 'media jobs (and their artifacts) are not sold by this marketplace\'s nodes yet' },
  { method: 'GET', url: '/v1/balance', why: 'the development marketplace keeps no credit balance (GET /v1/requests/{id} gives each request\'s charge)' },
  { method: 'GET', url: '/v1/profile', why: 'the development marketplace keeps no account profile' },
  { method: 'GET', url: '/v1/proxy/offers', why: 'this gateway proxies no other sellers' },
  { method: 'POST', url: '/v1/proxy/profiles/:id/resolve', why: 'this gateway proxies no other sellers' },
];

/** The spec's estimate endpoints that are not served here (estimates of them: 501 too). */
export const UNSERVED_ESTIMATE_ENDPOINTS: ReadonlySet<string> = new Set(['DECISIONS', 'IMAGES', 'VIDEOS', 'AUDIO_SPEECH', 'AUDIO_TRANSCRIPTIONS', 'AUDIO_GENERATIONS', 'MUSIC', 'WORKFLOWS']);

export function registerUnservedRoutes(app: FastifyInstance): void {
  for (const r of UNSERVED) {
    const shown = r.url.replace(':id', '{id}');
    app.route({
      method: r.method,
      url: r.url,
      handler: async () => {
        throw new GatewayError(501, 'not_supported', `${r.method} ${shown}: this gateway does not serve it: ${r.why}`);
      },
    });
  }
}
