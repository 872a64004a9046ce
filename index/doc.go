// Package index is the entry-location and ledger-state index of one ledger directory: the
// role of BookKeeper's EntryLocationIndex and LedgerMetadataIndex (two RocksDB instances in
// DbLedgerStorage), kept here in one pebble database with a one-byte keyspace prefix, so that
// one synced WAL write covers both in a checkpoint.
//
// # Keys and values
//
// All integers are big-endian, so keys sort by (keyspace, ledger id, entry id). Ledger and
// entry ids are non-negative int64 (ErrBadID otherwise), stored as uint64. Wire format: do not
// change; the format version only moves forward.
//
//	format record (written once, synced, into a new store; checked at Open)
//	key    0    1                 7        value  0        4         8
//	      +----+-----------------+               +--------+---------+
//	      | 00 | "format"        |               | "RKIX" | version |
//	      +----+-----------------+               +--------+---------+
//	                                               magic    u32 (3)
//	format 2 had no checkpoint record (Open adds an empty one); format 1 kept one location per
//	entry (Open converts them to runs). A converted store also holds the key 00 "upgraded"
//	(empty value) until its first checkpoint record is committed (Index.Upgraded).
//
//	checkpoint record (format 3; every store has one, empty until the first checkpoint)
//	key    0    1                      11       value: opaque, at most MaxCheckpointLen bytes
//	      +----+----------------------+         (the engine's journal marks, written in the
//	      | 00 | "checkpoint"         |          batch of each checkpoint's index updates)
//	      +----+----------------------+
//	pebble takes damage at the end of its newest write-ahead log or manifest for a torn write
//	and drops what follows it, silently. The engine compares the record with the marks it
//	persisted: a record older than them, or none, means writes the journals no longer hold
//	were lost.
//
//	ledger state
//	key    0    1            9
//	      +----+------------+
//	      | 01 | ledgerId   |
//	      +----+------------+
//	value  0     1       2          4            4+n                 8+n
//	      +-----+-------+----------+------------+-------------------+-----------+
//	      | ver | flags | keyLen n | masterKey  | lacLen m (if LAC) | LAC[m]    |
//	      +-----+-------+----------+------------+-------------------+-----------+
//	       u8=1   u8      u16        n bytes      u32                 m bytes
//	flags: bit 0 exists, bit 1 fenced, bit 2 limbo (reserved), bit 3 deleted (reserved),
//	bit 4 has explicit LAC (then lacLen and LAC follow; m may be 0). Other bits must be 0.
//	The value ends exactly after the last field; anything else is ErrCorrupt.
//
//	run of entry locations (format 2 and 3)
//	key    0    1            9                   17
//	      +----+------------+-------------------+
//	      | 03 | ledgerId   | last entryId      |
//	      +----+------------+-------------------+
//	value (uvarint: unsigned LEB128; varint: zigzag LEB128, as encoding/binary)
//	      +---------+-------------+-----------+----------------------------------------+
//	      | count n | span        | loc 0     | n−1 × (entry delta ‖ location delta)  |
//	      +---------+-------------+-----------+----------------------------------------+
//	       uvarint   uvarint       uvarint     uvarint ≥ 1     varint (wraps mod 2^64)
//	n in [1, 64]; the first entry is last − span; entry i = entry i−1 + delta i and must end
//	exactly at the key's last entry; location i = location i−1 + delta i. A location is a
//	u64, opaque here (BookKeeper: logId<<32 | offset).
//
//	entry location (format 1; converted to runs by Open)
//	key    0    1            9            17       value  0                 8
//	      +----+------------+------------+               +-----------------+
//	      | 02 | ledgerId   | entryId    |               | location (BE)   |
//	      +----+------------+------------+               +-----------------+
//
//	fenced-deleted tombstone (format 3, keyspace added later: see below)
//	key    0    1            9        value  0     1                      9
//	      +----+------------+               +-----+----------------------+
//	      | 04 | ledgerId   |               | ver | deletedAt            |
//	      +----+------------+               +-----+----------------------+
//	                                          u8=1  i64: wall-clock time of the deletion,
//	                                                Unix nanoseconds
//	A ledger that was fenced when it was deleted (a recoverer fenced it, then it was deleted)
//	leaves one, written by Batch.DeleteFencedLedger in the very batch that deletes the ledger's
//	state and runs: a crash keeps both or neither. While it is there, the engine refuses every
//	write that would create the ledger again (BookKeeper #4462: the old writer's next add would
//	otherwise be acknowledged for an entry nothing can read); it drops it after 7 days
//	(Batch.DropFencedDeleted). Any other value length or version is ErrCorrupt.
//
//	Keyspace 04 came without a format bump, on purpose: the format version says what a reader
//	must understand to read the store correctly, and a build that predates keyspace 04 reads
//	only the keyspaces it knows through bounded iterators (its look-ups, Ledgers and its run
//	merges never see 04 keys; Warm reads every key but decodes none), so it opens such a store
//	and serves it correctly, only without the tombstones' protection, as it always did. A
//	format-3 store without keyspace 04 (written before it) simply holds no tombstones. Bumping
//	the version would have made a roll-back refuse the store (ErrVersion) that the older build
//	reads correctly.
//	After a roll-back and a roll forward a tombstone may sit beside a state of the same ledger
//	(the older build created the ledger again); the engine then keeps the ledger and drops
//	the tombstone.
//
// Keyspace 05 and above are unused. Every stored key and value is validated when read: a
// wrong length, an unknown version or flag, or a key outside the range it was read from is
// an error wrapping ErrCorrupt, never a panic. pebble checksums its own blocks and WAL
// records; its corruption errors are wrapped with ErrCorrupt too.
//
// # Runs
//
// A checkpoint writes each ledger's entries together into the entry log, so one key per run
// of up to 64 of them replaces one key per entry: about 3 bytes of value per 1 KiB entry
// instead of a 25-byte key and value, and 64 times fewer keys for pebble to insert, flush and
// compact (that was 36% of the bookie's CPU, and compactions 23% more, in `bench storage` on
// 2 cores; BENCHMARKS.md). Entries of a run need not be consecutive (a bookie of a striped
// ensemble holds every other or every third entry) nor in one log.
//
// A ledger's runs never overlap: each holds entries in (end of the previous run, its key's
// last entry]. So the run that may hold an entry is the first one at or after (ledgerId,
// entryId): Location is one SeekGE and a decode of the whole run (only its end check tells a
// damaged run from a good one), and LastEntry is the ledger's last key. 64 entries keep that
// decode to a fraction of the seek (with 256 it was a third of a look-up). Commit keeps the
// invariant: it sorts the batch's locations, and for each ledger reads the stored runs that
// the new entries' range overlaps (one SeekGE; none for a ledger written in order), merges them
// with the new locations (new ones win), deletes them and writes the merged list as new runs,
// all in the one atomic batch. Commits of an index are serialised, so the merge reads what no
// other commit is changing. Re-added entries (journal replay), compaction's relocations (any
// subset of a run) and recovery adds all take that path.
//
// # Look-ups
//
// The look-ups iterate within the ledger's own bounds, [(ledgerId, from), (ledgerId+1, 0)).
// The bounds matter after mass deletions (BookKeeper #2686, #4529): range tombstones of
// other ledgers lie outside them and are never scanned.
//
// # Durability
//
// Writes go through a Batch, committed atomically. pebble's WAL stays on: a Commit(true)
// returns after the WAL record holding the batch is fsynced, so the batch, and every batch
// committed before it, survives a process kill and a power loss. A Commit(false) is visible
// at once but may be lost in a crash until a later synced commit (Commit(true) on an empty
// batch still writes and syncs a WAL record: the checkpoint's "sync the ledger state even if
// no entry moved"). The engine's checkpoint writes the locations of the flushed write cache
// and the changed ledger states into one batch and commits it with sync, after the entry log
// is fsynced and before the journal mark is persisted.
//
// A failed WAL write or fsync is fatal inside pebble: it calls its logger's Fatalf, which
// here logs and panics with a *fatalError. A commit recovers it: the commit fails with
// ErrFailed, as does every later one (pebble's commit pipeline cannot go on), reads go on,
// and Close leaves the database to the process's exit. Nothing is retried. A Fatalf in
// pebble's own goroutines (a failed MANIFEST write during a flush) still ends the process.
//
// # Performance
//
// go test -bench . -benchmem ./index/ on a 2-core AMD EPYC VM (default config, page cache
// warm, so "cold" means a block-cache miss served by the OS, not by the disk):
//
//   - PutLocation into a reused batch: ~5 ns, 0 allocations (format 1, a pebble Set per
//     location: ~19 ns).
//   - A checkpoint of 100k locations committed with sync: ~10 ms (~100 ns per location) with
//     4 entries per ledger, the worst case for runs (format 1: ~36 ms, ~360 ns).
//   - 256 ledgers × 16k entries, 200 per ledger per checkpoint (bench storage's shape):
//     Location ~5 µs, LastEntry ~7 µs.
//   - 1M ledgers × 4 entries: Location ~3.3 µs, a miss ~2.9 µs (no bloom filter helps a
//     SeekGE; format 1's point Get: ~4.1 and ~2.2 µs), LastEntry ~4.5 µs. With a 64 MiB
//     block cache, which the index does not fit, look-ups take 25–40 µs: size BlockCacheSize
//     to the index.
//   - 200k ledgers with 90% deleted by range deletions: LastEntry ~3 µs on survivors and
//     ~2.5 µs on deleted ledgers.
package index
