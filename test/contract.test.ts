import { describe, expect, test } from 'vitest';
import { ContractError, parseRequest } from '../src/serve/contract.ts';

const enc = (v: unknown) => new TextEncoder().encode(typeof v === 'string' ? v : JSON.stringify(v));
const field = (endpoint: string, body: unknown) => {
  try {
    parseRequest(endpoint, enc(body));
    return 'ok';
  } catch (e) {
    expect(e).toBeInstanceOf(ContractError);
    return (e as ContractError).field;
  }
};

describe('request contracts', () => {
  test('chat: defaults and fields the node acts on', () => {
    expect(parseRequest('chat/completions', enc({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }))).toEqual({
      endpoint: 'chat/completions', model: 'm', messages: [{ role: 'user', content: 'hi' }],
      maxTokens: undefined, stream: false, includeUsage: false, temperature: 1, topP: undefined, seed: undefined, stop: [],
    });
    const r = parseRequest('chat/completions', enc({ model: 'm', messages: [{ role: 'system', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }], max_tokens: 5, stream: true, stream_options: { include_usage: true }, temperature: 0, seed: 7, stop: 'x' }));
    expect(r).toMatchObject({ messages: [{ role: 'system', content: 'ab' }], maxTokens: 5, stream: true, includeUsage: true, temperature: 0, seed: 7, stop: ['x'] });
  });
  test('a null content is a turn without text (present, as the spec requires)', () => {
    const r = parseRequest('chat/completions', enc({ model: 'm', messages: [{ role: 'user', content: 'a' }, { role: 'assistant', content: null }, { role: 'user', content: 'b' }] }));
    expect(r).toMatchObject({ messages: [{ role: 'user', content: 'a' }, { role: 'assistant', content: '' }, { role: 'user', content: 'b' }] });
  });
  test.each([
    ['chat/completions', '{', ''],
    ['chat/completions', [], ''],
    ['chat/completions', { messages: [] }, 'model'],
    ['chat/completions', { model: 'm' }, 'messages'],
    ['chat/completions', { model: 'm', messages: [{ role: 'boss', content: 'x' }] }, 'messages[0].role'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 5 }] }, 'messages[0].content'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user' }] }, 'messages[0].content'],
    ['responses', { model: 'm', input: [{ role: 'user' }] }, 'input[0].content'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: [{ type: 'image_url' }] }] }, 'messages[0].content[0]'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens: 0 }, 'max_tokens'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens: 1.5 }, 'max_tokens'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }], stream: 'yes' }, 'stream'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }], stream: true, stream_options: { include_usage: 1 } }, 'stream_options.include_usage'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }], temperature: 3 }, 'temperature'],
    ['chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }], stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
    ['completions', { model: 'm' }, 'prompt'],
    ['embeddings', { model: 'm', input: [1] }, 'input'],
    ['embeddings', { model: 'm', input: '' }, 'input'],
    ['embeddings', { model: 'm', input: ['hi', ''] }, 'input[1]'],
    ['tokenize', { model: 'm' }, 'messages'],
    ['tokenize', { model: 'm', prompt: 'a', messages: [] }, 'prompt'],
    ['nope', { model: 'm' }, ''],
  ])('%s %j is refused naming "%s"', (endpoint, body, f) => {
    expect(field(endpoint, body)).toBe(f);
  });
  test('features the node does not implement are refused naming them, never ignored; their defaults are accepted', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    const refused: [string, object, string][] = [
      ['chat/completions', { ...chat, n: 2 }, 'n'],
      ['chat/completions', { ...chat, logprobs: true }, 'logprobs'],
      ['chat/completions', { ...chat, top_logprobs: 3 }, 'top_logprobs'],
      ['chat/completions', { ...chat, tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools'],
      ['chat/completions', { ...chat, functions: [{ name: 'f' }] }, 'functions'],
      ['chat/completions', { ...chat, response_format: { type: 'json_object' } }, 'response_format.type'],
      ['chat/completions', { ...chat, response_format: 'json' }, 'response_format'],
      ['completions', { model: 'm', prompt: 'p', best_of: 3 }, 'best_of'],
      ['completions', { model: 'm', prompt: 'p', logprobs: 2 }, 'logprobs'],
      ['completions', { model: 'm', prompt: 'p', echo: true }, 'echo'],
      ['completions', { model: 'm', prompt: 'p', suffix: 'end' }, 'suffix'],
      ['responses', { model: 'm', input: 'x', tools: [{ type: 'web_search' }] }, 'tools'],
      // Sampling controls this node does not apply: refused, not ignored and billed.
      ['chat/completions', { ...chat, logit_bias: { '42': -100 } }, 'logit_bias'],
      ['chat/completions', { ...chat, frequency_penalty: 2 }, 'frequency_penalty'],
      ['completions', { model: 'm', prompt: 'p', presence_penalty: -0.5 }, 'presence_penalty'],
      ['chat/completions', { ...chat, tool_choice: 'required' }, 'tool_choice'],
      ['chat/completions', { ...chat, tool_choice: { type: 'function', function: { name: 'f' } } }, 'tool_choice'],
      ['chat/completions', { ...chat, modalities: ['text', 'audio'] }, 'modalities'],
      ['chat/completions', { ...chat, audio: { voice: 'alloy', format: 'wav' } }, 'audio'],
      ['chat/completions', { ...chat, prediction: { type: 'content', content: 'x' } }, 'prediction'],
      ['chat/completions', { ...chat, reasoning_effort: 'low' }, 'reasoning_effort'],
      ['chat/completions', { ...chat, stop: '' }, 'stop'],
      // The Responses API's stateful and structured features.
      ['responses', { model: 'm', input: 'x', text: { format: { type: 'json_object' } } }, 'text.format.type'],
      ['responses', { model: 'm', input: 'x', previous_response_id: 'resp_1' }, 'previous_response_id'],
      ['responses', { model: 'm', input: 'x', conversation: 'conv_1' }, 'conversation'],
      ['responses', { model: 'm', input: 'x', reasoning: { effort: 'low' } }, 'reasoning'],
      ['responses', { model: 'm', input: 'x', background: true }, 'background'],
      ['responses', { model: 'm', input: 'x', background: 'true' }, 'background'],
      ['responses', { model: 'm', input: 'x', background: 1 }, 'background'],
      ['responses', { model: 'm', input: 'x', include: ['message.output_text.logprobs'] }, 'include'],
      ['responses', { model: 'm', input: 'x', truncation: 'auto' }, 'truncation'],
      ['embeddings', { model: 'm', input: 'x', encoding_format: 'int8' }, 'encoding_format'],
      ['embeddings', { model: 'm', input: 'x', dimensions: 4 }, 'dimensions'],
    ];
    for (const [endpoint, body, f] of refused) expect(field(endpoint, body), JSON.stringify(body)).toBe(f);
    const accepted: [string, object][] = [
      ['chat/completions', { ...chat, n: 1, logprobs: false, tools: [], response_format: { type: 'text' }, top_logprobs: null }],
      ['completions', { model: 'm', prompt: 'p', best_of: 1, echo: false, suffix: '', logprobs: null, n: null }],
      ['chat/completions', { ...chat, logit_bias: {}, frequency_penalty: 0, presence_penalty: 0, tool_choice: 'none', modalities: ['text'], parallel_tool_calls: true, user: 'u', metadata: { a: 'b' } }],
      ['chat/completions', { ...chat, tool_choice: 'auto', logit_bias: null, audio: null }],
      ['responses', { model: 'm', input: 'x', text: { format: { type: 'text' } }, background: false, include: [], truncation: 'disabled', store: false, previous_response_id: null }],
      ['embeddings', { model: 'm', input: 'x', encoding_format: 'float', dimensions: null }],
    ];
    for (const [endpoint, body] of accepted) expect(field(endpoint, body), JSON.stringify(body)).toBe('ok');
  });
  test('embeddings: encoding_format "float" (the default) or "base64"', () => {
    expect(parseRequest('embeddings', enc({ model: 'm', input: 'x' }))).toEqual({ endpoint: 'embeddings', model: 'm', input: ['x'], encoding: 'float' });
    expect(parseRequest('embeddings', enc({ model: 'm', input: ['x', 'y'], encoding_format: 'base64' }))).toEqual({ endpoint: 'embeddings', model: 'm', input: ['x', 'y'], encoding: 'base64' });
  });
  test('responses: a string input, message inputs with text parts, instructions as system', () => {
    expect(parseRequest('responses', enc({ model: 'm', input: 'hi', max_output_tokens: 9 }))).toMatchObject({ endpoint: 'responses', messages: [{ role: 'user', content: 'hi' }], maxTokens: 9, stream: false });
    const r = parseRequest('responses', enc({ model: 'm', instructions: 'be brief', input: [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'a' }, { type: 'input_text', text: 'b' }] }], stream: true }));
    expect(r).toMatchObject({ messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'ab' }], stream: true });
    expect(field('responses', { model: 'm' })).toBe('input');
    expect(field('responses', { model: 'm', input: [] })).toBe('input');
    expect(field('responses', { model: 'm', input: [{ type: 'function_call' }] })).toBe('input[0].type');
    expect(field('responses', { model: 'm', input: 'x', instructions: 3 })).toBe('instructions');
    expect(field('responses', { model: 'm', input: 'x', max_output_tokens: 0 })).toBe('max_output_tokens');
  });
  test('a key inside an object the node reads, that it would ignore, is refused naming it: structured output, cache hints, extra tool-call keys', () => {
    const chat = (extra: object, content: unknown = 'hi') => ({ model: 'm', messages: [{ role: 'user', content }], ...extra });
    expect(field('chat/completions', chat({ response_format: { type: 'text', json_schema: { name: 'x' }, strict: true } }))).toBe('response_format.json_schema');
    expect(field('responses', { model: 'm', input: 'x', text: { format: { type: 'text', name: 'x', schema: {}, strict: true } } })).toBe('text.format.name');
    expect(field('chat/completions', chat({}, [{ type: 'text', text: 'hi', cache_control: { type: 'ephemeral' } }]))).toBe('messages[0].content[0].cache_control');
    const call = { id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } };
    const withCall = (c: object) => ({ model: 'm', messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null, tool_calls: [c] }] });
    expect(field('chat/completions', withCall(call))).toBe('ok');
    expect(field('chat/completions', withCall({ ...call, extra: 1 }))).toBe('messages[1].tool_calls[0].extra');
    expect(field('chat/completions', withCall({ ...call, function: { ...call.function, strict: true } }))).toBe('messages[1].tool_calls[0].function.strict');
    // An earlier answer's output_text part sent back with its empty annotations and log probabilities is taken; filled ones are not.
    const back = (part: object) => ({ model: 'm', input: [{ role: 'assistant', content: [{ type: 'output_text', text: 'a', ...part }] }] });
    expect(field('responses', back({ annotations: [], logprobs: [], parsed: null }))).toBe('ok');
    expect(field('responses', back({ parsed: { a: 1 } }))).toBe('input[0].content[0].parsed');
    expect(field('responses', back({ annotations: [{ type: 'url_citation' }] }))).toBe('input[0].content[0].annotations');
    expect(field('chat/completions', chat({ response_format: { type: 'text' } }))).toBe('ok');
  });

  test('invalid UTF-8 is refused', () => {
    expect(() => parseRequest('completions', Uint8Array.of(0x7b, 0xff, 0x7d))).toThrow(/UTF-8/);
  });

  test('a field outside the endpoint\'s contract is refused naming it, never ignored (as the OpenAI API refuses an unrecognised argument)', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    const refused: [string, object, string][] = [
      ['chat/completions', { ...chat, temprature: 0 }, 'temprature'],
      ['chat/completions', { ...chat, mirostat: 2 }, 'mirostat'],
      ['chat/completions', { ...chat, max_output_tokens: 5 }, 'max_output_tokens'],
      ['completions', { model: 'm', prompt: 'p', messages: [] }, 'messages'],
      ['completions', { model: 'm', prompt: 'p', max_completion_tokens: 3 }, 'max_completion_tokens'],
      ['responses', { model: 'm', input: 'x', max_tokens: 5 }, 'max_tokens'],
      ['embeddings', { model: 'm', input: 'x', stream: true }, 'stream'],
      ['tokenize', { model: 'm', prompt: 'p', dimensions: 3 }, 'dimensions'],
      ['chat/completions', { ...chat, messages: [{ role: 'user', content: 'x', weight: 1 }] }, 'messages[0].weight'],
      ['responses', { model: 'm', input: [{ role: 'user', content: 'x', name: 'a' }] }, 'input[0].name'],
      ['responses', { model: 'm', input: 'x', text: { format: { type: 'text' }, schema: {} } }, 'text.schema'],
    ];
    for (const [endpoint, body, f] of refused) expect(field(endpoint, body), JSON.stringify(body)).toBe(f);
  });
  test('OpenAI fields that would change the answer are refused unless at their default; fields that cannot change it are checked for shape', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    const refused: [string, object, string][] = [
      ['chat/completions', { ...chat, service_tier: 'priority' }, 'service_tier'],
      ['chat/completions', { ...chat, web_search_options: {} }, 'web_search_options'],
      ['chat/completions', { ...chat, verbosity: 'low' }, 'verbosity'],
      ['chat/completions', { ...chat, function_call: { name: 'f' } }, 'function_call'],
      ['responses', { model: 'm', input: 'x', text: { verbosity: 'high' } }, 'text.verbosity'],
      ['responses', { model: 'm', input: 'x', max_tool_calls: -1 }, 'max_tool_calls'],
      ['completions', { model: 'm', prompt: 'p', echo: 1 }, 'echo'],
      ['completions', { model: 'm', prompt: 'p', echo: 'true' }, 'echo'],
      ['chat/completions', { ...chat, store: 'yes' }, 'store'],
      ['chat/completions', { ...chat, user: 5 }, 'user'],
      ['chat/completions', { ...chat, metadata: 'm' }, 'metadata'],
      // stream_options without a stream (the OpenAI API refuses it too).
      ['chat/completions', { ...chat, stream_options: { include_usage: true } }, 'stream_options'],
    ];
    for (const [endpoint, body, f] of refused) expect(field(endpoint, body), JSON.stringify(body)).toBe(f);
    const accepted: [string, object][] = [
      ['chat/completions', { ...chat, service_tier: 'auto', verbosity: 'medium', function_call: 'none', store: true, prompt_cache_key: 'k', safety_identifier: 's', web_search_options: null }],
      ['responses', { model: 'm', input: 'x', text: { verbosity: 'medium' }, max_tool_calls: 3, store: true, service_tier: 'default', metadata: {} }],
      ['embeddings', { model: 'm', input: 'x', user: 'u' }],
    ];
    for (const [endpoint, body] of accepted) expect(field(endpoint, body), JSON.stringify(body)).toBe('ok');
  });
  test('the output cap has one name per request: chat takes max_tokens or max_completion_tokens, never both', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    expect(parseRequest('chat/completions', enc({ ...chat, max_completion_tokens: 3 }))).toMatchObject({ maxTokens: 3 });
    expect(parseRequest('chat/completions', enc({ ...chat, max_tokens: null, max_completion_tokens: 3 }))).toMatchObject({ maxTokens: 3 });
    expect(() => parseRequest('chat/completions', enc({ ...chat, max_tokens: 10, max_completion_tokens: 3 }))).toThrow(/max_completion_tokens: give only one of max_tokens and max_completion_tokens/);
  });
  test('seeds: 0 to 2^32 − 2 (2^32 − 1 is llama.cpp\'s "random seed", negative ones all read as 0: neither could be replayed)', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    expect(parseRequest('chat/completions', enc({ ...chat, seed: 0 }))).toMatchObject({ seed: 0 });
    expect(parseRequest('chat/completions', enc({ ...chat, seed: 2 ** 32 - 2 }))).toMatchObject({ seed: 2 ** 32 - 2 });
    for (const seed of [2 ** 32 - 1, -1, -12345, 2 ** 32, 1.5]) expect(field('chat/completions', { ...chat, seed }), String(seed)).toBe('seed');
  });
  test('llama.cpp\'s samplers: top_k (0 or -1 off), min_p, repetition_penalty (1 off)', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    expect(parseRequest('completions', enc({ model: 'm', prompt: 'p', top_k: 1, min_p: 0.05, repetition_penalty: 1.3 }))).toMatchObject({ topK: 1, minP: 0.05, repetitionPenalty: 1.3 });
    expect(parseRequest('chat/completions', enc({ ...chat, top_k: -1 }))).toMatchObject({ topK: 0 });
    for (const [k, v] of [['top_k', -2], ['top_k', 1.5], ['min_p', 1.5], ['repetition_penalty', 0], ['repetition_penalty', -1]] as const) expect(field('chat/completions', { ...chat, [k]: v }), `${k} ${v}`).toBe(k);
    // At temperature 0 the runtime takes the likeliest token without its penalties: refused, not ignored.
    expect(field('chat/completions', { ...chat, temperature: 0, repetition_penalty: 1.3 })).toBe('repetition_penalty');
    expect(field('chat/completions', { ...chat, temperature: 0, repetition_penalty: 1 })).toBe('ok');
  });
  test('message names and a tool-calling history reach the chat template as sent; an answer\'s other fields only as null', () => {
    const history = [
      { role: 'user', name: 'alice', content: 'weather?' },
      { role: 'assistant', content: null, refusal: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'result 42' },
    ];
    expect(parseRequest('chat/completions', enc({ model: 'm', messages: history }))).toMatchObject({
      messages: [
        { role: 'user', name: 'alice', content: 'weather?' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'result 42' },
      ],
    });
    const refused: [object, string][] = [
      [{ role: 'user', content: 'x', name: 7 }, 'messages[0].name'],
      [{ role: 'user', content: 'x', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] }, 'messages[0].tool_calls'],
      [{ role: 'assistant', content: 'x', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: {} } }] }, 'messages[0].tool_calls[0].function.arguments'],
      [{ role: 'assistant', content: 'x', refusal: 'no' }, 'messages[0].refusal'],
      [{ role: 'assistant', content: 'x', function_call: { name: 'f', arguments: '{}' } }, 'messages[0].function_call'],
      [{ role: 'tool', content: 'x', tool_call_id: '' }, 'messages[0].tool_call_id'],
    ];
    for (const [m, f] of refused) expect(field('chat/completions', { model: 'm', messages: [m] }), JSON.stringify(m)).toBe(f);
  });
  test('tokenize and count_tokens check the body they count as its endpoint would: no count for a request that would be refused', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    expect(field('tokenize', { ...chat, tools: [{ type: 'function', function: { name: 'f' } }] })).toBe('tools');
    expect(field('count_tokens', { ...chat, seed: -1 })).toBe('seed');
    expect(field('tokenize', { model: 'm', prompt: 'p', echo: true })).toBe('echo');
    expect(parseRequest('tokenize', enc({ ...chat, max_tokens: 5, temperature: 0, return_tokens: true }))).toMatchObject({ endpoint: 'tokenize', messages: [{ role: 'user', content: 'x' }], returnTokens: true });
    // JSON null is "not given", here as everywhere.
    expect(parseRequest('count_tokens', enc({ model: 'm', messages: null, prompt: 'p' }))).toMatchObject({ prompt: 'p' });
  });

  test('an earlier answer sent back as the client got it (the openai client adds refusal and parsed, others annotations, reasoning_content): taken while those are empty', () => {
    const sdkAnswer = { role: 'assistant', content: 'hello', refusal: null, parsed: null, annotations: [], reasoning_content: '', audio: null, function_call: null, tool_calls: [] };
    expect(parseRequest('chat/completions', enc({ model: 'm', messages: [{ role: 'user', content: 'hi' }, sdkAnswer, { role: 'user', content: 'more' }] }))).toMatchObject({ messages: [{ content: 'hi' }, { role: 'assistant', content: 'hello' }, { content: 'more' }] });
    for (const [k, v] of [['parsed', { a: 1 }], ['annotations', [{ type: 'url_citation' }]], ['reasoning_content', 'because']] as const) {
      expect(field('chat/completions', { model: 'm', messages: [{ ...sdkAnswer, [k]: v }] }), k).toBe(`messages[0].${k}`);
    }
  });
  test('stream options: include_usage, and include_obfuscation only false; any other is refused', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }], stream: true };
    expect(parseRequest('chat/completions', enc({ ...chat, stream_options: { include_usage: true, include_obfuscation: false } }))).toMatchObject({ includeUsage: true });
    expect(field('chat/completions', { ...chat, stream_options: { include_obfuscation: true } })).toBe('stream_options.include_obfuscation');
    expect(field('responses', { model: 'm', input: 'x', stream: true, stream_options: { continuous_usage_stats: true } })).toBe('stream_options.continuous_usage_stats');
  });
  test('an unknown field\'s refusal names the contract\'s field for another runtime\'s name, and the other unknown fields too', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    expect(() => parseRequest('completions', enc({ model: 'm', prompt: 'p', repeat_penalty: 1.1 }))).toThrow(/^repeat_penalty: not a field of this endpoint's request contract \(it would be ignored\) \(send repetition_penalty\)$/);
    expect(() => parseRequest('chat/completions', enc({ ...chat, n_predict: 5, mirostat: 2, typical_p: 0.9 }))).toThrow(/^n_predict: .*\(send max_tokens\); so are "mirostat", "typical_p"$/);
    // The endpoint's own name for it, or none where the endpoint has no such field.
    expect(() => parseRequest('responses', enc({ model: 'm', input: 'x', n_predict: 5 }))).toThrow(/^n_predict: .*\(send max_output_tokens\)$/);
    expect(() => parseRequest('embeddings', enc({ model: 'm', input: 'x', n_predict: 5 }))).toThrow(/^n_predict: not a field of this endpoint's request contract \(it would be ignored\)$/);
  });
});

