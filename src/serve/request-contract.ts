// The request contract this node signs for its models (attestation/request-contract.ts): what
// src/serve/contract.ts takes, written down for buyers. test/request-contract.test.ts holds the two
// together: every field named here is one contract.ts knows, every field it knows is named here,
// and each bound, value list and type below is the one parseRequest applies.
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import { signRequestContract, type AttributeSpec, type ContractEndpoint, type EndpointContract } from '../../attestation/request-contract.ts';
import { MAX_SEED, type PaidEndpoint } from './contract.ts';

const MAX_TOKENS = 1 << 24;

/** Only absent or null is taken: a feature this node does not offer. */
const absent = (type: AttributeSpec['type']): AttributeSpec => ({ type, use: 'default_only', enum: [null] });
const only = (type: AttributeSpec['type'], values: unknown[]): AttributeSpec => ({ type, use: 'default_only', enum: values });
const noEffect = (type: AttributeSpec['type'], extra: Partial<AttributeSpec> = {}): AttributeSpec => ({ type, use: 'no_effect', ...extra });

const SAMPLING: Record<string, AttributeSpec> = {
  temperature: { type: 'number', use: 'applied', minimum: 0, maximum: 2, default: 1 },
  top_p: { type: 'number', use: 'applied', minimum: 0, maximum: 1, note: "left out: the runtime's default (llama.cpp: 0.95)" },
  top_k: { type: 'integer', use: 'applied', minimum: -1, maximum: MAX_TOKENS, note: "0 or -1 turns it off; left out: the runtime's default (llama.cpp: 40)" },
  min_p: { type: 'number', use: 'applied', minimum: 0, maximum: 1 },
  repetition_penalty: { type: 'number', use: 'applied', exclusive_minimum: 0, maximum: 100, note: 'over the last 64 tokens; 1 turns it off; only when sampling (temperature above 0)' },
  seed: { type: 'integer', use: 'applied', minimum: 0, maximum: MAX_SEED, default: 0, note: 'the same seed and body give the same answer (an audit replays it)' },
  stop: { type: ['string', 'array'], use: 'applied', max_items: 4, note: 'a non-empty string, or up to 4 of them' },
  logit_bias: only('object', [{}]),
  frequency_penalty: only('number', [0]),
  presence_penalty: only('number', [0]),
};

const ACCOUNTING: Record<string, AttributeSpec> = {
  user: noEffect('string'),
  metadata: noEffect('object'),
  store: noEffect('boolean'),
  service_tier: noEffect('string', { enum: ['auto', 'default'] }),
  prompt_cache_key: noEffect('string'),
  safety_identifier: noEffect('string'),
};

const CONTEXT_NOTE = "at most the model's context less the input (else 400 context_length_exceeded)";
const maxTokens = (note?: string): AttributeSpec => ({ type: 'integer', use: 'applied', minimum: 1, maximum: MAX_TOKENS, note: note ? `${note}; ${CONTEXT_NOTE}` : CONTEXT_NOTE });

// Where the node takes less of a common field than the marketplace API allows (held to
// parseRequest by test/request-contract.test.ts, one refused body for each claim).
const MESSAGE_NOTE = "roles system, developer, user, assistant and tool; content a string, null, or text parts only (type text, input_text or output_text, and its text; an earlier answer's part may carry annotations, logprobs and parsed, empty)";
const MAX_TOKENS_NOTE = `1 to ${MAX_TOKENS}, and ${CONTEXT_NOTE}`;
const STREAM_OPTIONS_NOTE = 'only with stream: true; include_usage, and include_obfuscation only false';

const CHAT: EndpointContract = {
  common: ['model', 'messages', 'max_tokens', 'stream', 'stream_options'],
  common_notes: {
    messages: `${MESSAGE_NOTE}; name and tool_call_id (1 to 256 characters) and an assistant turn's tool_calls (at most 128) reach the chat template; an answer's own fields (refusal, annotations, ...) only empty`,
    max_tokens: `${MAX_TOKENS_NOTE}; give max_tokens or max_completion_tokens, not both`,
    stream_options: STREAM_OPTIONS_NOTE,
  },
  attributes: {
    max_completion_tokens: maxTokens('max_tokens by its newer name: give one of the two'),
    n: only('integer', [1]),
    logprobs: only('boolean', [false]),
    top_logprobs: only('integer', [0]),
    tools: only('array', [[]]),
    functions: only('array', [[]]),
    tool_choice: only('string', ['none', 'auto']),
    function_call: only('string', ['none', 'auto']),
    parallel_tool_calls: noEffect('boolean'),
    response_format: only('object', [{ type: 'text' }]),
    modalities: only('array', [['text']]),
    audio: absent('object'),
    prediction: absent('object'),
    reasoning_effort: absent('string'),
    web_search_options: absent('object'),
    verbosity: only('string', ['medium']),
    ...SAMPLING,
    ...ACCOUNTING,
  },
};

const COMPLETIONS: EndpointContract = {
  common: ['model', 'prompt', 'max_tokens', 'stream', 'stream_options'],
  common_notes: {
    prompt: 'a string only (no list of prompts, no token ids)',
    max_tokens: MAX_TOKENS_NOTE,
    stream_options: STREAM_OPTIONS_NOTE,
  },
  attributes: {
    n: only('integer', [1]),
    best_of: only('integer', [1]),
    logprobs: only('boolean', [false]),
    echo: only('boolean', [false]),
    suffix: only('string', ['']),
    ...SAMPLING,
    ...ACCOUNTING,
  },
};

const RESPONSES: EndpointContract = {
  common: ['model', 'input'],
  common_notes: { input: `a string, or message items only (type "message" or left out; id and status as an earlier output item carries them), each with a role and content and nothing else; ${MESSAGE_NOTE}` },
  attributes: {
    instructions: { type: 'string', use: 'applied', note: 'read as a leading system message' },
    stream: { type: 'boolean', use: 'applied', default: false },
    stream_options: noEffect('object', { note: 'only with stream: true; include_usage, and include_obfuscation only false (the closing event always carries usage)' }),
    max_output_tokens: maxTokens(),
    top_logprobs: only('integer', [0]),
    text: { type: 'object', use: 'default_only', note: 'format {"type": "text"} and verbosity "medium" only' },
    tools: only('array', [[]]),
    tool_choice: only('string', ['none', 'auto']),
    parallel_tool_calls: noEffect('boolean'),
    max_tool_calls: noEffect('integer', { minimum: 0, maximum: 1 << 20 }),
    previous_response_id: absent('string'),
    conversation: absent(['string', 'object']),
    prompt: absent('object'),
    reasoning: absent('object'),
    background: only('boolean', [false]),
    include: only('array', [[]]),
    truncation: only('string', ['disabled']),
    ...SAMPLING,
    ...ACCOUNTING,
  },
};

const EMBEDDINGS: EndpointContract = {
  common: ['model', 'input'],
  common_notes: { input: 'a non-empty string, or 1 to 2048 of them (no token ids)' },
  attributes: {
    encoding_format: { type: 'string', use: 'applied', enum: ['float', 'base64'], default: 'float' },
    dimensions: absent('integer'),
    user: noEffect('string'),
  },
};

/** The contract of every text endpoint this node serves, for each of its models. */
export const TEXT_REQUEST_CONTRACT: Record<ContractEndpoint, EndpointContract> = {
  'chat/completions': CHAT,
  completions: COMPLETIONS,
  responses: RESPONSES,
  embeddings: EMBEDDINGS,
};

/**
 * The node's signed request contracts: one for each set of its models sold for the same endpoints
 * (a model without a chat template is not sold for chat's), naming only those endpoints.
 */
export function signTextRequestContracts(seed: Uint8Array, provider: string, models: readonly { id: string; endpoints: readonly PaidEndpoint[] }[]): DsseEnvelope[] {
  const groups = new Map<string, { endpoints: readonly PaidEndpoint[]; ids: string[] }>();
  for (const m of models) {
    const key = m.endpoints.join(' ');
    const g = groups.get(key) ?? { endpoints: m.endpoints, ids: [] };
    g.ids.push(m.id);
    groups.set(key, g);
  }
  return [...groups.values()].map((g) => signRequestContract(seed, provider, g.ids, Object.fromEntries(g.endpoints.map((e) => [e, TEXT_REQUEST_CONTRACT[e]]))).envelope);
}
