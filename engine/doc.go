// Package engine is a bookie's storage engine: the role BookKeeper's DbLedgerStorage plays,
// on top of the journal, entry logs (package entrylog) and an index (package index, on pebble).
//
// # Layout
//
//	<journalDir>/current/<hex>.txn        journal files (package journal), one journal per dir
//	<journalDir>/current/VERSION          cookie
//	<ledgerDir>/current/<hex>.log         entry logs (package entrylog)
//	<ledgerDir>/current/lastId            highest entry-log id ever allocated
//	<ledgerDir>/current/lastMark[.<j>]    persisted LastLogMark of journal j (package journal)
//	<ledgerDir>/current/index/            pebble: entry locations and ledger states
//	<ledgerDir>/current/VERSION           cookie
//
// Ledger L is journaled in journal L mod len(journalDirs) and stored in ledger dir
// L mod len(ledgerDirs); each ledger dir has its own write cache, read cache, entry logs and
// index. Ledger state (master key, fenced, explicit LAC) lives in memory, keyed by ledger, and
// is persisted to the index of the ledger's dir.
//
// # The path of an add
//
//  1. The master key is compared in constant time; a fenced ledger refuses non-recovery adds. A
//     ledger's first add (or fence) creates it and queues its ledger-key record in the journal
//     before any data record of the ledger can be queued.
//  2. The stored entry is copied into the active write-cache half: an atomic bump allocation in
//     preallocated segments (no half-wide lock) and an insert into one of 64 xxhash-sharded index
//     maps, which also track each ledger's last entry.
//  3. The journal record points at that copy (no second copy in the engine); the half cannot be
//     recycled until the journal has finished with it. The caller's callback runs after the
//     journal write that holds the record is durable.
//
// When both halves are full, adds wait up to dbStorage_maxThrottleTimeMs for a checkpoint to
// recycle one, then fail with ErrTooManyRequests: they never block forever, and memory never
// grows beyond the two halves.
//
// # The path of a read
//
// Active half → half being flushed → read cache → index → entry log. An entry-log read reads
// ahead along the same ledger (dbStorage_readAheadCacheBatchSize entries) into the read cache, a
// ring of segments (dbStorage_readAheadCacheMaxSizeMb). Entry -1 means the last entry. Damage
// (a bad checksum, an index location holding another entry, an index error) is ErrIO, never
// ErrNoEntry.
//
// # Checkpoint (the order is the contract)
//
//  1. Snapshot every journal's LastLogMark.
//  2. In every ledger dir, in parallel: swap the write-cache halves (seal the active one and wait
//     for adds in progress on it);
//  3. write the sealed half to the entry log sorted by (ledger, entry), so a ledger's entries lie
//     together, and fsync it;
//  4. write its locations and every changed ledger state (even when no entry moved) to the index
//     as one synced batch; only then recycle the half.
//  5. Only after every dir has flushed, persist each journal's mark in every ledger dir (temp
//     file, fsync, rename, fsync dir), never backwards.
//  6. Only then delete (or keep for reuse) journal files wholly before the persisted marks.
//
// Everything at or before a snapshot mark was in the cache before the swap (an add is cached
// before it is journaled), so after step 4 the mark is covered. A failure at any step is sticky:
// adds are refused until restart and nothing later in the checkpoint runs. Checkpoints run every
// flushInterval and whenever a write-cache half fills.
//
// # Startup
//
// Cookies are checked first: every journal and ledger dir holds one (BookKeeper's text layout)
// naming the bookie id, the dirs and the cluster instance id. No cookie anywhere means a new
// bookie; a missing or different cookie in some dir is an error that says what to do, so a wiped
// or swapped disk is never served as empty. Then ledger states are loaded from the indexes, each
// journal is replayed from its highest persisted mark (re-applying ledger keys, fences, explicit
// LACs and entries; a half that fills during replay is flushed on the spot), the journals are
// opened for writing (each in a new file), and a checkpoint runs. Only then is the engine ready.
//
// # Deleting ledgers
//
// DeleteLedger drops the ledger's state and cached entries at once and removes its index rows (a
// range delete) at the next checkpoint. Its entries stay in entry logs until garbage collection.
// A ledger deleted after the last persisted mark can come back from journal replay after a
// crash; deletion is driven by the metadata store and is repeated by the next GC run.
package engine
