// The request contracts of the text endpoints (marketplace-api.md): parse the exact body bytes,
// check every field the node acts on, and refuse anything else with 400 naming the field.
// Nothing is charged for a request refused here.
import type { ChatMessage } from '../../adapters/runtime-adapter.ts';

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
        return part.text;
      })
      .join('');
  }
  throw new ContractError(field, 'expected a string or an array of text parts');
}

function messages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw new ContractError('messages', 'expected a non-empty array');
  return v.map((m, i) => {
    const o = object(m, `messages[${i}]`);
    if (!ROLES.includes(o.role as ChatMessage['role'])) throw new ContractError(`messages[${i}].role`, `expected one of ${ROLES.join(', ')}`);
    return { role: o.role as ChatMessage['role'], content: content(o.content, `messages[${i}].content`) };
  });
}

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
      if (!ROLES.includes(item.role as ChatMessage['role'])) throw new ContractError(`input[${i}].role`, `expected one of ${ROLES.join(', ')}`);
      out.push({ role: item.role as ChatMessage['role'], content: content(item.content, `input[${i}].content`) });
    });
  } else throw new ContractError('input', 'expected a string or a non-empty array of messages');
  return out;
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
  if (o.echo === true) throw new ContractError('echo', 'echoing the prompt is not supported');
  if (set(o.suffix) && o.suffix !== '') throw new ContractError('suffix', 'suffixes (insertion) are not supported');
  for (const k of ['tools', 'functions'] as const) {
    if (set(o[k]) && !(Array.isArray(o[k]) && o[k].length === 0)) throw new ContractError(k, 'tool calling is not supported by this model');
  }
  if (set(o.response_format)) {
    const rf = object(o.response_format, 'response_format');
    if (rf.type !== 'text') throw new ContractError('response_format.type', 'only "text" is supported');
  }
  if (set(o.logit_bias) && !(typeof o.logit_bias === 'object' && !Array.isArray(o.logit_bias) && Object.keys(o.logit_bias as Obj).length === 0)) {
    throw new ContractError('logit_bias', 'token biases are not supported');
  }
  for (const k of ['frequency_penalty', 'presence_penalty'] as const) {
    if (set(o[k]) && o[k] !== 0) throw new ContractError(k, 'repetition penalties are not supported (only 0)');
  }
  if (set(o.tool_choice) && o.tool_choice !== 'none' && o.tool_choice !== 'auto') throw new ContractError('tool_choice', 'tool calling is not supported by this model (only "none" or "auto")');
  if (set(o.modalities) && !(Array.isArray(o.modalities) && o.modalities.length === 1 && o.modalities[0] === 'text')) throw new ContractError('modalities', 'only ["text"] is supported');
  for (const k of ['audio', 'prediction', 'reasoning_effort'] as const) {
    if (set(o[k])) throw new ContractError(k, 'not supported by this model');
  }
}

/** The Responses API's own features this node does not implement (it is stateless and text only). */
function unsupportedResponses(o: Obj): void {
  if (set(o.text)) {
    const text = object(o.text, 'text');
    if (set(text.format) && object(text.format, 'text.format').type !== 'text') throw new ContractError('text.format.type', 'only "text" is supported');
  }
  for (const k of ['previous_response_id', 'conversation', 'prompt', 'reasoning'] as const) {
    if (set(o[k])) throw new ContractError(k, 'not supported by this node (it keeps no conversations, prompts or reasoning)');
  }
  if (o.background === true) throw new ContractError('background', 'background responses are not supported: the answer comes on this request');
  if (set(o.include) && !(Array.isArray(o.include) && o.include.length === 0)) throw new ContractError('include', 'no extra output items are supported');
  if (set(o.truncation) && o.truncation !== 'disabled') throw new ContractError('truncation', 'only "disabled" is supported: an input the context cannot hold is refused');
}

function generation(o: Obj): GenerationParams {
  unsupported(o);
  const so = o.stream_options === undefined || o.stream_options === null ? {} : object(o.stream_options, 'stream_options');
  const stream = optBool(o.stream, 'stream') ?? false;
  const includeUsage = optBool(so.include_usage, 'stream_options.include_usage') ?? false;
  let stop: string[] = [];
  if (typeof o.stop === 'string') {
    if (o.stop.length === 0) throw new ContractError('stop', 'expected a non-empty string');
    stop = [o.stop];
  } else if (Array.isArray(o.stop)) {
    if (o.stop.length > 4 || !o.stop.every((s) => typeof s === 'string' && s.length > 0)) throw new ContractError('stop', 'expected up to 4 non-empty strings');
    stop = o.stop as string[];
  } else if (o.stop !== undefined && o.stop !== null) throw new ContractError('stop', 'expected a string or an array of strings');
  const maxField = o.max_tokens !== undefined ? 'max_tokens' : o.max_output_tokens !== undefined ? 'max_output_tokens' : 'max_completion_tokens';
  return {
    maxTokens: optInt(o.max_tokens ?? o.max_output_tokens ?? o.max_completion_tokens, maxField, 1, 1 << 24),
    stream,
    includeUsage,
    temperature: optNumber(o.temperature, 'temperature', 0, 2) ?? 1,
    topP: optNumber(o.top_p, 'top_p', 0, 1),
    seed: optInt(o.seed, 'seed', -(2 ** 31), 2 ** 32 - 1),
    stop,
  };
}

/** Parses a body for an endpoint. Throws ContractError naming the field. */
export function parseRequest(endpoint: string, body: Uint8Array): ParsedRequest {
  if (!TEXT_ENDPOINTS.includes(endpoint as TextEndpoint)) throw new ContractError('', `unknown endpoint "${endpoint.slice(0, 64)}"`);
  if (body.length > MAX_REQUEST_BODY) throw new ContractError('', `body larger than ${MAX_REQUEST_BODY} bytes`);
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body));
  } catch {
    throw new ContractError('', 'body is not UTF-8 JSON');
  }
  const o = object(value, '');
  if (typeof o.model !== 'string' || o.model.length === 0 || o.model.length > 256) throw new ContractError('model', 'expected a model id');
  const model = o.model;
  switch (endpoint as TextEndpoint) {
    case 'chat/completions':
      return { endpoint: 'chat/completions', model, messages: messages(o.messages), ...generation(o) };
    case 'completions':
      if (typeof o.prompt !== 'string') throw new ContractError('prompt', 'expected a string');
      return { endpoint: 'completions', model, prompt: o.prompt, ...generation(o) };
    case 'responses':
      unsupportedResponses(o);
      return { endpoint: 'responses', model, messages: responsesInput(o), ...generation(o) };
    case 'embeddings': {
      const input = typeof o.input === 'string' ? [o.input] : o.input;
      if (!Array.isArray(input) || input.length === 0 || input.length > 2048 || !input.every((s) => typeof s === 'string')) {
        throw new ContractError('input', 'expected a string or a non-empty array of strings');
      }
      const encoding = o.encoding_format ?? 'float';
      if (encoding !== 'float' && encoding !== 'base64') throw new ContractError('encoding_format', 'expected "float" or "base64"');
      if (o.dimensions !== undefined && o.dimensions !== null) throw new ContractError('dimensions', "reducing the dimensions is not supported: embeddings have the model's own");
      return { endpoint: 'embeddings', model, input: input as string[], encoding };
    }
    case 'tokenize':
    case 'count_tokens': {
      const hasMessages = o.messages !== undefined;
      const hasPrompt = o.prompt !== undefined;
      if (hasMessages === hasPrompt) throw new ContractError(hasMessages ? 'prompt' : 'messages', 'give exactly one of messages or prompt');
      if (hasPrompt && typeof o.prompt !== 'string') throw new ContractError('prompt', 'expected a string');
      const returnTokens = optBool(o.return_tokens, 'return_tokens') ?? false;
      return hasMessages
        ? { endpoint: endpoint as 'tokenize', model, messages: messages(o.messages), returnTokens }
        : { endpoint: endpoint as 'tokenize', model, prompt: o.prompt as string, returnTokens };
    }
  }
}
