// Response bodies and stream events in the shapes the marketplace API promises (OpenAI-compatible
// plus usage.cost and service.request_id). The receipt itself travels in the trailer frame; the
// gateway adds it to what the buyer sees as service.receipt.

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
  private readonly chat: boolean;
  private readonly encoder = new TextEncoder();

  constructor(chat: boolean, requestId: string, model: string, created: number) {
    this.chat = chat;
    this.base = { id: `${chat ? 'chatcmpl' : 'cmpl'}-${requestId}`, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model };
  }

  private event(v: object): Uint8Array {
    return this.encoder.encode(`data: ${JSON.stringify(v)}\n\n`);
  }

  /** The first event of a chat stream announces the role. */
  start(): Uint8Array | undefined {
    return this.chat ? this.event({ ...this.base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }) : undefined;
  }

  delta(text: string): Uint8Array {
    return this.event({ ...this.base, choices: [this.chat ? { index: 0, delta: { content: text }, finish_reason: null } : { index: 0, text, logprobs: null, finish_reason: null }] });
  }

  finish(reason: Finish): Uint8Array {
    return this.event({ ...this.base, choices: [this.chat ? { index: 0, delta: {}, finish_reason: reason } : { index: 0, text: '', logprobs: null, finish_reason: reason }] });
  }

  /** Only when stream_options.include_usage is true, just before [DONE]. */
  usage(usage: UsageOut): Uint8Array {
    return this.event({ ...this.base, choices: [], usage });
  }

  done(): Uint8Array {
    return this.encoder.encode('data: [DONE]\n\n');
  }
}
