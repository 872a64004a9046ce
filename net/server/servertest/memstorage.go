package servertest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// Errors of MemStorage. ErrorCode maps each to its return code.
var (
	ErrNoLedger     = errors.New("servertest: no such ledger")            // ENOLEDGER
	ErrNoEntry      = errors.New("servertest: no such entry")             // ENOENTRY
	ErrUnauthorized = errors.New("servertest: master key does not match") // EUA
	ErrFenced       = errors.New("servertest: ledger is fenced")          // EFENCED
	ErrReadOnly     = errors.New("servertest: read-only")                 // EREADONLY
	ErrBadEntry     = errors.New("servertest: malformed stored entry")    // EBADREQ
	ErrIO           = errors.New("servertest: injected I/O error")        // EIO
	ErrClosed       = errors.New("servertest: storage closed")            // EIO
	ErrTooMany      = errors.New("servertest: storage queue is full")     // ETOOMANYREQUESTS
)

// ErrorCode maps MemStorage's errors to v2 return codes; anything else is EIO. Pass it as the
// server's Config.ErrorCode.
func ErrorCode(err error) protocol.ReturnCode {
	switch {
	case err == nil:
		return protocol.EOK
	case errors.Is(err, ErrNoLedger):
		return protocol.ENOLEDGER
	case errors.Is(err, ErrNoEntry):
		return protocol.ENOENTRY
	case errors.Is(err, ErrUnauthorized):
		return protocol.EUA
	case errors.Is(err, ErrFenced):
		return protocol.EFENCED
	case errors.Is(err, ErrReadOnly):
		return protocol.EREADONLY
	case errors.Is(err, ErrBadEntry):
		return protocol.EBADREQ
	case errors.Is(err, ErrTooMany):
		return protocol.ETOOMANYREQUESTS
	default:
		return protocol.EIO
	}
}

type memLedger struct {
	key     [protocol.MasterKeyLength]byte
	fenced  bool
	entries map[int64][]byte
	last    int64 // highest entry id added; -1 when none
}

type completion struct {
	done func(ctx any, err error)
	ctx  any
	err  error
}

// MemStorage is an in-memory implementation of the server's Storage interface for tests and
// benchmarks: a map of ledgers with master keys and fence flags. Add and Fence check and apply
// synchronously (as the engine does) and complete asynchronously: a completer goroutine takes
// every queued completion as one group, optionally sleeps Delay (a pretend fsync), and runs
// the callbacks in order, like a journal's group commit. Create it with NewMemStorage and
// Close it when done.
type MemStorage struct {
	// Delay is slept once per completion group before its callbacks run. Set it before use.
	Delay time.Duration
	// DropPayloads keeps only the ids of added entries (Read then answers ENOENTRY for them),
	// so that a benchmark can add millions of entries; the entry is still copied once, as a
	// write cache would. Set it before use.
	DropPayloads bool
	// DisableCache makes ReadCached always miss, so every read goes through Read (the server's
	// worker pool). Set it before use.
	DisableCache bool

	readOnly   atomic.Bool
	panicOn    atomic.Int64 // ledger id whose Add panics; 0 = none
	readHook   atomic.Pointer[func(ledgerID, entryID int64)]
	addErr     atomic.Pointer[error]
	fenceErr   atomic.Pointer[error]
	adds       atomic.Int64
	reads      atomic.Int64
	cachedHits atomic.Int64
	groups     atomic.Int64

	// mu protects everything below and the ledgers' contents.
	mu      sync.Mutex
	cond    sync.Cond
	ledgers map[int64]*memLedger
	queue   []completion
	spare   []completion
	held    bool
	closed  bool
	scratch []byte
	exited  chan struct{}
}

// NewMemStorage returns an empty MemStorage with its completer goroutine running.
func NewMemStorage() *MemStorage {
	m := &MemStorage{ledgers: make(map[int64]*memLedger), exited: make(chan struct{})}
	m.cond.L = &m.mu
	go m.complete()
	return m
}

// Close runs the queued completions and stops the completer. Later adds and fences fail with
// ErrClosed.
func (m *MemStorage) Close() {
	m.mu.Lock()
	m.closed = true
	m.held = false
	m.cond.Broadcast()
	m.mu.Unlock()
	<-m.exited
}

// Hold stops running completions (they queue up) until Release. Tests use it to keep adds and
// fences in flight.
func (m *MemStorage) Hold() {
	m.mu.Lock()
	m.held = true
	m.mu.Unlock()
}

// Release lets held completions run.
func (m *MemStorage) Release() {
	m.mu.Lock()
	m.held = false
	m.cond.Broadcast()
	m.mu.Unlock()
}

// Queued returns the number of completions waiting to run.
func (m *MemStorage) Queued() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queue)
}

// SetReadOnly sets what ReadOnly reports.
func (m *MemStorage) SetReadOnly(ro bool) { m.readOnly.Store(ro) }

// PanicOnAdd makes Add panic for the given ledger (0 turns it off): it simulates a bug.
func (m *MemStorage) PanicOnAdd(ledgerID int64) { m.panicOn.Store(ledgerID) }

// SetReadHook installs a function called at the start of every Read (on the caller's
// goroutine), e.g. to block reads; nil removes it.
func (m *MemStorage) SetReadHook(hook func(ledgerID, entryID int64)) {
	if hook == nil {
		m.readHook.Store(nil)
		return
	}
	m.readHook.Store(&hook)
}

// FailAdds makes every later add complete with err (nil turns it off): the error arrives
// through the done callback, as a failed journal write would.
func (m *MemStorage) FailAdds(err error) {
	if err == nil {
		m.addErr.Store(nil)
		return
	}
	m.addErr.Store(&err)
}

// FailFences makes every later fence complete with err (nil turns it off).
func (m *MemStorage) FailFences(err error) {
	if err == nil {
		m.fenceErr.Store(nil)
		return
	}
	m.fenceErr.Store(&err)
}

// Counters returns the number of adds accepted, reads served by Read, ReadCached hits and
// completion groups run.
func (m *MemStorage) Counters() (adds, reads, cachedHits, groups int64) {
	return m.adds.Load(), m.reads.Load(), m.cachedHits.Load(), m.groups.Load()
}

// IsFenced reports whether the ledger is fenced.
func (m *MemStorage) IsFenced(ledgerID int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.ledgers[ledgerID]
	return l != nil && l.fenced
}

// Add implements the server's Storage.Add.
func (m *MemStorage) Add(masterKey, stored []byte, recovery bool, done func(ctx any, err error), ctx any) error {
	if len(stored) < protocol.StoredEntryHeaderSize {
		return fmt.Errorf("%w: %d bytes", ErrBadEntry, len(stored))
	}
	ledgerID := int64(binary.BigEndian.Uint64(stored))
	entryID := int64(binary.BigEndian.Uint64(stored[8:]))
	if p := m.panicOn.Load(); p != 0 && p == ledgerID {
		panic(fmt.Sprintf("servertest: injected panic adding to ledger %d", ledgerID))
	}
	// Read-only mode is the server's check (Storage.ReadOnly), which lets recovery and
	// high-priority adds through; Add's signature carries only the recovery flag.
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	l, err := m.ledgerForWriteLocked(ledgerID, masterKey)
	if err != nil {
		return err
	}
	if l.fenced && !recovery {
		return fmt.Errorf("%w: ledger %d", ErrFenced, ledgerID)
	}
	if m.DropPayloads {
		m.scratch = append(m.scratch[:0], stored...)
	} else {
		l.entries[entryID] = append([]byte(nil), stored...)
	}
	l.last = max(l.last, entryID)
	m.adds.Add(1)
	var cerr error
	if p := m.addErr.Load(); p != nil {
		cerr = *p
	}
	m.enqueueLocked(completion{done: done, ctx: ctx, err: cerr})
	return nil
}

func (m *MemStorage) ledgerForWriteLocked(ledgerID int64, masterKey []byte) (*memLedger, error) {
	l := m.ledgers[ledgerID]
	if l == nil {
		if len(masterKey) != protocol.MasterKeyLength {
			return nil, fmt.Errorf("%w: a %d-byte key", ErrUnauthorized, len(masterKey))
		}
		l = &memLedger{entries: make(map[int64][]byte), last: -1}
		copy(l.key[:], masterKey)
		m.ledgers[ledgerID] = l
		return l, nil
	}
	if !protocol.MasterKeyEqual(l.key[:], masterKey) {
		return nil, fmt.Errorf("%w: ledger %d", ErrUnauthorized, ledgerID)
	}
	return l, nil
}

func (m *MemStorage) enqueueLocked(c completion) {
	m.queue = append(m.queue, c)
	if len(m.queue) == 1 {
		m.cond.Signal()
	}
}

// Fence implements the server's Storage.Fence: like the engine, it creates a ledger it has not
// seen, so that a late add of the old writer is refused too.
func (m *MemStorage) Fence(ledgerID int64, masterKey []byte, done func(ctx any, err error), ctx any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	l, err := m.ledgerForWriteLocked(ledgerID, masterKey)
	if err != nil {
		return err
	}
	l.fenced = true
	var cerr error
	if p := m.fenceErr.Load(); p != nil {
		cerr = *p
	}
	m.enqueueLocked(completion{done: done, ctx: ctx, err: cerr})
	return nil
}

// Read implements the server's Storage.Read.
func (m *MemStorage) Read(ledgerID, entryID int64, dst []byte) ([]byte, error) {
	if h := m.readHook.Load(); h != nil {
		(*h)(ledgerID, entryID)
	}
	m.reads.Add(1)
	return m.read(ledgerID, entryID, dst)
}

func (m *MemStorage) read(ledgerID, entryID int64, dst []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.ledgers[ledgerID]
	if l == nil {
		return dst, fmt.Errorf("%w: %d", ErrNoLedger, ledgerID)
	}
	if entryID == protocol.LastAddConfirmedEntryID {
		if l.last < 0 {
			return dst, fmt.Errorf("%w: ledger %d is empty", ErrNoEntry, ledgerID)
		}
		entryID = l.last
	}
	e, ok := l.entries[entryID]
	if !ok {
		return dst, fmt.Errorf("%w: %d/%d", ErrNoEntry, ledgerID, entryID)
	}
	return append(dst, e...), nil
}

// ReadCached implements the server's Storage.ReadCached: every stored entry is "cached" unless
// DisableCache is set.
func (m *MemStorage) ReadCached(ledgerID, entryID int64, dst []byte) ([]byte, bool) {
	if m.DisableCache || entryID < 0 {
		return dst, false
	}
	out, err := m.read(ledgerID, entryID, dst)
	if err != nil {
		return dst, false
	}
	m.cachedHits.Add(1)
	return out, true
}

// ReadOnly implements the server's Storage.ReadOnly.
func (m *MemStorage) ReadOnly() bool { return m.readOnly.Load() }

// complete is the completer goroutine: one group per wake-up, in order.
func (m *MemStorage) complete() {
	defer close(m.exited)
	for {
		m.mu.Lock()
		for (len(m.queue) == 0 || m.held) && !m.closed {
			m.cond.Wait()
		}
		if m.closed && len(m.queue) == 0 {
			m.mu.Unlock()
			return
		}
		group := m.queue
		m.queue = m.spare[:0]
		m.mu.Unlock()

		if m.Delay > 0 {
			time.Sleep(m.Delay)
		}
		m.groups.Add(1)
		for i := range group {
			group[i].done(group[i].ctx, group[i].err)
			group[i] = completion{}
		}
		m.mu.Lock()
		m.spare = group[:0]
		m.mu.Unlock()
	}
}
