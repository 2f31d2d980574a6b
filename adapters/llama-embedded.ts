// The embedded runtime: llama.cpp in-process through node-llama-cpp (CPU here, GPU where the host
// has one). Tokens are the model's own; chat prompts are rendered with the model's own Jinja chat
// template; a fixed seed makes generation replayable for audits.
import fs from 'node:fs';
import { Template } from '@huggingface/jinja';
import { getLlama, LlamaLogLevel, type Llama, type LlamaContext, type LlamaContextSequence, type LlamaEmbeddingContext, type LlamaModel, type Token } from 'node-llama-cpp';
import { probeChatTemplate } from './chat-template-probe.ts';
import { fileSha256 } from './file-sha256.ts';
import { fileIdentity, LoadedModelFile, modelFileState, type ModelFileState } from './model-file.ts';
import { keepErrorLines, loadNamingWhy } from './llama-load-errors.ts';
import { probeKey, probeModel, type ProbeMemo } from './model-probe.ts';
import { checkGgufFile } from './gguf/gguf-check.ts';
import { quantizationOfFileType } from './gguf/file-type.ts';
import { groupEnd, TokenLedger } from './token-ledger.ts';
import { piecesAt, scanSpecials, SpecialTrie, type SpecialScan, type SpecialText } from './special-token-split.ts';
import { TemplateRefusedError, TokenizeDeadlineError, TokenizeMemoryError, TokenizerBusyError, TokenizerProcess } from './tokenizer-process.ts';
import { RuntimeBusyError, UnsupportedInputError, type ChatMessage, type EmbeddingResult, type GeneratedChunk, type GenerateRequest, type GenerationInput, type GenerationResult, type RuntimeAdapter, type RuntimeInfo } from './runtime-adapter.ts';

export interface LlamaEmbeddedOptions {
  modelPath: string;
  /** Context length per sequence (default: the model's, capped at 4096). */
  contextLength?: number;
  /** Requests that can run at once (context sequences). Default 1. */
  slots?: number;
  /** CPU threads per evaluation. Default 1: more is much slower on small machines. */
  threads?: number;
  /**
   * 'auto' (the default) uses a GPU when the host has one; false the CPU only. A process should use
   * one setting: node-llama-cpp then loads one binding, whose llama.cpp log lines this adapter reads
   * (a second binding takes them over, and a failed load's error names no reason).
   */
  gpu?: 'auto' | false;
  /**
   * Map the GGUF file (shared, llama.cpp's default) instead of reading the weights into this
   * process's memory. Default false: a mapped file written over in place changes the weights being
   * served under the hash taken at start, and one cut short kills the process (SIGBUS).
   */
  mmap?: boolean;
  /**
   * Load and run the model in a child process first (model-probe.ts), so that what llama.cpp
   * aborts on refuses the model instead of killing this process; `memo` keeps the verdicts of
   * files that passed. Off when absent.
   */
  probe?: { memo?: ProbeMemo; timeoutMs?: number };
  /** The model file's SHA-256 (hex), when the caller has already hashed it: start() then does not read the file twice. */
  modelSha256?: string;
  /** Bounds of the chat template's probe at start (chat-template-probe.ts; default 5 s, 256 MB). */
  templateProbe?: { timeoutMs?: number; heapMb?: number };
  /** How long a long text may take to tokenise in the tokenizer's child process before it is refused (default 10 s; tokenizer-process.ts). */
  tokenizeDeadlineMs?: number;
  /** That child's JavaScript heap limit, MiB (default 512): a text or chat that needs more is refused as one past the deadline is. */
  tokenizerHeapMiB?: number;
  /** Start that child with the runtime (a serving node: the first long text then does not wait for it to load), not at the first long text. */
  tokenizerAtStart?: boolean;
}

/** One llama.cpp binding per GPU setting; a failed load is not remembered (the next start retries). */
const llamas = new Map<'auto' | false, Promise<Llama>>();
function llamaFor(gpu: 'auto' | false): Promise<Llama> {
  let p = llamas.get(gpu);
  if (!p) {
    p = getLlama({ gpu, build: 'never', logLevel: LlamaLogLevel.error, progressLogs: false }).then(keepErrorLines);
    p.catch(() => llamas.delete(gpu));
    llamas.set(gpu, p);
  }
  return p;
}

/** What receipts name as the runtime: node-llama-cpp's version, its build and the device (what an auditor replaying needs to match). */
function runtimeVersion(llama: Llama): string {
  return `node-llama-cpp/${NODE_LLAMA_CPP_VERSION}/${llama.buildType}/${llama.gpu || 'cpu'}`;
}

const EMBED_STOPPED = 'the embedded runtime was stopped before the inputs were embedded';

const NODE_LLAMA_CPP_VERSION = ((): string => {
  try {
    const pkg = new URL('../package.json', import.meta.resolve('node-llama-cpp'));
    return String((JSON.parse(fs.readFileSync(pkg, 'utf8')) as { version?: unknown }).version);
  } catch {
    return 'unknown';
  }
})();

export { fileSha256 };

export class LlamaEmbeddedAdapter implements RuntimeAdapter {
  private readonly opts: LlamaEmbeddedOptions;
  private model: LlamaModel | undefined;
  private context: LlamaContext | undefined;
  /** The model file as it was when loaded and hashed, and whether llama.cpp mapped it (the weights served are then the file's bytes as they are now). */
  private file: LoadedModelFile | undefined;
  /** What the latest start did about the child-process probe: ran it, knew the file passed it (its memo), or none asked. */
  probed: 'ran' | 'remembered' | 'off' = 'off';
  private embedding: Promise<LlamaEmbeddingContext> | undefined;
  private readonly idle: LlamaContextSequence[] = [];
  private template: Template | undefined;
  private starting = false;
  /** Embeddings under way: a stop lets each finish the input it is on before the context they use is freed (freeing it under one crashed the process). */
  private readonly embeddingRuns = new Set<Promise<unknown>>();
  /** Set by stop(): embeddings under way end after their current input. */
  private stopping = false;
  info: RuntimeInfo = { adapter: 'llama-embedded', version: '', modelSha256: '', contextLength: 0, embeddingLength: 0, chatTemplate: null };
  /** The most bytes one token stands for (set at start): what bounds an input's token count from below. */
  private maxTokenBytes = Number.POSITIVE_INFINITY;
  /** The texts llama.cpp cuts out as special tokens when it parses them (set at start). */
  private specials = new SpecialTrie([]);
  /** The child process that tokenises long texts (started at the first). */
  private tokenizer: TokenizerProcess | undefined;
  /** Whether long texts may be tokenised in pieces (specialTexts). */
  private cuttable = false;
  /** Whether a special token strips whitespace beside it: the bytes outside special tokens then bound nothing. */
  private stripsWhitespace = false;

  constructor(opts: LlamaEmbeddedOptions) {
    this.opts = opts;
  }

  /** Loads the model and its context. A start that fails releases whatever it had loaded. */
  async start(): Promise<void> {
    if (this.model || this.starting) throw new Error('the embedded runtime is already started (stop it first)');
    const slots = this.opts.slots ?? 1;
    if (!Number.isSafeInteger(slots) || slots < 1) throw new Error(`slots must be a positive integer, not ${slots}`);
    this.starting = true; // a second start() while this one loads is refused too (it would load a second model)
    try {
      await this.load(slots);
    } finally {
      this.starting = false;
    }
  }

  private async load(slots: number): Promise<void> {
    const summary = checkGgufFile(this.opts.modelPath); // (a file node-llama-cpp or llama.cpp would mis-read is refused first: gguf-check.ts)
    // (the quantization bucket the file says it is: general.file_type)
    const quantization = quantizationOfFileType(summary.fileType);
    const llama = await llamaFor(this.opts.gpu ?? 'auto');
    const before = fileIdentity(this.opts.modelPath);
    const hashing = this.opts.modelSha256 ?? fileSha256(this.opts.modelPath);
    // A probe's verdict is kept by the file's hash: it runs after the hash, before the node loads the
    // model, and is remembered only once the node's own load found the file unchanged since the hash.
    const passed = this.opts.probe ? await this.probe(await hashing, llama) : undefined;
    // checkTensors: llama.cpp reads every weight for NaN and infinity as it loads them (the file is
    // read whole anyway, to hash it); a model holding such values answers every request with noise.
    const [loaded, hashed] = await Promise.allSettled([loadNamingWhy(llama, this.opts.modelPath, { useMmap: this.opts.mmap ?? false, checkTensors: true }), hashing]);
    if (loaded.status === 'rejected') throw loaded.reason;
    this.model = loaded.value;
    try {
      if (hashed.status === 'rejected') throw hashed.reason;
      // (what was hashed must be what was loaded: a file still being copied in is refused)
      const after = fileIdentity(this.opts.modelPath);
      if (!before || !after || modelFileState(before, after) !== 'unchanged') throw new Error(`model file ${this.opts.modelPath} changed while it was loaded and hashed: start again once it is complete`);
      this.file = new LoadedModelFile(this.opts.modelPath, after, loaded.value.useMmap);
      await this.open(llama, loaded.value, hashed.value, slots, quantization);
      if (passed !== undefined) await this.opts.probe?.memo?.remember(passed);
    } catch (e) {
      await this.stop().catch(() => undefined);
      throw e;
    }
  }

  /**
   * The child-process probe, unless the memo knows a file of this hash passed it under this runtime
   * on this device. Resolves with the verdict's key when the model passed (or was known), for the
   * caller to remember once its own load is done; undefined when the child's JavaScript refused it
   * (the node's own load then says why).
   */
  private async probe(sha256: string, llama: Llama): Promise<string | undefined> {
    const opts = { modelPath: this.opts.modelPath, gpu: this.opts.gpu ?? 'auto', mmap: this.opts.mmap ?? false, ...(this.opts.probe?.timeoutMs !== undefined ? { timeoutMs: this.opts.probe.timeoutMs } : {}) };
    // (the llama.cpp release too: a binding rebuilt at the same version runs other native code)
    const key = probeKey(sha256, `${runtimeVersion(llama)} llama.cpp ${llama.llamaCppRelease.release}`, opts.mmap);
    if (await this.opts.probe?.memo?.known(key)) {
      this.probed = 'remembered';
      return key;
    }
    this.probed = 'ran';
    try {
      return (await probeModel(opts)) ? key : undefined;
    } catch (e) {
      throw new Error(`${this.opts.modelPath}: ${(e as Error).message}`, { cause: e });
    }
  }

  private async open(llama: Llama, model: LlamaModel, sha: string, slots: number, quantization: string | undefined): Promise<void> {
    const contextLength = Math.min(this.opts.contextLength ?? Math.min(model.trainContextSize, 4096), model.trainContextSize);
    this.context = await model.createContext({
      contextSize: contextLength, // per sequence: node-llama-cpp gives each of the `sequences` its own
      sequences: slots,
      threads: this.opts.threads ?? 1,
      // node-llama-cpp gathers the decodes of several sequences into one batch by waiting a turn of
      // the event loop, unless every sequence of the context has queued one. Idle slots never queue,
      // so a lone request on a multi-slot context waited a turn for every token (streaming ~10-20 %
      // slower here). Dispatch at once when only one slot is in use; batch as before otherwise.
      batching: { dispatchSchedule: (dispatch: () => void) => (slots - this.idle.length <= 1 ? dispatch() : setImmediate(dispatch)) },
    });
    for (let i = 0; i < slots; i++) this.idle.push(this.context.getSequence());
    await this.checkComputes();
    const chatTemplate = model.fileInfo.metadata?.tokenizer?.chat_template;
    this.template = typeof chatTemplate === 'string' ? new Template(chatTemplate) : undefined;
    if (typeof chatTemplate === 'string') {
      try {
        await probeChatTemplate(chatTemplate, { bos: model.tokens.bosString ?? '', eos: model.tokens.eosString ?? '' }, this.opts.templateProbe ?? {});
      } catch (e) {
        throw new Error(`${this.opts.modelPath}: ${(e as Error).message}`);
      }
    }
    this.maxTokenBytes = longestToken(model);
    if (this.opts.tokenizerAtStart) {
      this.tokenizer = this.newTokenizer();
      this.tokenizer.warm(); // (in the background: a failure is said at the first long text)
    }
    const special = specialTexts(model);
    this.specials = new SpecialTrie(special.specials);
    this.cuttable = special.cuttable;
    this.stripsWhitespace = special.stripsWhitespace;
    this.info = {
      adapter: 'llama-embedded',
      version: runtimeVersion(llama),
      modelSha256: sha,
      contextLength,
      embeddingLength: model.embeddingVectorSize,
      chatTemplate: typeof chatTemplate === 'string' ? chatTemplate : null,
      ...(quantization !== undefined ? { quantization } : {}),
    };
  }

  /**
   * A model whose weights pass llama.cpp's checks and still compute NaN (a rope_freqs tensor of
   * zeros does) answers every request with one meaningless token, billed: refused at start. Two
   * greedy tokens of an ordinary prompt; the probability of each must be a number.
   */
  private async checkComputes(): Promise<void> {
    const sequence = this.idle[0]!;
    const input = await this.inputTokens({ kind: 'prompt', prompt: 'The quick brown fox' });
    let seen = 0;
    try {
      // (yieldEogToken: a first token that ends the answer is checked too; NaN logits pick token 0, an end token in some vocabularies)
      for await (const { confidence } of sequence.evaluateWithMetadata(input, { confidence: true }, { temperature: 0, yieldEogToken: true })) {
        if (!Number.isFinite(confidence)) throw new Error(`${this.opts.modelPath}: the model computes NaN (not a number) for an ordinary prompt, so its every answer would be noise: a tensor holds zeros or other values that cannot be right`);
        if (++seen >= 2) break;
      }
    } finally {
      await sequence.clearHistory();
    }
  }

  /** The model file as loaded (the runtime thread sends its identity to the node's thread). */
  get loadedFile(): LoadedModelFile | undefined {
    return this.file;
  }

  /** What became of the model file since it was loaded (see model-file.ts); `unchanged` before a load. */
  modelFileState(): ModelFileState {
    return this.file?.state() ?? 'unchanged';
  }

  async stop(): Promise<void> {
    // (set until the model is freed: an embedding asked for meanwhile must not open a context on it)
    this.stopping = true;
    try {
      await Promise.allSettled([...this.embeddingRuns]);
      this.tokenizer?.stop();
      this.tokenizer = undefined;
      await (await this.embedding?.catch(() => undefined))?.dispose();
      await this.context?.dispose();
      await this.model?.dispose();
      this.embedding = this.context = this.model = undefined;
      this.idle.length = 0;
    } finally {
      this.stopping = false;
    }
  }

  private get m(): LlamaModel {
    if (!this.model) throw new Error('the embedded runtime is not started');
    return this.model;
  }

  private newTokenizer(): TokenizerProcess {
    return new TokenizerProcess(this.opts.modelPath, this.opts.tokenizeDeadlineMs ?? 10_000, this.opts.tokenizerHeapMiB === undefined ? {} : { maxHeapMiB: this.opts.tokenizerHeapMiB });
  }

  async tokenize(text: string, opts: { special?: boolean } = {}): Promise<number[]> {
    return [...(await this.tokenizeText(text, opts.special ?? false))];
  }

  /**
   * llama.cpp's tokens for `text`. A long text is tokenised in the tokenizer's child process, off
   * the event loop and within a deadline (tokenizer-process.ts); with special tokens parsed, cut
   * where llama.cpp surely cuts it and tokenised in pieces, the same tokens in linear time
   * (special-token-split.ts).
   */
  private async tokenizeText(text: string, special: boolean, scan?: SpecialScan): Promise<Token[]> {
    const model = this.m;
    if (text.length < SPLIT_FROM) return model.tokenize(text, special);
    const pieces = special && this.cuttable ? piecesAt(text, (scan ?? scanSpecials(text, this.specials)).cuts, CUTS_PER_PIECE) : [text];
    this.tokenizer ??= this.newTokenizer();
    try {
      return [...(await this.tokenizer.tokenize(pieces, special))] as Token[];
    } catch (e) {
      throw childRefusal(e, this.tokenizer, {
        subject: `the input (${text.length} characters)`,
        notDone: 'was not tokenised',
        toDo: 'to tokenise',
        why: ": llama.cpp's tokenizer is slow on long runs of characters its vocabulary has no token for, or of special-token texts",
      });
    }
  }

  async detokenize(tokens: number[]): Promise<string> {
    return this.m.detokenize(tokens as Token[], true);
  }

  /**
   * The chat rendered with the model's own Jinja template. A large chat (by chatWeight) is rendered
   * in the tokenizer's child process, off the event loop and within its deadline: a template's
   * work grows with the messages (s26: 8 MiB of empty messages, 280,000 of them, held the event
   * loop 1.5 s; the copy to the child ~0.1 s, about what parsing the body took).
   */
  async renderChat(messages: ChatMessage[]): Promise<string> {
    if (!this.template || this.info.chatTemplate === null) throw new UnsupportedInputError('token_count_unsupported', 'this model has no chat template: it takes prompts (completions), not chat messages');
    const t = this.m.tokens;
    const tokens = { bos: t.bosString ?? '', eos: t.eosString ?? '' };
    // The template parsed when the model loaded, so what fails now is these messages: a
    // template's raise_exception (many refuse a system message, or roles that do not alternate)
    // or a shape it cannot handle. The buyer's request, not the node, is at fault.
    const refused = (e: unknown) => new UnsupportedInputError('invalid_request', `messages: the model's chat template refuses them: ${(e instanceof Error ? e.message : String(e)).slice(0, 200)}`);
    if (chatWeight(messages, RENDER_OFF_LOOP_FROM) < RENDER_OFF_LOOP_FROM) {
      try {
        return this.template.render({ messages, add_generation_prompt: true, bos_token: tokens.bos, eos_token: tokens.eos });
      } catch (e) {
        throw refused(e);
      }
    }
    const child = (this.tokenizer ??= this.newTokenizer());
    try {
      return await child.render(this.info.chatTemplate, messages, tokens);
    } catch (e) {
      if (e instanceof TemplateRefusedError) throw refused(e);
      throw childRefusal(e, child, { subject: `the messages (${messages.length})`, notDone: "were not rendered with the model's chat template", toDo: "to render with the model's chat template" });
    }
  }

  /** The exact tokens a generation starts from: BOS when the model wants it, then the prompt. */
  async inputTokens(input: GenerationInput, opts: { atMost?: number } = {}): Promise<Token[]> {
    // With atMost, a text too long by its length alone is refused before it is tokenised: no
    // token is longer than maxTokenBytes, so it needs at least bytes / maxTokenBytes tokens. A
    // chat is judged by its rendering (below): a template may leave out what messages hold (Qwen3
    // drops earlier turns' reasoning), so their bytes bound nothing (s24 hB: a 36-token chat was
    // refused as "at least 5003").
    if (opts.atMost !== undefined && input.kind === 'prompt') {
      const bytes = Buffer.byteLength(input.prompt);
      const atLeast = Math.ceil(bytes / this.maxTokenBytes);
      if (atLeast > opts.atMost) throw new UnsupportedInputError('context_length_exceeded', `an input of at least ${atLeast} tokens (${bytes} bytes) exceeds the model's context of ${opts.atMost}`);
    }
    const text = input.kind === 'chat' ? await this.renderChat(input.messages) : input.prompt;
    // (Special tokens are counted and cut at only where their texts are known to be llama.cpp's: cuttable.)
    const scan = input.kind === 'chat' && this.cuttable && text.length >= SPLIT_FROM ? scanSpecials(text, this.specials) : undefined;
    if (input.kind === 'chat' && opts.atMost !== undefined && text.length >= SPLIT_FROM) {
      // The rendered text needs at least one token for each special token surely in it (each
      // empty message is two or more) and one for each maxTokenBytes of the rest (unless a token
      // strips whitespace: the rest's bytes then bound nothing).
      const rest = scan ? scan.otherBytes : Buffer.byteLength(text);
      const atLeast = (scan?.sure ?? 0) + (this.stripsWhitespace ? 0 : Math.ceil(rest / this.maxTokenBytes));
      if (atLeast > opts.atMost) throw new UnsupportedInputError('context_length_exceeded', `messages of at least ${atLeast} tokens (${input.messages.length} messages) exceed the model's context of ${opts.atMost}`);
    }
    const tokens = await this.tokenizeText(text, input.kind === 'chat', scan);
    const bos = this.m.tokens.bos;
    return this.m.tokens.shouldPrependBosToken && bos !== null && tokens[0] !== bos ? [bos, ...tokens] : tokens;
  }

  async countInputTokens(input: GenerationInput): Promise<number> {
    return (await this.inputTokens(input)).length;
  }

  async *generate(req: GenerateRequest): AsyncGenerator<GeneratedChunk, GenerationResult, void> {
    const model = this.m;
    const input = (req.inputTokens as Token[] | undefined) ?? (await this.inputTokens(req.input));
    const sequence = this.idle.pop();
    if (!sequence) throw new Error('no free slot: the node admits at most `slots` requests at once');
    const output: Token[] = [];
    /** Decoded text not sent yet because it ends in what may be the start of a stop sequence. */
    let held = '';
    /** Index of the first output token whose text has not been decoded yet (it ends in a partial character). */
    let from = 0;
    /** Output tokens from `from` to `to`, decoded in the context of the ones before them (how a leading space renders depends on it). */
    const decode = (to = output.length) => model.detokenize(output.slice(from, to), false, output.slice(Math.max(0, from - 8), from));
    /** Which tokens have all their text sent: each chunk carries those (token-ledger.ts). */
    const ledger = new TokenLedger();
    // The evaluation ends by itself when the model produces an end-of-generation token.
    let finishReason: GenerationResult['finishReason'] = 'stop';
    let evaluation: AsyncGenerator<Token, void, void | Token | Token[]> | undefined;
    /** Whether the prompt went to the runtime: a run stopped before that evaluated (and bills) nothing. */
    let evaluated = false;
    try {
      await sequence.clearHistory();
      if (req.signal?.aborted) finishReason = 'abort';
      else if (req.maxTokens <= 0) finishReason = 'length';
      else {
        evaluation = sequence.evaluate(input, {
          temperature: req.sampling.temperature,
          seed: req.sampling.seed,
          ...(req.sampling.topK !== undefined ? { topK: req.sampling.topK } : {}),
          ...(req.sampling.topP !== undefined ? { topP: req.sampling.topP } : {}),
          ...(req.sampling.minP !== undefined ? { minP: req.sampling.minP } : {}),
          // llama.cpp's repeat penalty: over the last 64 tokens, the input's and the output's.
          ...(req.sampling.repeatPenalty !== undefined && req.sampling.repeatPenalty !== 1
            ? { repeatPenalty: { penalty: req.sampling.repeatPenalty, maxPunishTokens: REPEAT_WINDOW, punishTokens: () => lastTokens(input, output, REPEAT_WINDOW) } }
            : {}),
        });
        evaluated = true;
        for await (const token of evaluation) {
          output.push(token);
          ledger.add(token);
          // The tokens not decoded yet are held while they end in a partial character.
          const text = decode();
          let chunk = '';
          if (!text.endsWith('\uFFFD')) {
            chunk = text;
            // Tokens decoded together each end where their own character does (groupEnd).
            const inner: number[] = [];
            for (let k = from + 1; k < output.length; k++) inner.push(groupEnd(decode(k), text, inner.at(-1) ?? 0));
            ledger.decoded(text, inner);
            from = output.length;
          }
          // What was sent never ends in a stop's beginning (that part is held), so a stop can only
          // start in held + chunk; the text before it is sent, the stop and anything after are not.
          const full = held + chunk;
          const stopAt = req.stop?.length ? firstStop(full, req.stop) : -1;
          if (stopAt >= 0) {
            held = '';
            yield { text: full.slice(0, stopAt), tokens: ledger.sent(stopAt) };
            // The tokens whose text ends in the stop (left out of the answer) come last, with no
            // text: a completed run bills them, a buyer who leaves before its end is not billed them.
            const stopTokens = ledger.rest();
            if (stopTokens.length > 0) yield { text: '', tokens: stopTokens };
            finishReason = 'stop';
            break;
          }
          const keep = req.stop?.length ? stopPrefixLength(full, req.stop) : 0;
          held = full.slice(full.length - keep);
          // (A chunk with no text and no token still comes: the consumer sees the runtime is alive.)
          yield { text: full.slice(0, full.length - keep), tokens: ledger.sent(full.length - keep) };
          if (req.signal?.aborted) {
            finishReason = 'abort';
            break;
          }
          if (output.length >= req.maxTokens) {
            finishReason = 'length';
            break;
          }
        }
        // Text held for a stop that never came is part of the answer after all, and so are the
        // bytes of a character the run ended in the middle of (its length reached, or the model
        // ended there): those tokens were generated and are billed, so their bytes are sent, the
        // partial character as U+FFFD, as llama-server does. (A run ended by a stop sequence has
        // none: a stop is only found once a token completes its characters.)
        let rest = held;
        if (from < output.length) {
          const tail = decode();
          rest += tail;
          ledger.decoded(tail);
        }
        const stopAt = req.stop?.length ? firstStop(rest, req.stop) : -1;
        if (stopAt >= 0) {
          rest = rest.slice(0, stopAt);
          finishReason = 'stop';
        }
        const last = ledger.sent(rest.length);
        if (rest || last.length > 0) yield { text: rest, tokens: last };
        const stopTokens = ledger.rest(); // (those of a stop, as above)
        if (stopTokens.length > 0) yield { text: '', tokens: stopTokens };
      }
    } finally {
      try {
        await evaluation?.return();
      } finally {
        this.idle.push(sequence);
      }
    }
    const prompt = evaluated ? input.length : 0;
    return {
      finishReason,
      inputTokens: prompt,
      outputTokens: output.length,
      usageRuntime: { prompt_tokens: prompt, completion_tokens: output.length, total_tokens: prompt + output.length },
    };
  }

  async embed(inputs: string[], known?: number[][], signal?: AbortSignal): Promise<EmbeddingResult> {
    const run = this.embedNow(inputs, known, signal);
    this.embeddingRuns.add(run);
    try {
      return await run;
    } finally {
      this.embeddingRuns.delete(run);
    }
  }

  private async embedNow(inputs: string[], known?: number[][], signal?: AbortSignal): Promise<EmbeddingResult> {
    if (this.stopping) throw new Error(EMBED_STOPPED);
    const model = this.m;
    // One context, even when the first embeddings requests arrive together.
    this.embedding ??= model.createEmbeddingContext({ threads: this.opts.threads ?? 1 }).catch((e: unknown) => {
      this.embedding = undefined; // not remembered: the next request tries again
      throw e;
    });
    const embedding = await this.embedding;
    const vectors: number[][] = [];
    let inputTokens = 0;
    for (const [i, text] of inputs.entries()) {
      if (signal?.aborted) break; // the caller left: what is done is what is billed
      if (this.stopping) throw new Error(EMBED_STOPPED);
      // The same tokens count_tokens reports for a prompt (BOS included) are the ones embedded.
      const tokens = (known?.[i] as Token[] | undefined) ?? (await this.inputTokens({ kind: 'prompt', prompt: text }));
      inputTokens += tokens.length;
      vectors.push([...(await embedding.getEmbeddingFor(tokens)).vector]);
    }
    return { vectors, inputTokens };
  }
}

/** Index in `text` where the earliest stop sequence begins, or -1. */
function firstStop(text: string, stops: string[]): number {
  let best = -1;
  for (const s of stops) {
    if (!s) continue;
    const i = text.indexOf(s);
    if (i >= 0 && (best < 0 || i < best)) best = i;
  }
  return best;
}

/** The length of the longest end of `text` that is the beginning (not the whole) of a stop sequence. */
function stopPrefixLength(text: string, stops: string[]): number {
  let best = 0;
  for (const s of stops) {
    for (let k = Math.min(text.length, s.length - 1); k > best; k--) {
      if (text.endsWith(s.slice(0, k))) {
        best = k;
        break;
      }
    }
  }
  return best;
}

/** How many of the latest tokens the repeat penalty looks at (llama.cpp's penalty_last_n default). */
const REPEAT_WINDOW = 64;

/** The last `n` tokens of the input followed by the output. */
function lastTokens(input: readonly Token[], output: readonly Token[], n: number): Token[] {
  if (output.length >= n) return output.slice(output.length - n);
  return [...input.slice(Math.max(0, input.length - (n - output.length))), ...output];
}

/** Below this many characters a text is tokenised whole: its special tokens cost nothing to speak of. */
const SPLIT_FROM = 16_384;

/** The node is busy with long inputs: 503, another provider can take this one. */
/**
 * The tokenizer child's failure as the request's: busy, 503 (another provider can take it); past
 * its deadline or its heap, 400 input_too_complex saying what was not done and why; anything else
 * as it came.
 */
function childRefusal(e: unknown, child: TokenizerProcess, say: { subject: string; notDone: string; toDo: string; why?: string }): unknown {
  if (e instanceof TokenizerBusyError) return new RuntimeBusyError(`this node is busy tokenising long inputs (${e.message}); another provider can take the request`);
  if (e instanceof TokenizeDeadlineError) return new UnsupportedInputError('input_too_complex', `${say.subject} ${say.notDone} within ${child.deadlineMs / 1000} s${say.why ?? ''}`);
  if (e instanceof TokenizeMemoryError) return new UnsupportedInputError('input_too_complex', `${say.subject} needed ${e.message} ${say.toDo}`);
  return e;
}

/** A chat at least this heavy (chatWeight) is rendered in the tokenizer's child process. */
const RENDER_OFF_LOOP_FROM = 65_536;

/**
 * About how much work rendering `messages` is, counted up to `cap`: 64 a message and a value in
 * its content, and each string's length (what a template copies or scans).
 */
export function chatWeight(messages: readonly unknown[], cap: number): number {
  let weight = 0;
  const stack: unknown[] = [...messages];
  while (stack.length > 0 && weight < cap) {
    const v = stack.pop();
    weight += typeof v === 'string' ? v.length : 64;
    if (v !== null && typeof v === 'object') for (const x of Object.values(v)) stack.push(x);
  }
  return weight;
}
/** How many cut places a piece spans: small enough that llama.cpp's search within it stays short. */
const CUTS_PER_PIECE = 32;

/**
 * The texts llama.cpp searches for when it parses special tokens (control, user-defined and
 * unknown tokens); whether a token strips the whitespace beside it (lstrip, rstrip); and whether
 * texts may be cut at special tokens: only when every control token's text, as
 * read back, is what llama.cpp cuts out as that token (a text whose leading space the read-back
 * drops is not: s24 hA), so that a cut is always where llama.cpp cuts.
 */
function specialTexts(model: LlamaModel): { specials: SpecialText[]; cuttable: boolean; stripsWhitespace: boolean } {
  const specials: SpecialText[] = [];
  let cuttable = true;
  let stripsWhitespace = false;
  for (const t of model.iterateAllTokens()) {
    const a = model.getTokenAttributes(t);
    if (a.lstrip || a.rstrip) stripsWhitespace = true;
    if (!a.control && !a.userDefined && !a.unknown) continue;
    const text = model.detokenize([t], true);
    const own = (() => {
      const back = model.tokenize(text, true);
      return back.length === 1 && back[0] === t;
    })();
    if (a.control && !own) cuttable = false;
    // Only a control token that reads back as itself is surely its own text (a user-defined one's
    // may be written with SentencePiece's ▁ for a space): the others are obstacles only, under
    // both spellings.
    specials.push({ text, sure: a.control && own, rstrip: a.rstrip });
    if (!own && text.includes(' ')) specials.push({ text: text.replaceAll(' ', '\u2581'), sure: false, rstrip: a.rstrip });
  }
  return { specials, cuttable, stripsWhitespace };
}

/**
 * The most bytes one token of the model's vocabulary stands for (a bound: 4 bytes are added for
 * the leading space a tokenizer adds or a lone token's text drops, and for a byte token's text).
 */
function longestToken(model: LlamaModel): number {
  let most = 1;
  for (const t of model.iterateAllTokens()) {
    const n = Buffer.byteLength(model.detokenize([t], true));
    if (n > most) most = n;
  }
  return most + 4;
}
