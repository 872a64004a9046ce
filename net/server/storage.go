package server

// Storage is what the server needs from the bookie's storage engine. The engine implements it;
// tests use servertest.MemStorage. Errors are turned into return codes by Config.ErrorCode.
//
// Add, Fence, ReadCached and ReadOnly are called on event loops and must not block on disk;
// Read is called only on read worker goroutines.
type Storage interface {
	// Add stores a BookKeeper stored entry (ledgerId, entryId, LAC, length, digest, payload)
	// under masterKey; recovery allows adds to a fenced ledger. stored aliases the server's
	// receive buffer for the duration of the call only: the engine copies it.
	// nil return: done(ctx, err) is called later exactly once, on another goroutine, after the
	// entry is durable, and must not block. Non-nil return: done is not called.
	Add(masterKey, stored []byte, recovery bool, done func(ctx any, err error), ctx any) error
	// ReadCached appends the entry to dst from memory only; it never blocks on disk (safe on an
	// event loop). false means a miss: the server then calls Read on a worker.
	ReadCached(ledgerID, entryID int64, dst []byte) ([]byte, bool)
	// Read appends the entry (entryID -1 = the last entry) to dst; it may block on disk.
	Read(ledgerID, entryID int64, dst []byte) ([]byte, error)
	// Fence marks the ledger fenced under masterKey; done runs once the fence is durable (same
	// contract as Add).
	Fence(ledgerID int64, masterKey []byte, done func(ctx any, err error), ctx any) error
	// ReadOnly reports whether adds other than recovery and high-priority adds must get
	// EREADONLY.
	ReadOnly() bool
}

// NonBlockingAdder is an optional Storage capability for adds that may have to wait for room
// (a full write cache): TryAdd is Add that never blocks. queued=false with a nil error means the
// add would have to wait; the server then copies the entry and calls Add on a blocking-add
// worker, so that an event loop never waits for the storage engine.
type NonBlockingAdder interface {
	TryAdd(masterKey, stored []byte, recovery bool, done func(ctx any, err error), ctx any) (queued bool, err error)
}
