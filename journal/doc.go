// Package journal is the bookie's write-ahead log: records are group-committed to files in one
// directory with O_DIRECT writes through the diskio seam (io_uring or pwrite), and acknowledged
// only after the write that holds them is durable.
//
// # Files
//
// A journal directory holds files named "<hex id>.txn" (lower-case hex, no padding, as in
// BookKeeper). Ids only grow: a writer always starts a new file above every existing one.
// All integers are little-endian. Wire format: do not change; versions only move forward.
//
//	file header block (one alignment unit, records start after it)
//	 0       8      16       24         32      36       40      44     48      52
//	+--------+--+--+--------+----------+-------+--------+-------+------+-------+-- zeros --+
//	|RKJOURNL|v |al| fileID | created  | depth | groupC | maxPl | flags| crc32c|           |
//	+--------+--+--+--------+----------+-------+--------+-------+------+-------+-----------+
//	  magic  u32 u32  u64     unix ns    u32     u32      u32    u32   over [0,48)
//	v = format version (1); al = alignment (header size, journalAlignmentSize, ≥ the file
//	system's direct-I/O alignment); depth, groupC and maxPl are the writer's pipeline depth,
//	group buffer capacity and largest payload (replay uses them to bound a torn tail);
//	flags bit 0 = the first file of a writer session; bit 1 = written with journalSyncData off
//	(groups unsynced: replay judges a damaged record by the groups' durable claims only).
//
//	record
//	 0       4        8    9         12          20          28           32
//	+-------+--------+----+---------+-----------+-----------+------------+----------------+
//	| hcrc  | length |type| 0 0 0   | ledgerId  | entryId   | payloadCRC | payload[length]|
//	+-------+--------+----+---------+-----------+-----------+------------+----------------+
//	hcrc = CRC32C of bytes [4,32) seeded with CRC32C(fileID): a record is valid only in the file
//	it was written for, so stale bytes of a reused or preallocated file never verify.
//	payloadCRC = CRC32C(payload), computed by the producer in Append (or given with
//	Entry.SetPayloadCRC).
//	type: 1 data (payload = stored entry), 2 ledger key (payload = master key), 3 fence,
//	4 explicit LAC (payload = LAC packet), 5 padding (group trailer), 6 file end (ledgerId =
//	the id of the next file).
//
// # Groups
//
// The writer goroutine takes whole batches from the bounded queue (journalQueueSize) and lays
// records into an aligned buffer. A group is committed when a pipeline slot is free and the
// queue has run empty (journalFlushWhenQueueEmpty, default on), the group holds
// journalBufferedWritesThreshold bytes, or its oldest record has waited journalMaxGroupWaitMSec.
// Every group ends with a padding record that fills it up to the alignment, so each group is
// one aligned write at an aligned offset and groups never share a block: the partial last block
// is padded, never rewritten, so no write ever touches bytes of an acknowledged group.
//
//	group:  [record][record]...[record][padding: ledgerId = durable claim, entryId = group seq]
//	         ^ aligned offset                                       aligned end ^
//
// The padding record's ledgerId field is the group's durable claim: the file offset below which
// every byte was durable when the group was submitted.
//
// Up to PipelineDepth groups are in flight at once (default 2): the next group's write overlaps
// the previous one's sync. With journalSyncData on, each group is written with RWF_DSYNC (a FUA
// write on devices that support it); with it off, groups are only written and one group per
// journalPageCacheFlushIntervalMSec is followed by a full fdatasync. Completions are re-ordered,
// the LastLogMark advances to the end of the last durable group, and callbacks run strictly in
// journal order on a callback goroutine, only after the write that holds them is durable.
//
// A write or sync error is sticky: that group and every later record fail with it, nothing is
// retried, and the journal stops accepting records.
//
// # Rollover, preparation and reuse
//
// A file rolls over before a group could cross journalMaxSizeMB. The writer first waits for
// every group of the old file, then writes a synced file-end record, and only then writes to the
// new file. The next file is prepared ahead by a background goroutine: created, its space
// reserved (fallocated; by default then zero-filled, see PreallocMode), its header written, the
// file and directory fsynced. The zero-filling comes last and is paced (zeroFillRate, 128 MiB/s):
// unpaced, it took the whole disk from commits on the same disk for as long as a file took to
// fill; a writer that rolls over before it is done stops it and takes the file with the rest
// fallocated. A preparation that failed (a disk full for a moment) is retried once when the
// writer needs the file, under the same id, a leftover of the failed attempt removed first, so
// no other file ever lies between a file and the next one. Files that journal GC would delete
// are kept for reuse instead (journalReuseFiles, up to MaxRecycled): reusing a file renames it and rewrites its header. In
// both cases the extents are already written, so a commit's sync never has to convert unwritten
// extents, which on ext4 costs a metadata journal commit per sync: a lone 4 KiB commit took
// 280-310 µs into fallocated space and 190 µs into written space (BENCHMARKS.md). Zero-filling
// costs one extra write of each new file, off the hot path; once checkpoints let old files go,
// files are recycled and each byte is written once. The first file of a writer session is
// prepared while Open waits, so only its first 256 MiB are zero-filled (the rest fallocated).
//
// # Replay and torn tails
//
// Replay reads from the persisted mark. A file must end with a file-end record unless it is
// the last file of a writer session. The file a file-end record names must exist and be the
// next file (it was prepared before the record was written, and GC never removes a file at or
// after the mark): if it is missing, replay fails with ErrMissingFile. At the first invalid record (bad CRC, short, zeros, another
// file's record) replay decides between a torn tail and corruption: up to PipelineDepth groups
// may have been in flight at a crash, each at most groupCapacity long, so valid groups may lie
// after a torn one, but only within depth × groupCapacity, and each of them claims a durable end
// at or before the torn group's start. A valid group beyond that window, or one whose claim
// covers the invalid record, proves the record was once durable: that is corruption, reported
// with the file and offset (unless skipReplayJournalInvalidRecord). Otherwise the tail is torn:
// it is dropped, never returned, and cut off the file. A read error is always an error.
//
// One case cannot be told apart: bit rot in the very last acknowledged group of the last file,
// when nothing written after it survived, looks like a torn tail.
//
// # LastLogMark
//
// The in-memory mark (file id, offset) advances only when a group is durable. MarkStore persists
// it (temp file, fsync, rename, fsync dir) in every ledger directory, never backwards; at start
// the highest persisted mark wins. Mark file: "RKLOGMRK" | u32 version | u32 0 | u64 file id |
// u64 offset | u32 CRC32C of the first 32 bytes.
package journal
