// A node serving a model without a chat template (a base or embedding GGUF) beside one with: the
// registration sells the first for completions and embeddings only, under a request contract of
// its own naming those two, and the market tickets it for nothing else.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { verifyRequestContract } from '../attestation/request-contract.ts';
import { createMarket } from '../src/market/market.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { waitForListed } from './helpers/wait.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'node-no-template-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('a node with a model that has no chat template', () => {
  test('registers it for completions and embeddings only, with a contract naming those; the market tickets chat for it nowhere', async () => {
    const market = createMarket({ seed: new Uint8Array(32).fill(62), heartbeatIntervalMs: 60_000 });
    const url = (await market.listen()).url;
    const node = await startTinyNode(path.join(dir, 'n'), { publicKey: market.publicKey, marketUrl: url, context: 256, logLevel: 'fatal', moreModels: [{ id: 'base/model', file: 'base.gguf', seed: 5, chatTemplate: null }] });
    try {
      await waitForListed(url, [node.providerId]);
      const listed = ((await (await fetch(`${url}/v1/providers?request_contracts=true`)).json()) as { provider: string; models: { id: string; endpoints?: string[] }[]; request_contracts: DsseEnvelope[] }[]).find((p) => p.provider === node.providerId)!;
      expect(listed.models.map((m) => [m.id, m.endpoints])).toEqual([
        ['tiny/llama', undefined],
        ['base/model', ['completions', 'embeddings']],
      ]);
      const contracts = listed.request_contracts.map((env) => {
        const v = verifyRequestContract(env, { provider: node.providerId });
        expect(v.ok).toBe(true);
        return v.ok ? { models: v.value.models, endpoints: Object.keys(v.value.endpoints).sort() } : undefined;
      });
      expect(contracts).toEqual([
        { models: ['tiny/llama'], endpoints: ['chat/completions', 'completions', 'embeddings', 'responses'] },
        { models: ['base/model'], endpoints: ['completions', 'embeddings'] },
      ]);
      const ticket = (endpoint: string, model: string) => fetch(`${url}/v1/tickets`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint, model, body_sha256: '00'.repeat(32) }) });
      const chat = await ticket('chat/completions', 'base/model');
      expect(chat.status).toBe(404);
      expect(((await chat.json()) as { error: { code: string } }).error.code).toBe('model_not_found');
      expect((await ticket('completions', 'base/model')).status).toBe(200);
      expect((await ticket('chat/completions', 'tiny/llama')).status).toBe(200);
    } finally {
      await node.stop(1000);
      await market.close();
    }
  });
});
