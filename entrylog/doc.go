// Package entrylog holds the bookie's entry logs: the files that the storage engine's flusher
// writes stored entries to, sorted by (ledger, entry), at each checkpoint, and that reads fetch
// entries from by location. It is BookKeeper's DirectIO entry logger (DbLedgerStorage) with
// checksummed records: every write is an aligned O_DIRECT write through the diskio seam
// (io_uring or pwrite), every read an aligned O_DIRECT read, and every record carries CRC32Cs so
// the bookie itself detects bit rot.
//
// # Files
//
// A directory (a ledger dir's "current") holds logs named "<hex id>.log" (lower-case hex, no
// padding, as in BookKeeper) and a file "lastId". Log ids start at 1 and are never reused: the
// highest id ever allocated is persisted in lastId (temp file, fsync, rename, fsync dir) before
// the log is created, and Open starts above max(lastId, every existing log). Logs are created
// exclusively, fallocated to logSizeLimit, get their header written and synced, then the
// directory is synced. The next log is prepared in the background once the current one is half
// full, so a roll does not wait for that; if that preparation failed (a disk full for a moment),
// the roll prepares a log again, once, before it fails the writer.
//
// All integers are little-endian. Wire format: do not change; versions only move forward.
//
//	log header block (offset 0, one alignment unit: 4096 bytes, or the device's direct-I/O
//	alignment if larger; records start right after it)
//	 0          8     12     16       24          32      36      40      44      48
//	+----------+-----+------+--------+-----------+-------+-------+-------+-------+-- zeros --+
//	| RKENTLOG | ver | hsz  | logId  | mapOffset | mapN  | maxEn | flags | crc32c|           |
//	+----------+-----+------+--------+-----------+-------+-------+-------+-------+-----------+
//	   magic    u32   u32     u64       u64        u32     u32     u32    over [0,44)
//	ver = format version (1); hsz = header block size (the alignment); logId = the id in the
//	file name; mapOffset, mapN = offset of the ledgers map and its number of ledgers, both 0
//	until the log is finalized; maxEn = the writer's MaxEntrySize (bounds record lengths for a
//	scan); flags = 0. The header is written when the log is created and rewritten once, when it
//	is finalized, only after the data and the map are durable: a header that names a map is
//	always backed by it. All fields lie in the first 512-byte sector, so the rewrite cannot tear.
//
//	record (any offset after the header; records are packed, not aligned)
//	 0       4        8    9       12          20          28           32
//	+-------+--------+----+-------+-----------+-----------+------------+-----------------+
//	| hcrc  | length |type| 0 0 0 |     a     |     b     | payloadCRC | payload[length] |
//	+-------+--------+----+-------+-----------+-----------+------------+-----------------+
//	hcrc = CRC32C of bytes [4,32), seeded with CRC32C(LE u64 logId): a record verifies only in
//	the log it was written for, so bytes of another log never pass for a record of this one.
//	payloadCRC = CRC32C(payload), computed by Add (or given to AddChecksummed).
//	type 1, data:        a = ledgerId, b = entryId, payload = the stored entry (opaque, at most
//	                     MaxEntrySize bytes). Its Location is (logId << 32) | offset of hcrc.
//	type 2, padding:     a = durable claim, b = 0, payloadCRC = 0, payload = zeros up to the
//	                     first aligned offset at least 32 bytes past the padding's start (not
//	                     checksummed; it carries nothing).
//	type 3, ledgers map: a = number of ledgers in the whole map, b = chunk index (0, 1, ...),
//	                     payload = up to 4096 pairs, ledger order:
//	                     +----------------+------------------+
//	                     | ledgerId (u64) | bytes (u64)      |  × n
//	                     +----------------+------------------+
//	                     bytes = the total size of the ledger's records in this log (32-byte
//	                     header plus stored entry each).
//
//	a log
//	+--------+-------------------------------+------+------------------------+------+------+---
//	| header | data records ... (1st Flush)  | pad  | data records ... (2nd) | pad  | ...  |
//	+--------+-------------------------------+------+------------------------+------+------+---
//	0     4096                               aligned ^                 aligned ^
//	   ... | data | map chunk 0 | map chunk 1 | ... | pad | zeros (fallocated) ... logSizeLimit
//	               ^ mapOffset (finalized logs)       aligned ^
//
//	lastId file: "RKLASTID" | u64 highest id ever allocated | u32 CRC32C of the first 16 bytes
//
// # Writing
//
// One writer at a time calls Add and Flush (the engine's checkpoint flush or its compaction,
// serialized by a lock); they are not safe for concurrent use. Add copies a record into an
// aligned write buffer (WriteBufferSize, 4 MiB); a full buffer is submitted as one O_DIRECT
// write without a sync, and the writer goes on filling the next of WriteBuffers buffers while
// it is written. Records span buffer boundaries. Flush ends the current run of records with a
// padding record up to the alignment, writes the partial buffer, waits for every write and
// fdatasyncs; later records start at the next aligned offset, so a flushed block is never
// written again and a crash can only tear data written after the last completed Flush. A write or sync error is sticky: every later Add and Flush fails with
// it, and nothing is retried.
//
// A log rolls when the next record would cross logSizeLimit: it is sealed (its ledgers map and a
// padding record are appended, without waiting) and the writer switches to the prepared log.
// The sealed log is finalized by the next Flush, roll or Close: wait for its writes, fdatasync,
// rewrite the header with the map's offset and count, fsync. Close seals and finalizes the
// current log too.
//
// # Garbage collection
//
// CompletedLogs lists the logs whose contents never change again (finalized by this instance, or
// left by an earlier run); only those may be compacted or removed, and Remove refuses the others.
// Remove unlinks a log and fsyncs the directory; reads that hold a handle on it finish.
//
// # Reading
//
// Read, ReadAhead, Scan and LedgersMap are safe for concurrent use, with each other and with the
// writer. They read through their own read-only O_DIRECT handles into buffers from bounded pools
// of aligned buffers (never the write buffers), so they cannot race with buffer reuse. In a log
// this instance is writing, only what the last completed Flush covered may be read: a location
// returned by Add is readable once the Flush after it has returned (the engine serves newer
// entries from its write cache); before that, Read reports ErrBadLocation. A Read reads the
// sectors that hold the record (the device's direct-I/O alignment, 512 bytes on most, while
// writes stay in 4 KiB blocks; its first read covers a record of ReadHint bytes), verifies both
// CRCs and the ledger and entry ids. Damage is an error wrapping ErrCorrupt that names the file
// and offset, never "not found".
//
// # Torn tails and corruption
//
// A scan (Scan, and LedgersMap when it rebuilds a map) stops cleanly at the end of the valid
// data. At an invalid record it decides between the end of what was durably written and
// corruption. Everything before a finalized log's map offset was durable, and so is everything
// before the last completed Flush of a log this instance writes: a bad record there is
// corruption. Otherwise (a log left unfinalized by a crash) the bytes after the last completed
// Flush may be any mix of written and unwritten sectors, valid records among them, so valid
// records after a bad one prove nothing by themselves. Each padding record therefore carries a
// durable claim: the offset of the end of the log's last completed Flush when it was written.
// If any valid padding after the bad record claims an offset beyond it, the bad record was
// durable once: corruption. Otherwise the scan ends there. A file that ends before the offset
// it proves durable (a finalized log shorter than its map offset, whatever lies before the cut)
// is corruption too: nothing legitimate produces one, and a scan never ends short of it cleanly.
//
// One case cannot be told apart: damage inside the last completed Flush of a log that a crash
// left unfinalized, when no later Flush's padding survived; it ends the scan like a torn tail.
// Reads of the entries there still fail their checksums with ErrCorrupt.
package entrylog
