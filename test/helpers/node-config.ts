// The YAML of a node serving the tiny model from ./tiny.gguf with the key ./node.key, as the
// end-to-end tests start it (through the CLI or startNode), and such a node started in-process.
import fs from 'node:fs';
import path from 'node:path';
import { writeTinyLlama } from '../../adapters/gguf/tiny-llama.ts';
import { parseConfig } from '../../src/config.ts';
import { createKeyFile } from '../../src/identity.ts';
import { startNode, type RunningNode } from '../../src/node.ts';

export interface TinyNodeConfig {
  /** The marketplace key the node trusts (hex). */
  publicKey: string;
  /** The marketplace to register with; none: the node does not register. */
  marketUrl?: string;
  context?: number;
  slots?: number;
  /** The `receipts:` mapping. */
  receipts?: string;
  logLevel?: string;
  /** More YAML lines at the end. */
  extra?: string;
  /** More models beside tiny/llama, each the tiny model (weights of `seed`) in its own file; startTinyNode writes them. */
  moreModels?: readonly { id: string; file: string; seed: number; mmap?: boolean; chatTemplate?: null }[];
}

export function tinyNodeConfigYaml(c: TinyNodeConfig): string {
  return [
    'key: ./node.key',
    'data_dir: ./data',
    'listen: [/ip4/127.0.0.1/tcp/0]',
    'marketplace:',
    ...(c.marketUrl !== undefined ? [`  url: "${c.marketUrl}"`] : []),
    `  public_keys: ["${c.publicKey}"]`,
    'models:',
    '  - id: tiny/llama',
    '    adapter: llama-embedded',
    '    path: ./tiny.gguf',
    `    context: ${c.context ?? 512}`,
    '    prices: { input_per_mtok_usd: "0.15", output_per_mtok_usd: "0.60" }',
    ...(c.slots !== undefined ? [`    slots: ${c.slots}`] : []),
    ...(c.moreModels ?? []).flatMap((m) => [
      `  - id: ${m.id}`,
      '    adapter: llama-embedded',
      `    path: ./${m.file}`,
      `    context: ${c.context ?? 512}`,
      ...(m.mmap !== undefined ? [`    mmap: ${m.mmap}`] : []),
      '    prices: { input_per_mtok_usd: "0.15", output_per_mtok_usd: "0.60" }',
    ]),
    'ops: { http: "127.0.0.1:0" }',
    `receipts: ${c.receipts ?? '{ signer_threads: 1 }'}`,
    `log_level: ${c.logLevel ?? 'warn'}`,
    c.extra ?? '',
  ].join('\n');
}

/** A node in a new folder `home` (its key, the tiny model, `tinyNodeConfigYaml(c)`), started in-process. */
export async function startTinyNode(home: string, c: TinyNodeConfig, opts: { logDestination?: number; runtimeOnThisThread?: boolean } = {}): Promise<RunningNode> {
  fs.mkdirSync(home, { recursive: true });
  createKeyFile(path.join(home, 'node.key'));
  writeTinyLlama(path.join(home, 'tiny.gguf'));
  for (const m of c.moreModels ?? []) writeTinyLlama(path.join(home, m.file), { seed: m.seed, ...(m.chatTemplate === null ? { chatTemplate: null } : {}) });
  return startNode(parseConfig(tinyNodeConfigYaml(c), home), opts);
}
