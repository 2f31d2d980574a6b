// The request contracts of the text endpoints (marketplace-api.md): parse the exact body bytes,
// check every field the node acts on, and refuse anything else with 400 naming the field.
// Nothing is charged for a request refused here.
import type { ChatMessage, ToolCall } from '../../adapters/runtime-adapter.ts';
import { MAX_JSON_DEPTH, nestsDeeperThan } from '../json-depth.ts';

export class ContractError extends Error {
  override name = 'ContractError';
  readonly field: string;
  constructor(field: string, message: string) {
    super(field ? `${field}: ${message}` : message);
    this.field = field;
  }
}

/** The endpoints a node bills: each needs a ticket and ends in a receipt. */
export const PAID_ENDPOINTS = ['chat/completions', 'completions', 'responses', 'embeddings'] as const;
export type PaidEndpoint = (typeof PAID_ENDPOINTS)[number];
/** The paid endpoints that take chat messages: a model without a chat template cannot serve them. */
export const CHAT_ENDPOINTS: readonly PaidEndpoint[] = ['chat/completions', 'responses'];
/** The paid endpoints a model serves: every one, but chat's when it has no chat template (a base or embedding model). */
export function endpointsServed(info: { readonly chatTemplate: string | null }): PaidEndpoint[] {
  return PAID_ENDPOINTS.filter((e) => info.chatTemplate !== null || !CHAT_ENDPOINTS.includes(e));
}
/** The endpoints a node answers free, without a ticket (counting tokens). */
export const FREE_ENDPOINTS = ['tokenize', 'count_tokens'] as const;
export type FreeEndpoint = (typeof FREE_ENDPOINTS)[number];
export type TextEndpoint = PaidEndpoint | FreeEndpoint;
export const TEXT_ENDPOINTS: readonly TextEndpoint[] = [...PAID_ENDPOINTS, ...FREE_ENDPOINTS];

export interface GenerationParams {
  maxTokens: number | undefined;
  stream: boolean;
  includeUsage: boolean;
  temperature: number;
  topP: number | undefined;
  /** llama.cpp's top_k: 0 turns it off. */
  topK: number | undefined;
  minP: number | undefined;
  /** llama.cpp's repeat penalty over the last 64 tokens: 1 turns it off. */
  repetitionPenalty: number | undefined;
  seed: number | undefined;
  stop: string[];
}

export type ParsedRequest =
  | ({ endpoint: 'chat/completions'; model: string; messages: ChatMessage[] } & GenerationParams)
  | ({ endpoint: 'completions'; model: string; prompt: string } & GenerationParams)
  | ({ endpoint: 'responses'; model: string; messages: ChatMessage[] } & GenerationParams)
  | { endpoint: 'embeddings'; model: string; input: string[]; encoding: 'float' | 'base64' }
  | { endpoint: 'tokenize' | 'count_tokens'; model: string; messages?: ChatMessage[]; prompt?: string; returnTokens: boolean };

const ROLES = ['system', 'user', 'assistant', 'tool', 'developer'] as const;
/** The largest request body the text API accepts (the gateway refuses larger ones before a ticket). */
export const MAX_REQUEST_BODY = 8 << 20;

type Obj = Record<string, unknown>;

function object(v: unknown, field: string): Obj {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new ContractError(field, 'expected an object');
  return v as Obj;
}

/** Refuses a key of `o` outside `keys` (it would be ignored), and one of `emptyOnly` that is not null or empty. */
function onlyKeys(o: Obj, field: string, keys: readonly string[], emptyOnly: readonly string[] = []): void {
  for (const k of Object.keys(o)) {
    if (keys.includes(k)) continue;
    const v = o[k];
    if (emptyOnly.includes(k) && (v === null || (Array.isArray(v) && v.length === 0))) continue;
    throw new ContractError(`${field}.${k.slice(0, 64)}`, emptyOnly.includes(k) ? 'not supported by this model (only null or empty)' : 'not a field here (it would be ignored)');
  }
}

function optInt(v: unknown, field: string, min: number, max: number): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) throw new ContractError(field, `expected an integer from ${min} to ${max}`);
  return v;
}

function optNumber(v: unknown, field: string, min: number, max: number): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) throw new ContractError(field, `expected a number from ${min} to ${max}`);
  return v;
}

function optBool(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw new ContractError(field, 'expected true or false');
  return v;
}

/**
 * Message content: a string, an array of text parts (joined), or JSON null (no text: an assistant
 * turn that only called tools, as OpenAI clients send it). The field itself is required.
 */
function content(v: unknown, field: string): string {
  if (typeof v === 'string') return v;
  if (v === null) return '';
  if (Array.isArray(v)) {
    return v
      .map((p, i) => {
        const part = object(p, `${field}[${i}]`);
        const textual = part.type === 'text' || part.type === 'input_text' || part.type === 'output_text';
        if (!textual || typeof part.text !== 'string') throw new ContractError(`${field}[${i}]`, 'only text parts are supported by this model');
        // (An earlier answer's part sent back carries its annotations and log probabilities, and the
        // openai client's helpers add `parsed`: taken empty.)
        onlyKeys(part, `${field}[${i}]`, ['type', 'text'], ['annotations', 'logprobs', 'parsed']);
        return part.text;
      })
      .join('');
  }
  throw new ContractError(field, 'expected a string or an array of text parts');
}

/**
 * Fields an answer carries that a client sends back in the history as it got them (the openai
 * client's messages have `refusal` and `parsed`; others add `annotations`, `reasoning_content`):
 * taken only empty, since the model would never see them.
 */
const ANSWER_ONLY_FIELDS = ['refusal', 'function_call', 'audio', 'parsed', 'annotations', 'reasoning_content'] as const;

/** The fields of a chat message this node reads; any other is refused (it would be ignored). */
const MESSAGE_FIELDS = new Set(['role', 'content', 'name', 'tool_calls', 'tool_call_id', ...ANSWER_ONLY_FIELDS]);

/**
 * One chat message. `name`, `tool_call_id` and an assistant turn's `tool_calls` reach the model's
 * chat template as sent (as a serving runtime passes them): the template decides how they read.
 */
function message(m: unknown, at: string, fields: ReadonlySet<string> = MESSAGE_FIELDS): ChatMessage {
  const o = object(m, at);
  for (const k of Object.keys(o)) if (!fields.has(k)) throw new ContractError(`${at}.${k.slice(0, 64)}`, 'not a field of a chat message (it would be ignored)');
  if (!ROLES.includes(o.role as ChatMessage['role'])) throw new ContractError(`${at}.role`, `expected one of ${ROLES.join(', ')}`);
  const out: ChatMessage = { role: o.role as ChatMessage['role'], content: content(o.content, `${at}.content`) };
  if (set(o.name)) {
    if (typeof o.name !== 'string' || o.name.length === 0 || o.name.length > 256) throw new ContractError(`${at}.name`, 'expected a name of 1 to 256 characters');
    out.name = o.name;
  }
  if (set(o.tool_call_id)) {
    if (typeof o.tool_call_id !== 'string' || o.tool_call_id.length === 0 || o.tool_call_id.length > 256) throw new ContractError(`${at}.tool_call_id`, 'expected an id of 1 to 256 characters');
    out.tool_call_id = o.tool_call_id;
  }
  if (set(o.tool_calls) && !(Array.isArray(o.tool_calls) && o.tool_calls.length === 0)) {
    if (o.role !== 'assistant') throw new ContractError(`${at}.tool_calls`, 'only an assistant message calls tools');
    out.tool_calls = toolCalls(o.tool_calls, `${at}.tool_calls`);
  }
  // An answer's own fields, as a client sends an earlier answer back: only their empty values.
  for (const k of ANSWER_ONLY_FIELDS) {
    const v = o[k];
    if (set(v) && v !== '' && !(Array.isArray(v) && v.length === 0)) throw new ContractError(`${at}.${k}`, 'not supported by this model (only null or empty)');
  }
  return out;
}

/** An assistant turn's tool calls, in the chat API's shape: `{id, type: "function", function: {name, arguments}}`. */
function toolCalls(v: unknown, field: string): ToolCall[] {
  if (!Array.isArray(v) || v.length > 128) throw new ContractError(field, 'expected an array of up to 128 tool calls');
  return v.map((c, i) => {
    const o = object(c, `${field}[${i}]`);
    onlyKeys(o, `${field}[${i}]`, ['id', 'type', 'function']);
    const f = object(o.function, `${field}[${i}].function`);
    onlyKeys(f, `${field}[${i}].function`, ['name', 'arguments']);
    if (typeof o.id !== 'string' || o.id.length === 0 || o.id.length > 256) throw new ContractError(`${field}[${i}].id`, 'expected an id of 1 to 256 characters');
    if (o.type !== 'function') throw new ContractError(`${field}[${i}].type`, 'expected "function"');
    if (typeof f.name !== 'string' || f.name.length === 0 || f.name.length > 256) throw new ContractError(`${field}[${i}].function.name`, 'expected a name of 1 to 256 characters');
    if (typeof f.arguments !== 'string') throw new ContractError(`${field}[${i}].function.arguments`, 'expected a string (JSON text)');
    return { id: o.id, type: 'function', function: { name: f.name, arguments: f.arguments } };
  });
}

function messages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw new ContractError('messages', 'expected a non-empty array');
  return v.map((m, i) => message(m, `messages[${i}]`));
}

/** The fields of a Responses input message (besides type, id and status). */
const INPUT_MESSAGE_FIELDS = new Set(['role', 'content']);

/** Responses API input: a string (one user message) or a list of messages; instructions lead as system. */
function responsesInput(o: Obj): ChatMessage[] {
  const out: ChatMessage[] = [];
  if (o.instructions !== undefined && o.instructions !== null) {
    if (typeof o.instructions !== 'string') throw new ContractError('instructions', 'expected a string');
    out.push({ role: 'system', content: o.instructions });
  }
  if (typeof o.input === 'string') out.push({ role: 'user', content: o.input });
  else if (Array.isArray(o.input) && o.input.length > 0) {
    o.input.forEach((m, i) => {
      const item = object(m, `input[${i}]`);
      if (item.type !== undefined && item.type !== 'message') throw new ContractError(`input[${i}].type`, 'only message items are supported by this model');
      // (`id` and `status`: an earlier output item sent back as it came.)
      const { type: _type, id: _id, status: _status, ...msg } = item;
      out.push(message(msg, `input[${i}]`, INPUT_MESSAGE_FIELDS));
    });
  } else throw new ContractError('input', 'expected a string or a non-empty array of messages');
  return out;
}

// Every field each endpoint's contract has. A field outside its endpoint's list is refused (400
// naming it), as the OpenAI API refuses an unrecognised argument: a buyer never pays for an answer
// that quietly ignored part of the request. A field in the list is either acted on, refused unless
// at its default (unsupported() below), or one that cannot change the answer (user, metadata, store…).
const SAMPLING_FIELDS = ['temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'seed', 'stop', 'logit_bias', 'frequency_penalty', 'presence_penalty'];
const ACCOUNTING_FIELDS = ['user', 'metadata', 'store', 'service_tier', 'prompt_cache_key', 'safety_identifier'];
const CHAT_FIELDS = new Set(['model', 'messages', 'stream', 'stream_options', 'max_tokens', 'max_completion_tokens', 'n', 'logprobs', 'top_logprobs', 'tools', 'functions', 'tool_choice', 'function_call', 'parallel_tool_calls', 'response_format', 'modalities', 'audio', 'prediction', 'reasoning_effort', 'web_search_options', 'verbosity', ...SAMPLING_FIELDS, ...ACCOUNTING_FIELDS]);
const COMPLETION_FIELDS = new Set(['model', 'prompt', 'stream', 'stream_options', 'max_tokens', 'n', 'best_of', 'logprobs', 'echo', 'suffix', ...SAMPLING_FIELDS, ...ACCOUNTING_FIELDS]);
const RESPONSE_FIELDS = new Set(['model', 'input', 'instructions', 'stream', 'stream_options', 'max_output_tokens', 'top_logprobs', 'text', 'tools', 'tool_choice', 'parallel_tool_calls', 'max_tool_calls', 'previous_response_id', 'conversation', 'prompt', 'reasoning', 'background', 'include', 'truncation', ...SAMPLING_FIELDS, ...ACCOUNTING_FIELDS]);
const EMBEDDING_FIELDS = new Set(['model', 'input', 'encoding_format', 'dimensions', 'user']);
const COUNT_FIELDS = ['return_tokens'];

/** Every field each paid endpoint takes (src/serve/request-contract.ts writes them down for buyers). */
export const ENDPOINT_FIELDS: Readonly<Record<PaidEndpoint, ReadonlySet<string>>> = {
  'chat/completions': CHAT_FIELDS,
  completions: COMPLETION_FIELDS,
  responses: RESPONSE_FIELDS,
  embeddings: EMBEDDING_FIELDS,
};

/** Other runtimes' names for fields this contract has: named in the refusal. */
const OTHER_NAMES: Record<string, readonly string[]> = {
  repeat_penalty: ['repetition_penalty'],
  n_predict: ['max_tokens', 'max_output_tokens'],
  max_new_tokens: ['max_tokens', 'max_output_tokens'],
  stop_sequences: ['stop'],
  random_seed: ['seed'],
};

function knownFields(o: Obj, fields: ReadonlySet<string>, extra: readonly string[] = []): void {
  const unknown = Object.keys(o).filter((k) => !fields.has(k) && !extra.includes(k));
  if (unknown.length === 0) return;
  const k = unknown[0]!;
  const ours = Object.hasOwn(OTHER_NAMES, k) ? OTHER_NAMES[k]!.find((f) => fields.has(f)) : undefined; // (the endpoint's own name for it)
  const hint = ours !== undefined ? ` (send ${ours})` : '';
  const more = unknown.length > 1 ? `; so are ${unknown.slice(1, 6).map((u) => JSON.stringify(u.slice(0, 64))).join(', ')}${unknown.length > 6 ? ', …' : ''}` : '';
  throw new ContractError(k.slice(0, 64), `not a field of this endpoint's request contract (it would be ignored)${hint}${more}`);
}

/** Whether an optional field was given (JSON null counts as not given, as the OpenAI API reads it). */
const set = (v: unknown): boolean => v !== undefined && v !== null;

/**
 * OpenAI features this node does not implement: set to anything but their default, they are refused
 * (400) rather than quietly ignored, so a buyer never pays for an answer that is not what was asked.
 */
function unsupported(o: Obj): void {
  if (set(o.n) && o.n !== 1) throw new ContractError('n', 'only one choice (n = 1) is supported');
  if (set(o.best_of) && o.best_of !== 1) throw new ContractError('best_of', 'only best_of = 1 is supported');
  if (set(o.logprobs) && o.logprobs !== false) throw new ContractError('logprobs', 'log probabilities are not supported');
  if (set(o.top_logprobs) && o.top_logprobs !== 0) throw new ContractError('top_logprobs', 'log probabilities are not supported');
  if (optBool(o.echo, 'echo') === true) throw new ContractError('echo', 'echoing the prompt is not supported');
  if (set(o.suffix) && o.suffix !== '') throw new ContractError('suffix', 'suffixes (insertion) are not supported');
  for (const k of ['tools', 'functions'] as const) {
    if (set(o[k]) && !(Array.isArray(o[k]) && o[k].length === 0)) throw new ContractError(k, 'tool calling is not supported by this model');
  }
  if (set(o.response_format)) {
    const rf = object(o.response_format, 'response_format');
    if (rf.type !== 'text') throw new ContractError('response_format.type', 'only "text" is supported');
    onlyKeys(rf, 'response_format', ['type']);
  }
  if (set(o.logit_bias) && !(typeof o.logit_bias === 'object' && !Array.isArray(o.logit_bias) && Object.keys(o.logit_bias as Obj).length === 0)) {
    throw new ContractError('logit_bias', 'token biases are not supported');
  }
  for (const k of ['frequency_penalty', 'presence_penalty'] as const) {
    if (set(o[k]) && o[k] !== 0) throw new ContractError(k, 'repetition penalties are not supported (only 0)');
  }
  for (const k of ['tool_choice', 'function_call'] as const) {
    if (set(o[k]) && o[k] !== 'none' && o[k] !== 'auto') throw new ContractError(k, 'tool calling is not supported by this model (only "none" or "auto")');
  }
  if (set(o.modalities) && !(Array.isArray(o.modalities) && o.modalities.length === 1 && o.modalities[0] === 'text')) throw new ContractError('modalities', 'only ["text"] is supported');
  for (const k of ['audio', 'prediction', 'reasoning_effort', 'web_search_options'] as const) {
    if (set(o[k])) throw new ContractError(k, 'not supported by this model');
  }
  if (set(o.verbosity) && o.verbosity !== 'medium') throw new ContractError('verbosity', 'only "medium" (the default) is supported');
  if (set(o.service_tier) && o.service_tier !== 'auto' && o.service_tier !== 'default') throw new ContractError('service_tier', 'only "auto" or "default" is offered');
  // Fields that cannot change the answer: only their shape is checked.
  optBool(o.store, 'store');
  optBool(o.parallel_tool_calls, 'parallel_tool_calls');
  for (const k of ['user', 'prompt_cache_key', 'safety_identifier'] as const) {
    if (set(o[k]) && typeof o[k] !== 'string') throw new ContractError(k, 'expected a string');
  }
  if (set(o.metadata)) object(o.metadata, 'metadata');
}

/** The Responses API's own features this node does not implement (it is stateless and text only). */
function unsupportedResponses(o: Obj): void {
  if (set(o.text)) {
    const text = object(o.text, 'text');
    for (const k of Object.keys(text)) if (k !== 'format' && k !== 'verbosity') throw new ContractError(`text.${k.slice(0, 64)}`, 'not a field of the text options (it would be ignored)');
    if (set(text.format)) {
      const format = object(text.format, 'text.format');
      if (format.type !== 'text') throw new ContractError('text.format.type', 'only "text" is supported');
      onlyKeys(format, 'text.format', ['type']);
    }
    if (set(text.verbosity) && text.verbosity !== 'medium') throw new ContractError('text.verbosity', 'only "medium" (the default) is supported');
  }
  optInt(o.max_tool_calls, 'max_tool_calls', 0, 1 << 20); // (no tools run here: it limits nothing)
  for (const k of ['previous_response_id', 'conversation', 'prompt', 'reasoning'] as const) {
    if (set(o[k])) throw new ContractError(k, 'not supported by this node (it keeps no conversations, prompts or reasoning)');
  }
  if (optBool(o.background, 'background') === true) throw new ContractError('background', 'background responses are not supported: the answer comes on this request');
  if (set(o.include) && !(Array.isArray(o.include) && o.include.length === 0)) throw new ContractError('include', 'no extra output items are supported');
  if (set(o.truncation) && o.truncation !== 'disabled') throw new ContractError('truncation', 'only "disabled" is supported: an input the context cannot hold is refused');
}

/** The output token cap: the endpoint's field for it, or (chat) either of its two names, never both. */
function maxTokens(o: Obj, names: readonly string[]): number | undefined {
  const given = names.filter((k) => set(o[k]));
  if (given.length > 1) throw new ContractError(given[1]!, `give only one of ${given.join(' and ')}`);
  const name = given[0];
  return name === undefined ? undefined : optInt(o[name], name, 1, 1 << 24);
}

/** The largest seed: 2^32 − 1 asks llama.cpp for a random one, which no replay could reproduce. */
export const MAX_SEED = 2 ** 32 - 2;

function generation(o: Obj, maxNames: readonly string[]): GenerationParams {
  unsupported(o);
  const stream = optBool(o.stream, 'stream') ?? false;
  if (set(o.stream_options) && !stream) throw new ContractError('stream_options', 'only allowed with stream: true');
  const so = set(o.stream_options) ? object(o.stream_options, 'stream_options') : {};
  for (const k of Object.keys(so)) if (k !== 'include_usage' && k !== 'include_obfuscation') throw new ContractError(`stream_options.${k.slice(0, 64)}`, 'not a stream option (it would be ignored)');
  if (optBool(so.include_obfuscation, 'stream_options.include_obfuscation') === true) throw new ContractError('stream_options.include_obfuscation', 'obfuscation padding is not supported (only false)');
  const includeUsage = optBool(so.include_usage, 'stream_options.include_usage') ?? false;
  let stop: string[] = [];
  if (typeof o.stop === 'string') {
    if (o.stop.length === 0) throw new ContractError('stop', 'expected a non-empty string');
    stop = [o.stop];
  } else if (Array.isArray(o.stop)) {
    if (o.stop.length > 4 || !o.stop.every((s) => typeof s === 'string' && s.length > 0)) throw new ContractError('stop', 'expected up to 4 non-empty strings');
    stop = o.stop as string[];
  } else if (o.stop !== undefined && o.stop !== null) throw new ContractError('stop', 'expected a string or an array of strings');
  const penalty = optNumber(o.repetition_penalty, 'repetition_penalty', 0, 100);
  if (penalty === 0) throw new ContractError('repetition_penalty', 'expected a number above 0 (1 turns it off)');
  const temperature = optNumber(o.temperature, 'temperature', 0, 2) ?? 1;
  // The embedded runtime takes the likeliest token at temperature 0 without its penalties.
  if (penalty !== undefined && penalty !== 1 && temperature === 0) throw new ContractError('repetition_penalty', 'applies only when sampling (temperature above 0) on this runtime');
  const topK = optInt(o.top_k, 'top_k', -1, 1 << 24);
  return {
    maxTokens: maxTokens(o, maxNames),
    stream,
    includeUsage,
    temperature,
    topP: optNumber(o.top_p, 'top_p', 0, 1),
    topK: topK === -1 ? 0 : topK, // (-1, as vLLM spells "off")
    minP: optNumber(o.min_p, 'min_p', 0, 1),
    repetitionPenalty: penalty,
    seed: optInt(o.seed, 'seed', 0, MAX_SEED),
    stop,
  };
}

/** Parses a body for an endpoint. Throws ContractError naming the field. */
export function parseRequest(endpoint: string, body: Uint8Array): ParsedRequest {
  if (!TEXT_ENDPOINTS.includes(endpoint as TextEndpoint)) throw new ContractError('', `unknown endpoint "${endpoint.slice(0, 64)}"`);
  if (body.length > MAX_REQUEST_BODY) throw new ContractError('', `body larger than ${MAX_REQUEST_BODY} bytes`);
  if (nestsDeeperThan(body)) throw new ContractError('', `body nests objects and arrays more than ${MAX_JSON_DEPTH} deep`);
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body));
  } catch {
    throw new ContractError('', 'body is not UTF-8 JSON');
  }
  return parseRequestValue(endpoint, value);
}

/**
 * The same, for a body already parsed from JSON (an estimate's `body` member): checked as it was
 * sent, not as a re-serialisation would have it (1e400 is Infinity here and refused, where
 * JSON.stringify would make it null, "not given": s23 h6).
 */
export function parseRequestValue(endpoint: string, value: unknown): ParsedRequest {
  if (!TEXT_ENDPOINTS.includes(endpoint as TextEndpoint)) throw new ContractError('', `unknown endpoint "${endpoint.slice(0, 64)}"`);
  const o = object(value, '');
  if (typeof o.model !== 'string' || o.model.length === 0 || o.model.length > 256) throw new ContractError('model', 'expected a model id');
  const model = o.model;
  switch (endpoint as TextEndpoint) {
    case 'chat/completions':
      return chat(o, model);
    case 'completions':
      return completion(o, model);
    case 'responses':
      knownFields(o, RESPONSE_FIELDS);
      unsupportedResponses(o);
      return { endpoint: 'responses', model, messages: responsesInput(o), ...generation(o, ['max_output_tokens']) };
    case 'embeddings': {
      knownFields(o, EMBEDDING_FIELDS);
      if (set(o.user) && typeof o.user !== 'string') throw new ContractError('user', 'expected a string');
      const input = typeof o.input === 'string' ? [o.input] : o.input;
      if (!Array.isArray(input) || input.length === 0 || input.length > 2048 || !input.every((s) => typeof s === 'string')) {
        throw new ContractError('input', 'expected a string or a non-empty array of strings');
      }
      // (as OpenAI's API: an empty text has no meaning to embed; llama.cpp would embed its BOS alone, billed)
      const empty = (input as string[]).findIndex((s) => s.length === 0);
      if (empty >= 0) throw new ContractError(typeof o.input === 'string' ? 'input' : `input[${empty}]`, 'expected a non-empty string');
      const encoding = o.encoding_format ?? 'float';
      if (encoding !== 'float' && encoding !== 'base64') throw new ContractError('encoding_format', 'expected "float" or "base64"');
      if (o.dimensions !== undefined && o.dimensions !== null) throw new ContractError('dimensions', "reducing the dimensions is not supported: embeddings have the model's own");
      return { endpoint: 'embeddings', model, input: input as string[], encoding };
    }
    case 'tokenize':
    case 'count_tokens': {
      // The body of the request to count (chat's or completions'), checked as that request would
      // be: a count is never given for a body the endpoint would refuse.
      const hasMessages = set(o.messages);
      const hasPrompt = set(o.prompt);
      if (hasMessages === hasPrompt) throw new ContractError(hasMessages ? 'prompt' : 'messages', 'give exactly one of messages or prompt');
      const returnTokens = optBool(o.return_tokens, 'return_tokens') ?? false;
      return hasMessages
        ? { endpoint: endpoint as 'tokenize', model, messages: chat(o, model, [...COUNT_FIELDS, 'prompt']).messages, returnTokens }
        : { endpoint: endpoint as 'tokenize', model, prompt: completion(o, model, [...COUNT_FIELDS, 'messages']).prompt, returnTokens };
    }
  }
}

function chat(o: Obj, model: string, extra: readonly string[] = []): ParsedRequest & { endpoint: 'chat/completions' } {
  knownFields(o, CHAT_FIELDS, extra);
  return { endpoint: 'chat/completions', model, messages: messages(o.messages), ...generation(o, ['max_tokens', 'max_completion_tokens']) };
}

function completion(o: Obj, model: string, extra: readonly string[] = []): ParsedRequest & { endpoint: 'completions' } {
  knownFields(o, COMPLETION_FIELDS, extra);
  if (typeof o.prompt !== 'string') throw new ContractError('prompt', 'expected a string');
  return { endpoint: 'completions', model, prompt: o.prompt, ...generation(o, ['max_tokens']) };
}
