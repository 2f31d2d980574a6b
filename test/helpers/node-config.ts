// The YAML of a node serving the tiny model from ./tiny.gguf with the key ./node.key, as the
// end-to-end tests start it (through the CLI or startNode).

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
    'ops: { http: "127.0.0.1:0" }',
    `receipts: ${c.receipts ?? '{ signer_threads: 1 }'}`,
    `log_level: ${c.logLevel ?? 'warn'}`,
    c.extra ?? '',
  ].join('\n');
}
