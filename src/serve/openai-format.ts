// Response bodies and stream events in the shapes the marketplace API promises (OpenAI-compatible
// plus usage.cost and service.request_id). The receipt itself travels in the trailer frame; the
// gateway adds it to what the buyer sees as service.receipt: the last member of a body's
// `service`, and in a stream of the closing chunk's (the usage chunk, else the finish chunk) or of
// the closing event's `response.service`.
import { concatBytes } from '../../attestation/bytes.ts';

export interface UsageOut {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** USD, six decimals, exact. */
  cost: string;
}

export function usageOut(input: number, output: number, costUsd: string): UsageOut {
  return { prompt_tokens: input, completion_tokens: output, total_tokens: input + output, cost: costUsd };
}

type Finish = 'stop' | 'length' | null;

export function chatCompletion(requestId: string, model: string, created: number, text: string, finish: Finish, usage: UsageOut): object {
  return {
    id: `chatcmpl-${requestId}`,
    object: 'chat.completion',
    created,
    model,
    choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: finish }],
    usage,
    service: { request_id: requestId },
  };
}

export function textCompletion(requestId: string, model: string, created: number, text: string, finish: Finish, usage: UsageOut): object {
  return {
    id: `cmpl-${requestId}`,
    object: 'text_completion',
    created,
    model,
    choices: [{ index: 0, text, logprobs: null, finish_reason: finish }],
    usage,
    service: { request_id: requestId },
  };
}

/** Stream events for chat/completions and completions, as SSE bytes. */
export class CompletionStream {
  private readonly base: { id: string; object: string; created: number; model: string };
  private readonly service: { request_id: string };
  private readonly chat: boolean;
  private readonly encoder = new TextEncoder();
  /** A delta event is these two around the JSON string of its text: one stringify a token. */
  private readonly deltaHead: string;
  private readonly deltaTail: string;

  constructor(chat: boolean, requestId: string, model: string, created: number) {
    this.chat = chat;
    this.base = { id: `${chat ? 'chatcmpl' : 'cmpl'}-${requestId}`, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model };
    this.service = { request_id: requestId };
    const base = JSON.stringify(this.base).slice(0, -1);
    this.deltaHead = chat ? `data: ${base},"choices":[{"index":0,"delta":{"content":` : `data: ${base},"choices":[{"index":0,"text":`;
    this.deltaTail = chat ? '},"finish_reason":null}]}\n\n' : ',"logprobs":null,"finish_reason":null}]}\n\n';
  }

  private event(v: object): Uint8Array {
    return this.encoder.encode(`data: ${JSON.stringify(v)}\n\n`);
  }

  /** The first event of a chat stream announces the role. */
  start(): Uint8Array | undefined {
    return this.chat ? this.event({ ...this.base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }) : undefined;
  }

  delta(text: string): Uint8Array {
    // Byte for byte what event() gives for { ...base, choices: [{ index: 0, delta: { content } … }] }.
    return this.encoder.encode(this.deltaHead + JSON.stringify(text) + this.deltaTail);
  }

  /**
   * The stream's closing events, written at once: the finish chunk, the usage chunk when
   * stream_options.include_usage is true, and [DONE]. The closing chunks carry
   * `service.request_id` as their last member (the spec: every body carries it).
   */
  close(reason: Finish, usage: UsageOut | undefined): Uint8Array {
    const service = this.service;
    const finish = this.event({ ...this.base, choices: [this.chat ? { index: 0, delta: {}, finish_reason: reason } : { index: 0, text: '', logprobs: null, finish_reason: reason }], service });
    const done = this.encoder.encode('data: [DONE]\n\n');
    return usage ? concatBytes(finish, this.event({ ...this.base, choices: [], usage, service }), done) : concatBytes(finish, done);
  }
}

/** The Responses API object (non-streaming body, and the `response` inside its stream events). */
export function responsesBody(requestId: string, model: string, created: number, text: string, finish: Finish | 'in_progress', usage: UsageOut | null): Record<string, unknown> {
  const done = finish !== 'in_progress';
  return {
    id: `resp_${requestId}`,
    object: 'response',
    created_at: created,
    status: !done ? 'in_progress' : finish === 'length' ? 'incomplete' : 'completed',
    incomplete_details: finish === 'length' ? { reason: 'max_output_tokens' } : null,
    model,
    // (A message cut off by max_output_tokens is itself `incomplete`, as in the format imitated: s23 h2.)
    output: done ? [{ type: 'message', id: `msg_${requestId}`, status: finish === 'length' ? 'incomplete' : 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] }] : [],
    usage: usage && { input_tokens: usage.prompt_tokens, output_tokens: usage.completion_tokens, total_tokens: usage.total_tokens, cost: usage.cost },
    service: { request_id: requestId },
  };
}

/**
 * The Responses API event protocol: named SSE events with increasing sequence numbers, no [DONE].
 * created → in_progress → output_item.added → content_part.added → output_text.delta* →
 * output_text.done → content_part.done → output_item.done → completed (or incomplete).
 */
export class ResponsesStream {
  private seq = 0;
  private text = '';
  private readonly encoder = new TextEncoder();
  private readonly requestId: string;
  private readonly model: string;
  private readonly created: number;
  private readonly itemId: string;

  constructor(requestId: string, model: string, created: number) {
    this.requestId = requestId;
    this.model = model;
    this.created = created;
    this.itemId = `msg_${requestId}`;
  }

  private event(type: string, fields: Record<string, unknown>): Uint8Array {
    return this.encoder.encode(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: this.seq++, ...fields })}\n\n`);
  }

  start(): Uint8Array {
    const response = responsesBody(this.requestId, this.model, this.created, '', 'in_progress', null);
    const parts = [
      this.event('response.created', { response }),
      this.event('response.in_progress', { response }),
      this.event('response.output_item.added', { output_index: 0, item: { type: 'message', id: this.itemId, status: 'in_progress', role: 'assistant', content: [] } }),
      this.event('response.content_part.added', { item_id: this.itemId, output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } }),
    ];
    return concatBytes(...parts);
  }

  delta(text: string): Uint8Array {
    this.text += text;
    return this.event('response.output_text.delta', { item_id: this.itemId, output_index: 0, content_index: 0, delta: text });
  }

  finish(reason: Finish, usage: UsageOut): Uint8Array {
    const part = { type: 'output_text', text: this.text, annotations: [] };
    const final = responsesBody(this.requestId, this.model, this.created, this.text, reason, usage);
    return concatBytes(
      this.event('response.output_text.done', { item_id: this.itemId, output_index: 0, content_index: 0, text: this.text }),
      this.event('response.content_part.done', { item_id: this.itemId, output_index: 0, content_index: 0, part }),
      this.event('response.output_item.done', { output_index: 0, item: { type: 'message', id: this.itemId, status: reason === 'length' ? 'incomplete' : 'completed', role: 'assistant', content: [part] } }),
      this.event(reason === 'length' ? 'response.incomplete' : 'response.completed', { response: final }),
    );
  }
}
