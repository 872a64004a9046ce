package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	_ "github.com/ringkeeper/ringkeeper/metadata/etcd" // the etcd:// driver
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// Config configures a Client.
type Config struct {
	// MetadataURI is the metadata service, e.g. etcd://127.0.0.1:2379/ledgers.
	MetadataURI string
	Metadata    metadata.Options
	// Transport configures bookie connections (timeouts: addEntryTimeout, readTimeout; TLS;
	// auth). With TLS set, each bookie is dialled at the TLS endpoint it registers (its
	// tlsPort), not at its id; its certificate must then name the endpoint's host (usually an
	// IP address) or TLSHostnameVerificationDisabled be set.
	Transport transport.Config
	// Placement chooses bookies; nil means RandomPlacement.
	Placement PlacementPolicy
	// SpeculativeReadTimeout is speculativeReadTimeout: a read that has no answer after this
	// long is also sent to the next replica (0 disables speculation).
	SpeculativeReadTimeout time.Duration
	// MaxEnsembleChanges bounds ensemble changes per ledger handle (maxAllowedEnsembleChanges).
	MaxEnsembleChanges int
	// BookieQuarantineTime is bookieQuarantineTimeSeconds: for this long after a write handle
	// replaced a bookie, it picks that bookie as a replacement only when no other is left.
	// Default DefaultBookieQuarantineTime.
	BookieQuarantineTime time.Duration
	// ReadWindow is how many entries a range read or a reader keeps in flight.
	ReadWindow int
	// MaxPendingAdds bounds the adds in flight in this client, all ledgers together
	// (BookKeeper's throttle, which blocks instead): an append over it is refused at once with
	// ErrTooManyPendingAdds, takes no entry id and leaves the handle usable. An add counts
	// until Qa bookies acknowledged it or it failed. It must not exceed the transport's
	// MaxPendingPerConn, so that a connection reaches that limit only when its bookie lags far
	// behind the others of a write quorum. Default DefaultMaxPendingAdds.
	MaxPendingAdds int
	Logger         *slog.Logger

	// dial, if set (tests), replaces the transport: it returns the connection to a bookie.
	dial func(addr string) bookieConn
}

// DefaultBookieQuarantineTime is BookKeeper's bookieQuarantineTimeSeconds default (1800).
const DefaultBookieQuarantineTime = 30 * time.Minute

// DefaultMaxPendingAdds is MaxPendingAdds' default: half the transport's MaxPendingPerConn,
// leaving the other half to reads and to adds a lagging bookie has not answered yet.
const DefaultMaxPendingAdds = transport.DefaultMaxPendingPerConn / 2

// DefaultConfig returns a config for the metadata service at uri.
func DefaultConfig(uri string) Config {
	return Config{
		MetadataURI:            uri,
		SpeculativeReadTimeout: 2 * time.Second,
		MaxEnsembleChanges:     1 << 20,
		BookieQuarantineTime:   DefaultBookieQuarantineTime,
		ReadWindow:             64,
		MaxPendingAdds:         DefaultMaxPendingAdds,
	}
}

// bookieConn sends requests to one bookie; transportConn is the real one. A read's ctx is the
// caller's: it ends the read's wait for room in a full send queue.
type bookieConn interface {
	Add(ledgerID, entryID int64, masterKey *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, cbCtx any)
	Read(ctx context.Context, ledgerID, entryID int64, flags protocol.Flags, masterKey *[20]byte, cb transport.ReadCallback, cbCtx any)
}

// transportConn is a transport connection as a bookieConn.
type transportConn struct{ *transport.Conn }

func (t transportConn) Read(ctx context.Context, ledgerID, entryID int64, flags protocol.Flags, masterKey *[20]byte,
	cb transport.ReadCallback, cbCtx any) {
	t.Conn.ReadContext(ctx, ledgerID, entryID, flags, masterKey, cb, cbCtx)
}

// Client is a connection to a ringkeeper (or BookKeeper v2 protocol) cluster: the metadata
// service and the bookies. It is safe for concurrent use.
type Client struct {
	cfg  Config
	log  *slog.Logger
	md   metadata.Driver
	pool *transport.Pool

	// mu guards bookies and tlsAddrs.
	mu      sync.RWMutex
	bookies []metadata.BookieInfo // writable bookies, refreshed by the watcher
	// tlsAddrs maps bookie ids to the address of their TLS endpoint as last registered (a
	// client with Transport.TLS only): a bookie serves TLS on its own port (tlsPort), while
	// ensembles name it by its id, the plaintext address. Entries stay after a bookie leaves
	// the registry, so that a bookie that is down keeps its TLS address; one per bookie id
	// ever registered.
	tlsAddrs map[string]string

	// pendingAdds counts the adds in flight, against MaxPendingAdds.
	pendingAdds atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the client's goroutines (the bookie watcher, ensemble changes); closeMu guards
	// closing, which stops new ones from starting once Close waits for them.
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closing bool
}

// New connects to the metadata service and starts watching the bookies. Configuration it
// rejects (a bad MetadataURI, Metadata options or Transport config included) fails with
// ErrBadArgument, wrapping the checking package's error; it connects to nothing then.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Placement == nil {
		cfg.Placement = RandomPlacement{}
	}
	if cfg.ReadWindow <= 0 {
		cfg.ReadWindow = 64
	}
	if cfg.MaxEnsembleChanges <= 0 {
		cfg.MaxEnsembleChanges = 1 << 20
	}
	if cfg.BookieQuarantineTime <= 0 {
		cfg.BookieQuarantineTime = DefaultBookieQuarantineTime
	}
	if cfg.MaxPendingAdds <= 0 {
		cfg.MaxPendingAdds = DefaultMaxPendingAdds
	}
	tc := cfg.Transport
	tc.Logger = cfg.Logger
	tc.EnsureDefaults()
	if err := tc.Validate(); err != nil { // before connecting: bad config fails fast
		return nil, fmt.Errorf("%w: %w", ErrBadArgument, err)
	}
	if cfg.MaxPendingAdds > tc.MaxPendingPerConn {
		return nil, fmt.Errorf("%w: MaxPendingAdds %d is above the transport's MaxPendingPerConn %d", ErrBadArgument, cfg.MaxPendingAdds, tc.MaxPendingPerConn)
	}
	if cfg.Metadata.Logger == nil {
		cfg.Metadata.Logger = cfg.Logger
	}
	md, err := metadata.Open(ctx, cfg.MetadataURI, cfg.Metadata)
	if errors.Is(err, metadata.ErrBadURI) || errors.Is(err, metadata.ErrInvalidOptions) {
		return nil, fmt.Errorf("%w: %w", ErrBadArgument, err)
	}
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, md: md}
	if cfg.dial == nil {
		if c.pool, err = transport.NewPool(tc); err != nil {
			md.Close()
			return nil, err
		}
		c.cfg.dial = func(id string) bookieConn { return transportConn{c.pool.Conn(c.bookieAddr(id))} }
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	watch, err := md.Bookies().Watch(c.ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	// The first value is the current set: wait for it so CreateLedger sees the bookies.
	select {
	case set := <-watch:
		c.setBookies(set)
	case <-ctx.Done():
		c.Close()
		return nil, ctx.Err()
	}
	c.wg.Go(func() {
		for set := range watch {
			c.setBookies(set)
		}
	})
	return c, nil
}

func (c *Client) setBookies(all []metadata.BookieInfo) {
	var writable []metadata.BookieInfo
	for _, b := range all {
		if b.State == metadata.BookieWritable {
			writable = append(writable, b)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bookies = writable
	if c.cfg.Transport.TLS == nil {
		return
	}
	if c.tlsAddrs == nil {
		c.tlsAddrs = map[string]string{}
	}
	for _, b := range all {
		if addr, ok := tlsEndpoint(b); ok {
			c.tlsAddrs[b.ID] = addr
		}
	}
}

// tlsEndpoint returns the address of b's TLS endpoint, if it registered one.
func tlsEndpoint(b metadata.BookieInfo) (string, bool) {
	for _, e := range b.Endpoints {
		if e.ID == metadata.EndpointBookieTLS {
			return net.JoinHostPort(e.Host, strconv.Itoa(e.Port)), true
		}
	}
	return "", false
}

// bookieAddr is the address the transport dials for the bookie id: the id itself, or, for a
// client with Transport.TLS, the bookie's TLS endpoint. A bookie whose TLS endpoint this client
// never saw is dialled at its id, and fails the TLS handshake there if that port is plaintext.
func (c *Client) bookieAddr(id string) string {
	if c.cfg.Transport.TLS == nil {
		return id
	}
	c.mu.RLock()
	addr, ok := c.tlsAddrs[id]
	c.mu.RUnlock()
	if !ok {
		return id
	}
	return addr
}

// takeAddPermit counts one more add in flight, unless MaxPendingAdds are already.
func (c *Client) takeAddPermit() bool {
	if c.pendingAdds.Add(1) > int64(c.cfg.MaxPendingAdds) {
		c.pendingAdds.Add(-1)
		return false
	}
	return true
}

func (c *Client) writableBookies() []metadata.BookieInfo {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.bookies
}

// Metadata returns the metadata driver, for tools.
func (c *Client) Metadata() metadata.Driver { return c.md }

// goBackground runs f on a goroutine that Close waits for; once Close has begun it runs
// nothing and returns false.
func (c *Client) goBackground(f func()) bool {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closing {
		return false
	}
	c.wg.Go(f)
	return true
}

// Close closes bookie connections and the metadata driver, and returns once the client's
// goroutines have ended. Handles must not be used after.
func (c *Client) Close() error {
	c.closeMu.Lock()
	c.closing = true
	c.closeMu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	var errs []error
	if c.pool != nil {
		errs = append(errs, c.pool.Close())
	}
	errs = append(errs, c.md.Close())
	c.wg.Wait()
	return errors.Join(errs...)
}

// ledgerErr maps the metadata service's errors about ledger id to the client's sentinels:
// ErrNoSuchLedger (gone, or a negative id), ErrClosed (this client was closed).
func ledgerErr(err error, id int64) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, metadata.ErrNoSuchLedger), errors.Is(err, metadata.ErrInvalidLedgerID):
		return fmt.Errorf("%w: %d: %w", ErrNoSuchLedger, id, err)
	case errors.Is(err, metadata.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// CreateOptions describe a new ledger.
type CreateOptions struct {
	// EnsembleSize, WriteQuorum and AckQuorum: E ≥ Qw ≥ Qa ≥ 1 (BookKeeper's defaults are
	// 3/2/2).
	EnsembleSize, WriteQuorum, AckQuorum int
	// Digest defaults to CRC32C.
	Digest DigestType
	// Password derives the master key and, for HMAC, the digest key.
	Password []byte
	// Custom is opaque application metadata.
	Custom map[string][]byte
}

// CreateLedger creates a ledger on bookies chosen by the placement policy and returns its
// write handle.
func (c *Client) CreateLedger(ctx context.Context, o CreateOptions) (*Ledger, error) {
	if o.Digest == 0 {
		o.Digest = DigestCRC32C
	}
	if o.EnsembleSize < o.WriteQuorum || o.WriteQuorum < o.AckQuorum || o.AckQuorum < 1 || o.WriteQuorum > 64 {
		return nil, fmt.Errorf("%w: need ensemble ≥ write quorum ≥ ack quorum ≥ 1 (got %d/%d/%d)",
			ErrBadArgument, o.EnsembleSize, o.WriteQuorum, o.AckQuorum)
	}
	if _, err := newDigester(o.Digest, o.Password); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadArgument, err)
	}
	if err := c.ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	ensemble, err := c.cfg.Placement.NewEnsemble(o.EnsembleSize, o.WriteQuorum, c.writableBookies(), nil)
	if err != nil {
		return nil, err
	}
	custom := make(map[string][]byte, len(o.Custom))
	for k, v := range o.Custom {
		custom[k] = slices.Clone(v) // the caller may change its map and slices afterwards
	}
	md := &metadata.LedgerMetadata{
		EnsembleSize: o.EnsembleSize, WriteQuorumSize: o.WriteQuorum, AckQuorumSize: o.AckQuorum,
		State: metadata.StateOpen, LastEntryID: metadata.NoEntry,
		Ensembles:  []metadata.Ensemble{{FirstEntryID: 0, Bookies: ensemble}},
		DigestType: o.Digest, Password: append([]byte(nil), o.Password...),
		CreationTime: time.Now(), CustomMetadata: custom,
	}
	if err := md.Validate(); err != nil { // before an id is taken
		return nil, fmt.Errorf("%w: %w", ErrBadArgument, err)
	}
	// Validate does not bound the size: the codec does (metadata.MaxEncodedSize, which large
	// custom metadata can exceed). Also before an id is taken.
	codec := c.cfg.Metadata.Codec
	if codec == nil {
		codec = metadata.DefaultCodec
	}
	if _, err := codec.Encode(md); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadArgument, err)
	}
	id, version, err := metadata.CreateLedger(ctx, c.md, md)
	if err != nil {
		return nil, ledgerErr(err, id)
	}
	return newLedger(c, id, md.Clone(), version, o.Password, false)
}

// OpenLedger opens a ledger for reading. With recover, it first fences the ledger on its
// bookies and closes it at the last entry that was acknowledged (BookKeeper's recovery), so the
// writer, if any, can add nothing more; the returned handle then sees the final content.
// Without recover, a ledger that is still open can be read up to its last add confirmed.
func (c *Client) OpenLedger(ctx context.Context, id int64, password []byte, recover bool) (*Ledger, error) {
	md, version, err := c.md.Ledgers().Read(ctx, id)
	if err != nil {
		return nil, ledgerErr(err, id)
	}
	if string(md.Password) != string(password) {
		return nil, fmt.Errorf("%w: ledger %d", ErrUnauthorized, id)
	}
	lh, err := newLedger(c, id, md, version, password, true)
	if err != nil {
		return nil, err
	}
	if recover && md.State != metadata.StateClosed {
		if err := lh.recover(ctx); err != nil {
			return nil, err
		}
	}
	return lh, nil
}

// DeleteLedger deletes a ledger's metadata; bookies reclaim its entries at their next garbage
// collection. As in BookKeeper, an open ledger can be deleted too: a writer still using it then
// fails at its next ensemble change or Close with ErrNoSuchLedger.
func (c *Client) DeleteLedger(ctx context.Context, id int64) error {
	return ledgerErr(c.md.Ledgers().Delete(ctx, id, metadata.AnyVersion), id)
}

// ListLedgers calls fn for every ledger id in increasing order until fn returns false.
func (c *Client) ListLedgers(ctx context.Context, fn func(id int64) bool) error {
	start := int64(0)
	for {
		ids, more, err := c.md.Ledgers().List(ctx, start, 1000)
		if err != nil {
			return ledgerErr(err, start)
		}
		for _, id := range ids {
			if !fn(id) {
				return nil
			}
		}
		if !more || len(ids) == 0 {
			return nil
		}
		start = ids[len(ids)-1] + 1
	}
}

// LedgerMetadata reads a ledger's metadata.
func (c *Client) LedgerMetadata(ctx context.Context, id int64) (*metadata.LedgerMetadata, error) {
	md, _, err := c.md.Ledgers().Read(ctx, id)
	return md, ledgerErr(err, id)
}

// ReopenLedgerForWrite continues writing an OPEN ledger whose writer has gone away, after the
// last entry that writer may have had acknowledged. It is for tools (ringkeeper shell):
// BookKeeper has no such call. Applications should close ledgers and create new ones, or
// recover with OpenLedger.
//
// It runs recovery without the close (recoverTail): it reads forward from the LAC, re-adds
// every entry it finds to its whole write quorum (a bookie that fails is replaced, and the new
// ensembles are CAS'd into the metadata before the handle is returned), and stops at the first
// entry that at least Qw−Qa+1 bookies report missing; the handle then writes from the entry
// after the last one recovered. An entry the dead writer left on fewer than Qa bookies is thus
// either kept and replicated, or dropped and overwritten by the new writer's entry of the same
// id on its write set: never counted while under-replicated. A bookie whose copy is damaged
// or who cannot answer is never counted as missing: the call fails rather than guess.
//
// It does not fence, and is unsafe if the previous writer is still running. Fencing is
// permanent (a fenced bookie refuses every add that is not a recovery add), so a fenced ledger
// could not be written by the returned handle either: the shell's "ledger append" runs once per
// batch of lines on the same ledger, and dlog's tests reopen a segment their writer still
// holds. Writing with recovery adds instead would get past the fence of a real recoverer
// (OpenLedger with recover) too, and let this handle have entries acknowledged after that
// recoverer closed the ledger below them. So the previous writer must be gone: its process
// ended, so that none of its adds is still on its way to a bookie. What it still checks:
// the metadata must not have changed while the tail was read (an ensemble change of a writer
// still running, or a recoverer starting, fails the call).
func (c *Client) ReopenLedgerForWrite(ctx context.Context, id int64, password []byte) (*Ledger, error) {
	md, version, err := c.md.Ledgers().Read(ctx, id)
	if err != nil {
		return nil, ledgerErr(err, id)
	}
	if string(md.Password) != string(password) {
		return nil, fmt.Errorf("%w: ledger %d", ErrUnauthorized, id)
	}
	if err := writableState(md, id); err != nil {
		return nil, err
	}
	lh, err := newLedger(c, id, md, version, password, false)
	if err != nil {
		return nil, err
	}
	tail, err := lh.recoverTail(ctx, md, false)
	if err != nil {
		return nil, err
	}
	read := md
	md, version, err = metadata.UpdateLedger(ctx, c.md.Ledgers(), id, func(m *metadata.LedgerMetadata) error {
		if err := writableState(m, id); err != nil {
			return err
		}
		if !slices.EqualFunc(m.Ensembles, read.Ensembles, sameEnsemble) {
			return fmt.Errorf("%w: ledger %d: its ensembles changed while its tail was recovered (is its writer still running?)",
				ErrRecovery, id)
		}
		if slices.EqualFunc(m.Ensembles, tail.written.Ensembles, sameEnsemble) {
			return metadata.ErrUnchanged
		}
		m.Ensembles = tail.written.Clone().Ensembles
		return nil
	})
	if err != nil {
		return nil, ledgerErr(err, id)
	}
	lh.mu.Lock()
	lh.setMetadataLocked(md, version)
	lh.lac, lh.nextEntry, lh.length, lh.confirmedLength = tail.lastEntry, tail.lastEntry+1, tail.length, tail.length
	lh.mu.Unlock()
	return lh, nil
}

// writableState fails unless md's state is OPEN.
func writableState(md *metadata.LedgerMetadata, id int64) error {
	switch md.State {
	case metadata.StateInRecovery:
		return fmt.Errorf("%w: ledger %d is being recovered", ErrLedgerFenced, id)
	case metadata.StateClosed:
		return fmt.Errorf("%w: ledger %d", ErrLedgerClosed, id)
	}
	return nil
}
