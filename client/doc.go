// Package client is the ledger API: BookKeeper's client protocol (quorum replication, fencing,
// recovery, ensemble change) over the v2 wire protocol (package net/transport), with ledger
// metadata in the metadata service (package metadata).
//
//	c, _ := client.New(ctx, client.DefaultConfig("etcd://127.0.0.1:2379/ledgers"))
//	lh, _ := c.CreateLedger(ctx, client.CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: pw})
//	id, _ := lh.Append(ctx, data)                     // or AppendAsync(data, func(id, err) {...})
//	_ = lh.Close(ctx)
//	r, _ := c.OpenLedger(ctx, lh.ID(), pw, true)     // true: fence and recover first
//	for e, err := range r.Entries(ctx, 0, r.LastAddConfirmed()) { ... }
//
// # Writes
//
// Entry e goes to bookies (e+i) mod E of the current ensemble, i < Qw, and completes at Qa
// acknowledgements; completions are delivered strictly in entry order and each entry carries
// the LAC (the last entry whose add completed). A bookie that fails an add is replaced through
// the PlacementPolicy (by a bookie this handle replaced within BookieQuarantineTime only if no
// other is left): the metadata is CAS'd with a new ensemble starting at LAC+1 and the adds in
// flight are resent to the replacement before any callback runs. An add's callback never runs
// before every send of it has copied its data (the caller may reuse the buffer from the
// callback on). A writer whose ledger another client recovered learns it with ErrLedgerFenced
// (and ErrLedgerClosed once the recovery closed it), from its adds, an ensemble change or
// Close; with no bookie to replace a failed one the handle fails (ErrNotEnoughBookies) and
// Close still closes it at its LAC. A bookie that answers an add EBADREQ (an entry within
// Config.Transport.MaxFrameSize but over the bookie's nettyMaxFrameSizeBytes) fails the handle
// with ErrEntryTooLarge and no ensemble change: any bookie would be sent the same entry.
//
// A client has at most Config.MaxPendingAdds adds in flight, all ledgers together; an append
// over that is refused at once with ErrTooManyPendingAdds (not written, no entry id taken, the
// handle stays usable), so a caller's overload never reaches a connection's own limit, which
// the transport answers with ErrTooManyPending and the client takes for a lagging bookie.
//
// # Stored entries
//
// What a bookie stores for an entry (BookKeeper's format; all integers big-endian):
//
//	 0        8        16       24       32
//	+--------+--------+--------+--------+-----------+---------+
//	|ledgerId|entryId | LAC    | length | digest[N] | payload |
//	+--------+--------+--------+--------+-----------+---------+
//
// length is the ledger's total payload length up to and including this entry. The digest
// (N = 4 CRC32C, the default; 8 CRC32; 20 HMAC-SHA1 keyed by SHA1("mac" ‖ password); 0 none)
// covers the 32-byte header and the payload. Reads verify it; a mismatch is logged with the
// bookie's address and the next replica is read. The master key bookies check is
// SHA1("ledger" ‖ password).
//
// # Recovery (OpenLedger with recover)
//
// The metadata goes to IN_RECOVERY (CAS); fencing reads of the last entry go to the last
// ensemble until every write quorum has fewer than Qa unknown answers; the LAC starts at
// max(the LACs returned, the last ensemble's first entry − 1); entries are then read forward
// with fencing and re-added to their whole write quorum with RECOVERY_ADD, up to the first
// entry that at least Qw−Qa+1 bookies report missing (an I/O error or a bad digest is never
// counted as missing); finally the metadata is CAS'd to CLOSED with that last entry and the
// length. A bookie that fails (or hangs on) a recovery add is replaced for the rest of the
// recovery, in recovery's own copy of the metadata, whose ensembles go into the closing CAS
// only (BookKeeper #1621); with no replacement, Qa copies do. Concurrent recoverers converge
// on the same end. ReopenLedgerForWrite (for tools) runs the same reads and re-adds, without
// fencing and without the close, and writes on after the last entry recovered.
//
// # Reads
//
// A read goes to the replicas of the entry's write set one at a time, to the next one after
// an error or after SpeculativeReadTimeout without an answer. Range reads and Entries keep
// ReadWindow entries in flight. Reads return when their ctx ends, a send blocked on a full
// connection queue (transport.Conn.ReadContext) or a wait for another caller's metadata
// refresh included, with the ctx's error; reads of a closed Client fail with ErrClosed.
//
// # Connections
//
// One connection per bookie (net/transport), shared by every ledger of the Client. Ensembles
// name bookies by id, their plaintext address; with Config.Transport.TLS set, the client dials
// each bookie at the TLS endpoint it registered instead (bookie-tls, its tlsPort), learnt from
// the watcher and kept after the bookie leaves the registry.
//
// # Goroutines
//
// One watcher goroutine per Client follows the writable bookies in the metadata service;
// ensemble changes run on their own goroutine per ledger, one at a time. Callbacks run on
// transport goroutines, in entry order, and must not block; they may call AppendAsync, not
// Append or Close. A ledger's Close returns after the callbacks of its pending adds;
// Client.Close fails what is pending (ErrClosed) and leaks nothing.
//
// An add's path crosses several goroutines (the caller, each bookie connection's writer and
// reader), so its latency depends on a free P being there when one is woken. A process that
// also runs goroutines which block in system calls while holding their P may want GOMAXPROCS
// above the number of cores: `ringkeeper` itself runs with twice the default, which took the
// (3,3,2) light-load p50 on 2 cores from 668 to 464 µs (BENCHMARKS.md).
package client
