// Package dlog is the distributed-log API on top of ledgers, after BookKeeper's DistributedLog:
// named logs whose records keep the order they were written in, across as many ledgers as they
// need. Applications use a log as a write-ahead log or as a stream.
//
//	ns, _ := dlog.OpenNamespace(ctx, "etcd://127.0.0.1:2379/ledgers", dlog.Config{})
//	l, _ := ns.CreateLog(ctx, "orders")
//	w, _ := l.OpenWriter(ctx)              // takes ownership of the log
//	d, _ := w.Write(ctx, dlog.Record{TxID: 1, Payload: p})
//	r, _ := l.OpenReader(ctx, dlog.Head())  // or AtDLSN(d), AtTxID(1), Tail()
//	rec, _ := r.Next(ctx)                   // blocks at the end of the log
//
// # Model
//
// A [Namespace] is bound to a cluster's metadata service. A [Log] is an ordered list of
// segments; each segment is one ledger. A [Writer] owns the log (one at a time) and appends
// [Record]s; each record has a transaction id chosen by the application, which must increase
// (the writer refuses a record whose id is not greater than the previous one with
// [ErrTxIDNotIncreasing]). A record's position is its [DLSN]: (segment sequence number, entry
// id, slot id). Readers ([Reader]) start at a DLSN, a transaction id, the head or the tail, and
// return records in order, following the writer across segments and across writers.
//
// # Batching
//
// Records are gathered into batches, one ledger entry each, by the writer: a batch is sent
// once it holds [Config].OutputBufferSize bytes of records (writerOutputBufferSize), once its
// first record has waited [Config].PeriodicFlushFrequency (periodicFlushFrequencyMilliSeconds),
// on Flush, or at once when no batch is in flight (so a lone synchronous writer pays no
// timer), and before a record would take it past 1 MiB of records or past what the client's
// entry limit (its frame limit) leaves after the envelope's header, so that only a record too
// large for an entry on its own is refused. A single owner goroutine sends the batches in
// order, at most [Config].MaxInFlightEntries at a time; [Config].MaxOutstandingBytes bounds
// what Write accepts ahead of the acknowledgements. Records of one entry share the entry's
// acknowledgement; they complete in the order they were written. A batch the client refuses
// at once takes no entry id, so it gives its place back: it is sent again 5 ms later when the
// client had too many adds in flight (client.Config.MaxPendingAdds, shared by every log of the
// namespace), and any other refusal (an entry over the client's frame limit) stops the writer.
//
// A reader of a segment being written reads only up to the ledger's last-add-confirmed
// (LAC), which covers only entries the ack quorum acknowledged. The LAC travels in the next
// entry, so when the writer falls idle after a batch it sends a control entry (no records)
// that carries the LAC to readers.
//
// # Entry envelope, version 1
//
// Every entry of a segment's ledger is one envelope. Integers are big-endian. Wire format, do
// not change: a new layout is a new version byte.
//
//	offset  size  field
//	0       1     version = 1
//	1       1     flags: bit 0 = control entry (no records); other bits zero
//	2       4     record count n, uint32
//	6       8     records before: records in the segment's earlier entries, int64
//	14      8     first txid of the segment, int64 (-1: no record yet)
//	22      8     last txid of the segment up to and including this entry, int64 (-1: none)
//	30      4     CRC32C (Castagnoli) of bytes [0,30) followed by bytes [34,end)
//	34      ...   n records, each:
//	                8  txid, int64 (increasing within the entry)
//	                4  payload length L, uint32 (at most MaxRecordSize = 1 MiB − 8 KiB)
//	                L  payload
//
// A record's slot id is its index in the entry. The running counts in the header let the
// writer that recovers a segment learn its record count and transaction ids from its last
// entry alone, and let readers check that no entry of a segment went missing. The ledger's own
// digest covers the entry too; the CRC also guards the envelope where a ledger uses the DUMMY
// digest, and decoding checks every count against the bytes present (FuzzDecodeEnvelope).
// (DistributedLog's envelope instead holds a version byte, flags with a compression codec,
// the sizes, and a LogRecordSet with a 16-byte header; records there carry a metadata word.)
//
// # DLSN
//
// A DLSN is written as DistributedLog writes it: a version byte 1, then the segment sequence
// number, entry id and slot id as big-endian int64s (25 bytes; [DLSN.Bytes]); its string form
// is that in standard base64 ([DLSN.String], [ParseDLSN]). The first position of a log is
// [InitialDLSN] = (1, 0, 0).
//
// # Metadata
//
// Logs live in the metadata service's KV keyspace ([metadata.KV]; under <root>/kv/ for etcd):
//
//	dlog/logs/<name>                     the log's value
//	dlog/segments/<name>/<seq, 19 digits> one segment's value (key order = sequence order)
//	<root>/locks/dlog%2F<name>/<lease>   the writer lock (an etcd mutex; see below)
//
// Values are versioned text, ';'-separated decimal fields (after DistributedLog's segment
// metadata string):
//
//	log:     1;createdMs;lastSeqNo;maxTxID;truncSeq;truncEntry;truncSlot
//	segment: 1;seq;state;ledgerId;firstTxId;lastTxId;lastEntryId;records;bytes;createdMs;completedMs
//
// state is "i" (in progress: the writer may still add; the other fields are -1/0) or "c"
// (completed: the ledger is closed and the fields are final). lastSeqNo is the last segment
// sequence number ever used (sequence numbers are never reused, even when retention has
// deleted every segment), maxTxID the highest transaction id of a completed segment, and trunc
// the truncation point. Every change is a compare-and-set on the keys' versions, and the
// writer's changes are also guarded by its lock: a commit fails with [ErrLockLost] once the
// lock is gone. A new segment is written together with the log's lastSeqNo in one commit; a
// segment is completed together with the log's maxTxID.
//
// # Single writer, recovery and failover
//
// Opening a writer takes the log's lock: an etcd mutex (concurrency.Mutex: one key per
// contender, bound to the contender's lease of [Config].LockTTL, kept alive by the process;
// the oldest key holds the lock). A second writer waits. If the owner's process dies or is cut
// off from etcd for longer than the TTL, its lease expires, the key goes, and the next waiter
// gets the lock.
//
// The new owner then reads the log's segments and, for every segment left in progress, runs
// ledger recovery on its ledger (client.OpenLedger with recover): the ledger is fenced on its
// bookies, so the previous writer's adds fail from then on, and it is closed at the last entry
// that may have been acknowledged. It reads that last entry, completes the segment's metadata
// from the envelope's counts, and only then starts a new segment. (It also makes sure the
// newest completed segments' ledgers are closed, BookKeeper's rule of fencing the last two
// ledgers when chaining ledgers into a log.) A writer only ever writes to a segment it
// registered under its lock, and the lock guards every metadata commit, so after the new
// owner has read the segment list the old one can neither add a segment nor complete one; the
// one it was writing is fenced. Hence two writers never both get acknowledgements: the old
// writer's records are acknowledged only before the fence, and they are all in the recovered
// segment, before the new writer's.
//
// The old writer learns of the loss from its lease (Lock.Lost) and fails with [ErrLockLost];
// if it does not notice in time (a long pause), its next add fails with [ErrFenced] and its
// next metadata commit with [ErrLockLost]. As with any ledger, recovery keeps every entry it
// can read, so a record whose write failed with such an error (its outcome unknown, like a
// timeout) may still appear in the log; a record that was acknowledged always does.
//
// # Readers
//
// A reader opens each segment's ledger without recovery. In a completed segment it reads to
// the segment's last entry; in a segment being written it reads up to the LAC it learns from
// the bookies (client.Ledger.ReadLastAddConfirmed), and once caught up it polls for a new LAC
// every [Config].TailPollInterval (polling, not long-polling: the v2 protocol has no long-poll
// LAC read). It learns of completed and new segments from a watch on the log's segment keys
// (and re-reads them at least every second). So a record becomes visible to a tailing reader
// at most about TailPollInterval plus a few round trips after it was acknowledged. Readers
// check that each segment's entries follow each other without a gap, that each completed
// segment holds the records its metadata says, that segments follow each other without a gap,
// and that transaction ids increase; a violation is [ErrCorrupt]. Read errors (a bookie down,
// a changed ensemble) are retried with fresh ledger metadata.
//
// # Truncation and retention
//
// [Writer.Truncate] moves the log's truncation point forward: readers can no longer start
// before it. Retention passes ([Writer.Purge]; also when a writer opens and after every roll)
// delete, oldest first, the completed segments that lie wholly before the truncation point or
// were completed more than [Config].RetentionPeriod ago: first the segment's metadata (guarded
// by the lock), then its ledger (a failure there leaves an orphaned ledger, logged). Deleting
// an expired segment moves the truncation point past it. The segment being written is never
// deleted.
//
// [Namespace.DeleteLog] takes the writer lock, fences the segments left in progress (so a
// writer that lost its lock unnoticed gets [ErrFenced], never an acknowledgement), truncates
// the whole log, then deletes its segments, their ledgers and the log's value. A reader of the
// log then fails with [ErrNoSuchLog] ([ErrTruncated] while the delete runs).
//
// # Rolling
//
// The writer completes the current segment and starts the next, between two batches and with
// nothing in flight, once the segment holds [Config].MaxLogSegmentBytes (maxLogSegmentBytes)
// or, holding records, is older than [Config].LogSegmentRollingInterval
// (logSegmentRollingIntervalMinutes).
package dlog
