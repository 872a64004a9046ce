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
//	<ledgerDir>/current/index/            pebble: entry locations, ledger states and the
//	                                      tombstones of ledgers deleted while fenced
//	<ledgerDir>/current/VERSION           cookie
//	<journalDir>/LOCK, <ledgerDir>/LOCK   empty; an engine holds an flock on each while open
//	                                      (a second bookie on the same dirs is refused)
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
//     maps, which also track each ledger's last entry. Its CRC32C is computed once, there: the
//     journal record and, at the flush, the entry-log record carry it without checksumming the
//     entry again.
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
// ring of segments (dbStorage_readAheadCacheMaxSizeMb); a read that does not follow the
// previous read of its ledger reads just its entry. Entry -1 means the last entry. Damage
// (a bad checksum, an index location holding another entry, an index error) is ErrIO, never
// ErrNoEntry. After Open, each index that takes at most half its block cache is read into the
// cache in the background (indexWarmOnStart), so that a restarted bookie's reads cost one disk
// read, not two.
//
// # Checkpoint (the order is the contract)
//
//  1. Snapshot every journal's LastLogMark.
//  2. In every ledger dir, in parallel: swap the write-cache halves (seal the active one and wait
//     for adds in progress on it);
//  3. write the sealed half to the entry log sorted by (ledger, entry), so a ledger's entries lie
//     together, and fsync it; the writing is paced to end when the active half is about 3/4
//     full, so that a journal on the same disk keeps part of it (flushpace.go);
//  4. write its locations, every changed ledger state (even when no entry moved) and the
//     checkpoint record (the step-1 marks, below) to the index as one synced batch; only then
//     recycle the half.
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
// Before the replay each index's checkpoint record is held to the persisted marks. pebble takes
// damage at the end of its newest write-ahead log or manifest for a torn write and drops what
// follows, silently; a checkpoint's index updates and its record are one batch, so an index
// that lost some lost the record too. A record older than a persisted mark, or an empty index
// (one that lost everything looks new) once marks were persisted, means entries that no
// journal holds any more are gone from the index: the engine refuses to open (ErrIO) rather
// than answer "no such entry" for them. An index converted from an older format, which kept
// no record, gets the persisted marks as its baseline (also when the Open that converted it
// stopped before writing the baseline).
//
//	checkpoint record (the value of the index's checkpoint key; little-endian like mark files)
//	 0    1       3                 11               19
//	+----+-------+-----------------+----------------+---- ... ----+
//	| 01 | n     | journal 0 fileID | journal 0 offset | n−1 more  |
//	+----+-------+-----------------+----------------+---- ... ----+
//	 u8    u16     u64               u64
//
// Garbage collection's deletions and compaction's relocations are not journaled, so the record
// cannot vouch for them: before removing an entry log they made obsolete, the engine flushes
// pebble's memtable into its checksummed tables (index.Index.Flush), so that no damage at the
// end of the WAL can leave the index pointing into a removed log.
//
// # Deleting ledgers
//
// DeleteLedger drops the ledger's state and cached entries at once and removes its index rows (a
// range delete) at the next checkpoint, or earlier when garbage collection commits pending
// deletions. Its entries stay in entry logs until garbage collection. An add that found the
// ledger before the deletion (the ledger's addMu orders them) has its entry in the cache before
// the deletion drops the cached entries, or looks the ledger up again and is refused like any
// add to a deleted id: no entry of a deleted ledger reaches the index after its range delete. A ledger deleted after the
// last persisted mark can come back from journal replay after a crash (a known issue: the
// journal has no deletion record); deletion is driven by the metadata store and is repeated by
// the next GC run.
//
// A ledger that was fenced when deleted refuses every write (ErrFenced) for 7 days: its old
// writer must not create it again and be acknowledged for entries nothing can read (BookKeeper
// #4462, whose fix keeps this in memory, so a restart forgets it). Here it survives restarts:
// the index batch that commits the deletion also writes the ledger's fenced-deleted tombstone
// (package index, keyspace 04), dated by the wall clock, so a crash keeps both or neither. Open
// loads the tombstones younger than 7 days and drops the others; journal replay skips the
// records of a ledger that has one (they predate its committed deletion, so such a ledger
// does not come back); garbage collection runs drop tombstones as they expire. The bound on
// their number and size is at fencedDeletedRetention.
//
// # Garbage collection and compaction
//
// One goroutine runs garbage collection every gcWaitTime, when an operator triggers it
// (TriggerGC) or when RunGC is called; runs are one at a time. A run:
//
//  1. Finds deleted ledgers. With a LedgerChecker (the bookie's metadata store), every local
//     ledger is point-read at most gcMetadataOpRateLimit times a second, each read bounded in
//     time; a ledger is deleted (DeleteLedger) only when the read says for certain that it is
//     gone. An error or timeout stops the scan and deletes nothing more. A checker that can list
//     its ledgers narrows the point reads to the ledgers the listing lacks: a listing never
//     deletes anything by itself (BookKeeper #870), and a listing error deletes nothing.
//  2. Accounts live data per completed entry log (one this instance no longer writes: neither
//     the current log, nor a sealed one awaiting finalization, nor one being prepared). A log's
//     ledgers map (rebuilt by a scan when missing or damaged) is read once and cached; a ledger
//     is dropped from the cached maps once the engine no longer has it and the index holds none
//     of its locations (its deletion is committed). Pending deletions are committed (one synced
//     index batch) before, so that a crash cannot bring back a ledger whose logs are gone. Logs
//     with no live ledger left are removed.
//  3. Compacts, when majorCompactionInterval is due (or an operator forced it), the logs whose
//     live share is below majorCompactionThreshold, else, when minorCompactionInterval is due,
//     those below minorCompactionThreshold; never both in one run, emptiest logs first, within
//     *CompactionMaxTimeMillis, reads and writes each limited to compactionRateByBytes. Major
//     compaction pauses while disk usage is at or above diskUsageWarnThreshold, minor at or
//     above diskUsageThreshold (compaction writes before it frees, and a failed entry-log write
//     stops the engine), unless an operator forced the run and isForceGCAllowWhenNoSpace is set.
//     An operator can suspend either kind. A log that cannot be read is reported, kept and
//     skipped until restart; the run goes on with the others (BookKeeper #4544).
//
// # Compaction protocol
//
// Compaction writes through the same entry log as checkpoints: the current log of the dir, with
// the same single writer, because the entry log allows one writer at a time and each dir's
// flushMu already serializes its writers. flushMu is held by a checkpoint's flush, by each
// compaction chunk and by the commit of pending deletions; every index write that can change a
// location (flushed locations, compaction's updates, range deletes) happens under it, and each
// such commit bumps the dir's indexSeq. Compacting a completed log L:
//
//  1. Scan L (reading at most compactionRateByBytes). An entry is live when its ledger is alive
//     and the index holds exactly this record's location: an entry written again later (now
//     elsewhere, or waiting in the write cache) is not copied. Live entries are collected into
//     chunks of about 1 MiB, with indexSeq noted before the chunk's first look-up.
//  2. For each chunk, take flushMu. If indexSeq moved since, look every entry up again (a
//     checkpoint or a deletion wrote the index meanwhile) and drop those that no longer point
//     into L. Add the rest to the current entry log and Flush it (fsync); then write their new
//     locations to the index in one synced batch; release flushMu. Checkpoints wait for at most
//     one chunk; adds never wait for compaction (only for a checkpoint when both write-cache
//     halves are full).
//  3. After the last chunk, commit pending deletions, take logsMu exclusively and release it at
//     once, then remove L and fsync the directory.
//
// Reads hold logsMu shared from their index look-up to the end of their entry-log read, so the
// barrier in step 3 waits for every read that may have looked up a location in L before the
// index moved; reads that start later find the new locations. A location is published in the
// index only after the entry log's Flush covered it, so a read never sees a location it cannot
// read yet. Reads served from the write cache or the read cache do not care where an entry
// lies. Crash safety follows from the order: until the synced index batch of step 2 the index
// points into L, which is intact; after it, the copies are durable (fsynced before); L is removed
// only after every chunk's batch is synced. A crash leaves at worst copies no location points at
// (their ledger still counts them in the new log's ledgers map, so they are reclaimed only when
// the ledger dies), or, between the removal and the directory fsync, L itself back on disk, with
// no location pointing into it. Log ids are never reused (package entrylog), so a location can
// never point into a different log of the same id.
package engine
