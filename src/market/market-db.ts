// The development market's file (`seller-node market --data DIR` keeps DIR/market.db): the tickets
// it issued, the receipts it collected and its totals, so a restart neither refuses the receipts of
// requests that were running (unknown_ticket: the provider never paid) nor forgets what it booked.
// Providers are not kept: a node learns of a restart from its next heartbeat and registers again.
//
// Every write is durable (WAL, synchronous=FULL) before the market answers: a ticket it handed out,
// or a receipt it acknowledged as settled, must still be there after a crash. One market a file
// (an exclusive lock).
import type Database from 'better-sqlite3';
import { ratesFromWire, ratesToWire, type WireRates } from '../../attestation/receipt.ts';
import { openWritableSqlite } from '../sqlite-file.ts';
import { FileGuard } from '../store/file-guard.ts';
import type { IssuedTicket, ReceiptRecord } from './store.ts';

const SCHEMA = `
CREATE TABLE IF NOT EXISTS tickets (ticket_id TEXT PRIMARY KEY, expires_at INTEGER NOT NULL, ticket TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tickets_expiry ON tickets (expires_at);
CREATE TABLE IF NOT EXISTS receipts (n INTEGER PRIMARY KEY AUTOINCREMENT, ticket_id TEXT NOT NULL UNIQUE, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tallies (scope TEXT NOT NULL, key TEXT NOT NULL, receipts INTEGER NOT NULL, cost TEXT NOT NULL, PRIMARY KEY (scope, key)) WITHOUT ROWID;
`;

/** A ticket as the file keeps it (BigInt and rates as decimal strings). */
type StoredTicket = Omit<IssuedTicket, 'hold' | 'rates'> & { hold: string; rates: WireRates };

export interface Tally {
  receipts: number;
  cost: bigint;
}

/** A total as it stands after a receipt: the whole market's (scope total, key ''), a provider's or a model's. */
/** The scope of the receipts of providers (models) beyond the market's maxTallyKeys. */
export type OthersScope = 'provider_others' | 'model_others';

export interface TallyRow extends Tally {
  /** `*_others`: the receipts of providers or models beyond the market's maxTallyKeys (key ''). */
  scope: 'total' | 'provider' | 'model' | OthersScope;
  key: string;
}

/** What a market reads back at start. */
export interface MarketFileState {
  /** Tickets not yet pruned, in issue order. */
  tickets: IssuedTicket[];
  /** The newest `keep` receipt records, oldest first. */
  receipts: ReceiptRecord[];
  total: Tally;
  byProvider: Map<string, Tally>;
  byModel: Map<string, Tally>;
  /** The receipts of providers and models beyond the tallies kept, by scope. */
  others: Map<OthersScope, Tally>;
}

export class MarketDb {
  private readonly db: Database.Database;
  private readonly guard: FileGuard;
  /** Set once the file was deleted or replaced under the market: every write is refused from then on. */
  private lost: string | undefined;
  private readonly putTicketStmt: Database.Statement<[string, number, string]>;
  private readonly putReceiptStmt: Database.Statement<[string, string]>;
  private readonly bumpStmt: Database.Statement<[string, string, number, string]>;
  private readonly settleStmt: Database.Statement<[string, string]>;
  private readonly deleteTicketStmt: Database.Statement<[string]>;
  private readonly pruneTicketsStmt: Database.Statement<[number]>;
  private readonly pruneReceiptsStmt: Database.Statement<[number]>;
  private readonly addReceiptTx: (r: ReceiptRecord, ticket: IssuedTicket | undefined, tallies: TallyRow[]) => void;

  /** Opens (or creates) `file`; throws an Error naming the file when it cannot. */
  constructor(file: string) {
    const db = openWritableSqlite(file, { timeout: 0 }); // (a file another market holds is refused at once, not after 5 s)
    try {
      db.pragma('locking_mode = EXCLUSIVE');
      db.pragma('journal_mode = WAL');
      db.pragma('synchronous = FULL');
      db.exec('BEGIN EXCLUSIVE; COMMIT'); // (takes the lock now: a second market on the file is refused at once)
      db.exec(SCHEMA);
    } catch (e) {
      db.close();
      const busy = (e as { code?: unknown }).code === 'SQLITE_BUSY';
      throw new Error(`${file}: ${busy ? 'another market uses this file (its --data folder)' : (e as Error).message}`);
    }
    this.db = db;
    this.guard = new FileGuard(file);
    this.guard.seal(); // (its files as this connection left them: it is their only writer, an exclusive lock held)
    this.putTicketStmt = db.prepare('INSERT OR REPLACE INTO tickets (ticket_id, expires_at, ticket) VALUES (?, ?, ?)');
    this.putReceiptStmt = db.prepare('INSERT INTO receipts (ticket_id, record) VALUES (?, ?)');
    // (Sums are BigInt, worked out by the caller: SQLite's integers stop at 2^63.)
    this.bumpStmt = db.prepare('INSERT OR REPLACE INTO tallies (scope, key, receipts, cost) VALUES (?, ?, ?, ?)');
    this.settleStmt = db.prepare('UPDATE tickets SET ticket = ? WHERE ticket_id = ?');
    this.deleteTicketStmt = db.prepare('DELETE FROM tickets WHERE ticket_id = ?');
    this.pruneTicketsStmt = db.prepare('DELETE FROM tickets WHERE expires_at < ?');
    this.pruneReceiptsStmt = db.prepare('DELETE FROM receipts WHERE n <= (SELECT max(n) FROM receipts) - ?');
    this.addReceiptTx = db.transaction((r: ReceiptRecord, ticket: IssuedTicket | undefined, tallies: TallyRow[]) => {
      this.putReceiptStmt.run(r.ticket_id, JSON.stringify(r));
      if (ticket) this.settleStmt.run(JSON.stringify(storedTicket(ticket)), ticket.ticket_id);
      for (const t of tallies) this.bumpStmt.run(t.scope, t.key, t.receipts, t.cost.toString());
    });
  }

  /** Everything kept, for a market starting on this file: tickets expiring from `since` on, the newest `keep` receipts. */
  load(since: number, keep: number): MarketFileState {
    this.written(() => this.pruneTicketsStmt.run(since));
    const tickets = this.db
      .prepare<[], { ticket: string }>('SELECT ticket FROM tickets ORDER BY rowid')
      .all()
      .map((row) => {
        const t = JSON.parse(row.ticket) as StoredTicket;
        return { ...t, hold: BigInt(t.hold), rates: ratesFromWire(t.rates) };
      });
    const receipts = this.db
      .prepare<[number], { record: string }>('SELECT record FROM receipts ORDER BY n DESC LIMIT ?')
      .all(keep)
      .map((row) => JSON.parse(row.record) as ReceiptRecord)
      .reverse();
    const total: Tally = { receipts: 0, cost: 0n };
    const byProvider = new Map<string, Tally>();
    const byModel = new Map<string, Tally>();
    const others = new Map<OthersScope, Tally>();
    for (const row of this.db.prepare<[], { scope: string; key: string; receipts: number; cost: string }>('SELECT scope, key, receipts, cost FROM tallies').all()) {
      const t = { receipts: row.receipts, cost: BigInt(row.cost) };
      if (row.scope === 'total') Object.assign(total, t);
      else if (row.scope === 'provider') byProvider.set(row.key, t);
      else if (row.scope === 'model') byModel.set(row.key, t);
      else if (row.scope === 'provider_others' || row.scope === 'model_others') others.set(row.scope, t);
    }
    return { tickets, receipts, total, byProvider, byModel, others };
  }

  /**
   * Throws once the file (or its -wal) was deleted or replaced while the market used it: SQLite
   * would go on writing into the deleted file, and all of it would be gone at the next start; or
   * changed in place by something else (cut short, an older copy written over it): its next
   * checkpoint would mix what is left into the file. Checked before every write (a stat of two
   * files, twice), and the files' size and modification time noted after it.
   */
  private intact(): void {
    if (this.lost === undefined) {
      const gone = this.guard.changed();
      if (gone) this.lost = `${gone} was deleted or replaced while the market used it: it takes no more tickets or receipts (what it booked since it opened is in the file it still holds open; restart it on a file put back in place)`;
      const over = gone ? undefined : this.guard.writtenOver();
      if (over) this.lost = `${over} was changed in place while the market used it, by something other than the market (cut short, an older copy copied over it): it takes no more tickets or receipts (a checkpoint would mix what is left into the file); restart it on a file put back in place`;
    }
    if (this.lost !== undefined) throw new Error(this.lost);
  }

  /** Runs a write of this connection's, and notes the files as it left them (a commit may checkpoint). */
  private written<T>(run: () => T): T {
    try {
      return run();
    } finally {
      this.guard.seal();
    }
  }

  /** A ticket issued: durable before it is handed out. */
  putTicket(t: IssuedTicket): void {
    this.intact();
    this.written(() => this.putTicketStmt.run(t.ticket_id, t.expires_at, JSON.stringify(storedTicket(t))));
  }

  /** A receipt collected, its ticket (settled) and the totals with it counted: one transaction, durable before the market acknowledges it. */
  addReceipt(r: ReceiptRecord, ticket: IssuedTicket | undefined, tallies: TallyRow[]): void {
    this.intact();
    this.written(() => this.addReceiptTx(r, ticket, tallies));
  }

  forgetTicket(id: string): void {
    this.intact();
    this.written(() => this.deleteTicketStmt.run(id));
  }

  /** Deletes tickets that expired before `before`, and all but the newest `keep` receipt records (the totals keep counting them). */
  prune(before: number, keep: number): void {
    this.intact();
    this.written(() => {
      this.pruneTicketsStmt.run(before);
      this.pruneReceiptsStmt.run(keep);
    });
  }

  close(): void {
    this.db.close();
  }
}

function storedTicket(t: IssuedTicket): StoredTicket {
  return { ...t, hold: t.hold.toString(), rates: ratesToWire(t.rates) };
}
