// Where a text with special tokens in it can be cut and tokenised in pieces with the very tokens
// the whole would give, and how many tokens it needs at least.
//
// llama.cpp tokenises with special tokens parsed (how a rendered chat template is tokenised) by
// first cutting the text at every special token's text, token type by token type, longest text
// first, into a list of pieces; every occurrence it cuts out walks that list from its start (s24
// hB read it in the bundled llama.cpp), so k special tokens cost about k² steps, all of it
// synchronous: 35,000 empty chat messages held the node 13 s, 280,000 ~15 min (s23 h6). Cutting
// the text where llama.cpp surely cuts it, and tokenising the pieces, makes it linear. (Texts this
// long are tokenised in a child process as well: tokenizer-process.ts.)
//
// An occurrence of a special text that overlaps no other occurrence of any special text (itself at
// another place included) is surely cut out as its token: when its type's turn comes, nothing has
// been cut inside or across it, and no earlier match of its own type covers it. Each such
// occurrence is one token of the result (a lower bound on the count), and right after it is a
// place where the whole text's pieces and the pieces' own agree: a raw piece after a special token
// is tokenised as the first one of a text is (SentencePiece's leading space is added after a
// special token and at the start alike), unless the token strips the whitespace after it (rstrip),
// where no cut is made.

export interface SpecialText {
  /** The token's text, as llama.cpp searches for it. */
  text: string;
  /** Whether an occurrence of it, overlapping no other, surely becomes its token (a control token). */
  sure: boolean;
  /** Whether the token strips the whitespace after it (llama.cpp's rstrip attribute). */
  rstrip: boolean;
}

export interface SpecialScan {
  /** Occurrences that surely become one token each. */
  sure: number;
  /** The UTF-8 bytes of the text outside those occurrences. */
  otherBytes: number;
  /** UTF-16 offsets, ascending, where the text can be cut (each right after a sure occurrence). */
  cuts: number[];
}

interface Occurrence {
  start: number;
  end: number;
  special: SpecialText;
}

/** Up to this many distinct first characters, a scan jumps between their places with indexOf. */
const FEW_FIRST_CHARS = 8;

/** A trie of special texts by UTF-16 code unit: what scanSpecials walks from each position. */
export class SpecialTrie {
  private readonly root = new TrieNode();
  constructor(specials: readonly SpecialText[]) {
    for (const special of specials) {
      if (special.text === '') continue;
      let node = this.root;
      for (let i = 0; i < special.text.length; i++) {
        const c = special.text.charCodeAt(i);
        let next = node.next.get(c);
        if (!next) node.next.set(c, (next = new TrieNode()));
        node = next;
      }
      node.special = special;
    }
  }

  /** Every occurrence of every special text in `text`, overlapping ones too, by start then end. */
  occurrences(text: string): Occurrence[] {
    const found: Occurrence[] = [];
    const first = this.root.next;
    const walk = (i: number, node: TrieNode | undefined) => {
      for (let j = i + 1; node; j++) {
        if (node.special) found.push({ start: i, end: j, special: node.special });
        if (j >= text.length) break;
        node = node.next.get(text.charCodeAt(j));
      }
    };
    if (first.size > FEW_FIRST_CHARS) {
      for (let i = 0; i < text.length; i++) walk(i, first.get(text.charCodeAt(i)));
      return found;
    }
    // Few first characters (ChatML's are all "<"): jump between their places (native search).
    const starts: number[] = [];
    for (const c of first.keys()) {
      const ch = String.fromCharCode(c);
      for (let at = text.indexOf(ch); at !== -1; at = text.indexOf(ch, at + 1)) starts.push(at);
    }
    if (first.size > 1) starts.sort((a, b) => a - b);
    for (const i of starts) walk(i, first.get(text.charCodeAt(i)));
    return found;
  }
}

class TrieNode {
  readonly next = new Map<number, TrieNode>();
  special: SpecialText | undefined;
}

/**
 * The sure occurrences of special texts in `text`, and where it can be cut. One walk of the text
 * (a trie of the special texts), whatever their number: a vocabulary may have thousands.
 */
export function scanSpecials(text: string, specials: readonly SpecialText[] | SpecialTrie): SpecialScan {
  const found = (specials instanceof SpecialTrie ? specials : new SpecialTrie(specials)).occurrences(text);
  let sure = 0;
  let sureBytes = 0;
  const cuts: number[] = [];
  let endBefore = -1;
  for (let i = 0; i < found.length; i++) {
    const o = found[i]!;
    const next = found[i + 1];
    const alone = endBefore <= o.start && (next === undefined || next.start >= o.end);
    endBefore = Math.max(endBefore, o.end);
    if (!alone || !o.special.sure) continue;
    sure += 1;
    sureBytes += Buffer.byteLength(o.special.text);
    if (!o.special.rstrip && o.end < text.length) cuts.push(o.end);
  }
  return { sure, otherBytes: Buffer.byteLength(text) - sureBytes, cuts };
}

/** `text` cut at some of `cuts` into pieces of at most about `perPiece` cuts each. */
export function piecesAt(text: string, cuts: readonly number[], perPiece: number): string[] {
  const pieces: string[] = [];
  let from = 0;
  for (let i = perPiece - 1; i < cuts.length; i += perPiece) {
    const at = cuts[i]!;
    pieces.push(text.slice(from, at));
    from = at;
  }
  pieces.push(text.slice(from));
  return pieces;
}
