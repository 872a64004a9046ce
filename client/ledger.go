package client

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// maxWriteQuorum bounds the write quorum (acks are tracked in a bit mask).
const maxWriteQuorum = 64

// Ledger is a handle on one ledger: a write handle from CreateLedger, or a read handle from
// OpenLedger. Methods are safe for concurrent use.
type Ledger struct {
	c        *Client
	id       int64
	password []byte
	key      [20]byte
	dg       *digester
	readOnly bool
	macs     sync.Pool // HMAC states for DigestHMAC

	// refreshing serialises a read handle's metadata refreshes (refreshMetadata): a one-slot
	// semaphore, not a mutex, so that a caller waiting behind another's refresh still returns
	// when its own context ends.
	refreshing chan struct{}

	// mu guards the fields below.
	mu      sync.Mutex
	md      *metadata.LedgerMetadata
	version metadata.Version
	// refreshedAt is when md was last read from the metadata service (read handles).
	refreshedAt time.Time
	// nextEntry is the id the next Append gets; lac is the last entry acknowledged to the
	// application (all before it too), confirmedLength the ledger length up to lac.
	nextEntry       int64
	lac             int64
	length          int64
	confirmedLength int64
	// pending are adds not yet acknowledged to the application, in entry order: a window of
	// pendingArr, which popLocked advances and pushPendingLocked refills from the front.
	pending    []*addOp
	pendingArr []*addOp
	// err is sticky: once set, every pending and later add fails with it.
	err     error
	closing bool
	// changing is set while an ensemble change runs: adds are not acknowledged (the LAC does
	// not move) and new adds are held in unsent until the new ensemble is in the metadata.
	changing  bool
	unsent    []*addOp
	toReplace map[string]bool
	// replaced are the bookies this handle replaced, with when (monotime): for
	// BookieQuarantineTime they are picked as replacements again only when no other bookie is
	// left (two failing bookies would otherwise replace each other).
	replaced map[string]int64
	changes  int
	// idle is signalled whenever pending shrinks, for Close.
	idle *sync.Cond

	// Callbacks run in entry order, one goroutine at a time, without any lock held (so that a
	// callback may call AppendAsync): toDeliver queues popped adds, and delivering says that a
	// goroutine is draining it; others only queue (see deliverLocked). spareOps is toDeliver's
	// other buffer.
	toDeliver  []*addOp
	spareOps   []*addOp
	delivering bool

	// sendConns are the connections to the bookies of sendConnsOf, the ensemble adds were last
	// sent to (see connsLocked).
	sendConns   []bookieConn
	sendConnsOf []string

	ops  sync.Pool
	reqs sync.Pool
}

// addOp is one add in flight.
type addOp struct {
	lh       *Ledger
	entryID  int64
	length   int64
	hdr      [entryHeaderSize + 20]byte
	parts    [2][]byte
	ensemble []string
	acked    uint64
	ackCount int
	// completed: Qa bookies of its write set acknowledged it (or it failed); popped: removed
	// from pending for delivery; delivered: its callback has run.
	completed   bool
	popped      bool
	delivered   bool
	outstanding int
	done        func(entryID int64, err error)
	err         error
	// sendState says whether AppendAsync has handed the add to every bookie of its write set
	// (it sends with no lock held). Its callback must not run before: it releases the caller's
	// buffer, which the transport copies only while sending. See popLocked.
	sendState atomic.Int32
}

// addOp.sendState values.
const (
	sendIssuing  = iota // AppendAsync is still sending
	sendIssued          // every send is out
	sendDeferred        // the add completed while AppendAsync was sending: AppendAsync delivers
)

// addReq is one request of an add to one bookie; it tells responses of an old bookie (replaced
// by an ensemble change) from the current one's.
type addReq struct {
	op   *addOp
	pos  int
	addr string
}

func newLedger(c *Client, id int64, md *metadata.LedgerMetadata, version metadata.Version, password []byte, readOnly bool) (*Ledger, error) {
	dg, err := newDigester(md.DigestType, password)
	if err != nil {
		return nil, err
	}
	lh := &Ledger{
		c: c, id: id, password: append([]byte(nil), password...), key: MasterKey(password), dg: dg,
		readOnly: readOnly, refreshing: make(chan struct{}, 1), refreshedAt: time.Now(), lac: -1, toReplace: map[string]bool{}, replaced: map[string]int64{},
	}
	lh.setMetadataLocked(md, version)
	lh.idle = sync.NewCond(&lh.mu)
	lh.macs.New = func() any { return dg.newMAC() }
	lh.ops.New = func() any { return &addOp{lh: lh} }
	lh.reqs.New = func() any { return &addReq{} }
	return lh, nil
}

// setMetadataLocked makes md (at version) the handle's metadata; a closed ledger's end becomes
// the handle's.
func (lh *Ledger) setMetadataLocked(md *metadata.LedgerMetadata, version metadata.Version) {
	lh.md, lh.version = md, version
	if md.State == metadata.StateClosed {
		lh.lac, lh.nextEntry, lh.confirmedLength, lh.length = md.LastEntryID, md.LastEntryID+1, md.Length, md.Length
	}
}

// ID returns the ledger id.
func (lh *Ledger) ID() int64 { return lh.id }

// MaxEntrySize is the largest payload Append takes (larger ones fail with ErrEntryTooLarge):
// the frame limit less the request's headers and the ledger's digest.
func (lh *Ledger) MaxEntrySize() int { return lh.c.maxPayload(lh.dg) }

// Metadata returns a copy of the ledger's metadata as this handle knows it.
func (lh *Ledger) Metadata() *metadata.LedgerMetadata {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	return lh.md.Clone()
}

// LastAddConfirmed is the last entry acknowledged to the application by this handle (write
// handle), or the last entry of a closed or recovered ledger, or the last LAC read (-1: none).
func (lh *Ledger) LastAddConfirmed() int64 {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	return lh.lac
}

// Append adds data as the next entry and returns its id once Qa bookies have it durably. It
// must not be called from an AppendAsync callback: that goroutine runs the callbacks after it.
// With ctx done before the call it writes nothing and returns ctx's error; once ctx ends
// later, it returns ctx's error and the add goes on (it may or may not be written).
//
// ctx does not bound a wait for room in a bookie's full send queue (transport's
// MaxQueuedBytesPerConn, as for AppendAsync): Append then returns once every bookie of the
// write set has queued the add, or its send failed (at most AddTimeout), and only then
// heeds ctx. The add has an entry id by then, and a send abandoned for the caller's ctx
// would have to be resent rather than dropped (the entries after it wait for it) and must
// not replace the bookie.
func (lh *Ledger) Append(ctx context.Context, data []byte) (int64, error) {
	type result struct {
		id  int64
		err error
	}
	if err := ctx.Err(); err != nil {
		return -1, err // nothing sent: the caller is told so and may write it again
	}
	ch := make(chan result, 1)
	if ctx.Done() != nil {
		// Append may return before the add completes, and an ensemble change can resend it
		// later: it must not refer to the caller's buffer then.
		data = slices.Clone(data)
	}
	lh.AppendAsync(data, func(id int64, err error) { ch <- result{id, err} })
	select {
	case r := <-ch:
		return r.id, r.err
	case <-ctx.Done():
		// The add goes on (with a copy of data, so the caller may reuse it); its outcome is not
		// known to the caller.
		return -1, ctx.Err()
	}
}

// AppendAsync adds data as the next entry; done is called once with its id when Qa bookies
// have it, or with an error (id -1; an append refused at once is called back after the adds
// before it). A refused append (ErrEntryTooLarge, ErrTooManyPendingAdds) takes no entry id
// and the adds after it may succeed: a caller that needs its appends in order stops at the
// first error, or uses TryAppendAsync. Calls come strictly in entry order. done must not
// block: it runs on a connection's goroutine, or on this one. data must not change until done
// is called. done may call AppendAsync to keep a pipeline full; AppendAsync waits only when a
// bookie's send queue is full (transport's MaxQueuedBytesPerConn, 16 MiB by default), which
// would stall that connection's responses meanwhile.
func (lh *Ledger) AppendAsync(data []byte, done func(entryID int64, err error)) {
	if _, refused := lh.TryAppendAsync(data, done); refused != nil {
		lh.mu.Lock()
		// Called back in order: queued behind the adds still pending (popLocked delivers it
		// after them; it has no entry and no send).
		op := lh.ops.Get().(*addOp)
		op.entryID, op.done, op.err, op.completed = -1, done, refused, true
		op.sendState.Store(sendIssued)
		lh.pushPendingLocked(op)
		lh.deliverLocked(lh.popLocked(nil))
	}
}

// TryAppendAsync is AppendAsync for callers that must know at once whether the append took an
// entry id: it returns the id, and done is called as for AppendAsync; or, for an append
// refused at once (ErrEntryTooLarge, ErrTooManyPendingAdds, ErrReadOnly, a closed or failed
// handle), it returns the error and done is never called.
func (lh *Ledger) TryAppendAsync(data []byte, done func(entryID int64, err error)) (int64, error) {
	var refused error
	switch limit := lh.c.maxPayload(lh.dg); {
	case lh.readOnly:
		refused = ErrReadOnly
	case len(data) > limit:
		refused = fmt.Errorf("%w: %d bytes, limit %d", ErrEntryTooLarge, len(data), limit)
	}
	lh.mu.Lock()
	if refused == nil {
		refused = lh.writableErrLocked()
	}
	if refused == nil && !lh.c.takeAddPermit() {
		refused = fmt.Errorf("%w: %d in flight", ErrTooManyPendingAdds, lh.c.cfg.MaxPendingAdds)
	}
	if refused != nil {
		lh.mu.Unlock()
		return -1, refused
	}
	op := lh.ops.Get().(*addOp)
	op.entryID = lh.nextEntry
	id := op.entryID // op may be recycled once done has run
	lh.nextEntry++
	lh.length += int64(len(data))
	op.length = lh.length
	op.acked, op.ackCount, op.completed, op.popped, op.delivered, op.outstanding, op.err = 0, 0, false, false, false, 0, nil
	op.done = done
	op.sendState.Store(sendIssuing)
	lac := lh.lac
	lh.pushPendingLocked(op)
	// The digest is computed under the lock: the entry carries the LAC as of now.
	var mac hash.Hash
	if lh.dg.typ == DigestHMAC {
		mac = lh.macs.Get().(hash.Hash)
	}
	lh.dg.seal(op.hdr[:lh.dg.headerSize()], mac, lh.id, op.entryID, lac, op.length, data)
	if mac != nil {
		lh.macs.Put(mac)
	}
	op.parts = [2][]byte{op.hdr[:lh.dg.headerSize()], data}
	if lh.changing {
		op.sendState.Store(sendIssued) // the ensemble change sends it, before any callback
		lh.unsent = append(lh.unsent, op)
		lh.mu.Unlock()
		return id, nil
	}
	// Room on the stack for common write quorums: zeroing maxWriteQuorum targets per add was
	// 1% of the client's CPU at (1,1,1).
	var room [commonWriteQuorum]sendTarget
	sends := room[:0]
	if lh.md.WriteQuorumSize > len(room) {
		sends = make([]sendTarget, 0, lh.md.WriteQuorumSize)
	}
	n := lh.prepareSendLocked(op, allPositions(lh.md.WriteQuorumSize), sends)
	lh.mu.Unlock()
	lh.send(sends[:n])
	if !op.sendState.CompareAndSwap(sendIssuing, sendIssued) {
		// Qa bookies answered before the last send went out: popLocked left the add (and those
		// after it) for this goroutine to deliver.
		lh.mu.Lock()
		op.sendState.Store(sendIssued)
		lh.deliverLocked(lh.popLocked(nil))
	}
	return id, nil
}

// pushPendingLocked appends op to pending without allocating in steady state: popping from the
// front shrinks pending's capacity, and append would allocate a new array every few hundred
// adds; instead the window moves back to the front of pendingArr once at most half of it is in
// use (so each add is copied at most once per move), and pendingArr doubles only when fuller.
func (lh *Ledger) pushPendingLocked(op *addOp) {
	if len(lh.pending) == cap(lh.pending) {
		n := len(lh.pending)
		if 2*n > cap(lh.pendingArr) {
			arr := make([]*addOp, max(64, 4*n))
			copy(arr, lh.pending)
			clear(lh.pendingArr)
			lh.pendingArr = arr
		} else {
			copy(lh.pendingArr, lh.pending)
			clear(lh.pendingArr[n:])
		}
		lh.pending = lh.pendingArr[:n]
	}
	lh.pending = append(lh.pending, op)
}

// commonWriteQuorum is the largest write quorum whose adds keep their send list on the stack.
const commonWriteQuorum = 8

func (lh *Ledger) writableErrLocked() error {
	switch {
	case lh.err != nil:
		return lh.err
	case lh.closing:
		return ErrLedgerClosed
	case lh.md.State == metadata.StateClosed:
		return ErrLedgerClosed
	}
	return nil
}

func allPositions(qw int) uint64 { return uint64(1)<<qw - 1 }

type sendTarget struct {
	req  *addReq
	conn bookieConn
}

// connsLocked returns the connections to the bookies of ensemble, resolved once per ensemble
// (the pool's look-up by address is a lock and a map access, per add otherwise).
func (lh *Ledger) connsLocked(ensemble []string) []bookieConn {
	if len(lh.sendConnsOf) != len(ensemble) || len(ensemble) == 0 || &lh.sendConnsOf[0] != &ensemble[0] {
		lh.sendConns = lh.sendConns[:0]
		for _, addr := range ensemble {
			lh.sendConns = append(lh.sendConns, lh.c.cfg.dial(addr))
		}
		lh.sendConnsOf = ensemble
	}
	return lh.sendConns
}

// prepareSendLocked points op at the current ensemble and lists requests for the positions in
// mask, counting them as outstanding.
func (lh *Ledger) prepareSendLocked(op *addOp, mask uint64, dst []sendTarget) int {
	last, _ := lh.md.LastEnsemble()
	op.ensemble = last.Bookies
	conns := lh.connsLocked(op.ensemble)
	e := int64(lh.md.EnsembleSize)
	for pos := range lh.md.WriteQuorumSize {
		if mask&(1<<pos) == 0 {
			continue
		}
		i := (op.entryID + int64(pos)) % e
		req := lh.reqs.Get().(*addReq)
		req.op, req.pos, req.addr = op, pos, op.ensemble[i]
		op.outstanding++
		dst = append(dst, sendTarget{req, conns[i]})
	}
	return len(dst)
}

func (lh *Ledger) send(targets []sendTarget) {
	for _, t := range targets {
		op := t.req.op
		t.conn.Add(lh.id, op.entryID, &lh.key, 0, op.parts[:], addResponse, t.req)
	}
}

// addResponse handles one bookie's answer to an add.
func addResponse(ctx any, rc protocol.ReturnCode, err error) {
	req := ctx.(*addReq)
	op, pos, addr := req.op, req.pos, req.addr
	lh := op.lh
	*req = addReq{}
	lh.reqs.Put(req)

	lh.mu.Lock()
	op.outstanding--
	current := !op.popped && op.ensemble != nil &&
		op.ensemble[(op.entryID+int64(pos))%int64(lh.md.EnsembleSize)] == addr
	startChange := false
	switch {
	case err == nil && rc == protocol.EOK:
		if current && op.acked&(1<<pos) == 0 {
			op.acked |= 1 << pos
			op.ackCount++
			if op.ackCount >= lh.md.AckQuorumSize {
				op.completed = true // an ack never undoes a failure's completion
			}
		}
	case err == nil && rc == protocol.EFENCED:
		lh.failLocked(ErrLedgerFenced)
	case err == nil && rc == protocol.EUA:
		lh.failLocked(ErrUnauthorized)
	case errors.Is(err, transport.ErrEntryTooLarge):
		lh.failLocked(fmt.Errorf("%w: %w", ErrEntryTooLarge, err))
	case err == nil && rc == protocol.EBADREQ:
		// The transport sends only well-formed adds, so this is an entry over the bookie's
		// frame limit (below this client's; the bookie answers it rather than closing, see
		// net/server). Another bookie would be sent the same entry: no ensemble change.
		lh.failLocked(fmt.Errorf("%w: bookie %s refused entry %d (EBADREQ): over its frame limit "+
			"(nettyMaxFrameSizeBytes) or its journal's record limit", ErrEntryTooLarge, addr, op.entryID))
	case errors.Is(err, transport.ErrClosed):
		lh.failLocked(fmt.Errorf("%w: %w", ErrClosed, err)) // this client was closed: no bookie failed
	default:
		// The bookie failed, timed out or refused (read-only, overloaded): replace it, if it is
		// still in the ensemble. transport.ErrTooManyPending lands here too: with the client's
		// own bound on adds below the connection's, it means the bookie lags far behind the
		// others of the write quorum.
		// Not once Close has begun with nothing pending: the failed add is acknowledged
		// already, and a change would race Close's own update of the metadata.
		if lh.err == nil && slices.Contains(lh.currentBookiesLocked(), addr) && (!lh.closing || len(lh.pending) > 0) {
			if !lh.toReplace[addr] { // once per bookie, not once per add in flight
				lh.c.log.Warn("add failed; replacing the bookie", "ledger", lh.id, "entry", op.entryID, "bookie", addr, "rc", rc, "err", err)
			}
			lh.toReplace[addr] = true
			if !lh.changing {
				lh.changing = true
				startChange = true
			}
		}
	}
	var buf [16]*addOp
	popped := lh.popLocked(buf[:0])
	lh.recycleLocked(op)
	lh.deliverLocked(popped)
	if startChange && !lh.c.goBackground(lh.changeEnsemble) {
		lh.changeEnsemble() // the client is closing: this fails the handle at once
	}
}

func (lh *Ledger) currentBookiesLocked() []string {
	last, _ := lh.md.LastEnsemble()
	return last.Bookies
}

// popLocked removes the completed adds at the head of pending (none while the ensemble
// changes), appends them to dst for delivery and advances the LAC past successful ones.
func (lh *Ledger) popLocked(dst []*addOp) []*addOp {
	if lh.changing {
		return dst
	}
	n, permits := 0, int64(0)
	for n < len(lh.pending) && lh.pending[n].completed {
		op := lh.pending[n]
		if op.sendState.Load() != sendIssued &&
			(op.sendState.CompareAndSwap(sendIssuing, sendDeferred) || op.sendState.Load() == sendDeferred) {
			break // AppendAsync is still sending it, and delivers once it is done
		}
		op.popped = true
		if op.entryID >= 0 { // not refused: it took a permit
			permits++
		}
		if op.err == nil {
			lh.lac = op.entryID
			lh.confirmedLength = op.length
		}
		dst = append(dst, op)
		n++
	}
	if n > 0 {
		lh.c.pendingAdds.Add(-permits)
		clear(lh.pending[:n])
		lh.pending = lh.pending[n:]
		lh.idle.Broadcast()
	}
	return dst
}

// deliverLocked queues popped adds (in entry order, after those already queued), then, unless
// another goroutine is delivering, runs their callbacks with no lock held until nothing is
// queued. The caller holds mu; deliverLocked releases it.
func (lh *Ledger) deliverLocked(ops []*addOp) {
	lh.toDeliver = append(lh.toDeliver, ops...)
	if lh.delivering {
		lh.mu.Unlock()
		return
	}
	lh.delivering = true
	for len(lh.toDeliver) > 0 {
		ops := lh.toDeliver
		lh.toDeliver, lh.spareOps = lh.spareOps, nil
		lh.mu.Unlock()
		for _, op := range ops {
			id := op.entryID
			if op.err != nil {
				id = -1
			}
			op.done(id, op.err)
		}
		lh.mu.Lock()
		for _, op := range ops {
			op.delivered = true
			lh.recycleLocked(op)
		}
		clear(ops)
		lh.spareOps = ops[:0]
	}
	lh.delivering = false
	lh.idle.Broadcast() // Close waits for the callbacks too
	lh.mu.Unlock()
}

// recycleLocked returns op to the pool once nothing refers to it any more: delivered, and no
// response outstanding.
func (lh *Ledger) recycleLocked(op *addOp) {
	if op.delivered && op.outstanding == 0 {
		*op = addOp{lh: lh}
		lh.ops.Put(op)
	}
}

// failLocked makes err sticky and completes every pending add with it. It does not pop them:
// its callers do (addResponse right after; an ensemble change, which may be sending them,
// once its sends are out).
func (lh *Ledger) failLocked(err error) {
	if lh.err != nil {
		return
	}
	lh.err = err
	for _, op := range lh.pending {
		op.completed = true
		if op.err == nil { // a refused append keeps its own error
			op.err = err
		}
	}
	lh.unsent = nil
}

// quarantineLocked records that the bookies in failed are being replaced and returns the
// bookies still in quarantine: those replaced within BookieQuarantineTime (failed included).
func (lh *Ledger) quarantineLocked(failed map[string]bool) map[string]bool {
	now := monotime.Now()
	for b := range failed {
		lh.replaced[b] = now
	}
	quarantined := make(map[string]bool, len(lh.replaced))
	for b, at := range lh.replaced {
		if now-at < int64(lh.c.cfg.BookieQuarantineTime) {
			quarantined[b] = true
		} else {
			delete(lh.replaced, b)
		}
	}
	return quarantined
}

// changeEnsemble replaces the bookies in toReplace with a compare-and-set of the metadata: a
// new ensemble from LAC+1 on (BookKeeper's ensemble change). Adds from LAC+1 on that a
// replaced bookie had acknowledged are unacknowledged and sent to its replacement, so every
// entry ends up on Qa bookies of the fragment the metadata records for it.
func (lh *Ledger) changeEnsemble() {
	for {
		lh.mu.Lock()
		if err := lh.c.ctx.Err(); err != nil {
			lh.failLocked(fmt.Errorf("%w: during an ensemble change", ErrClosed))
		}
		if lh.err != nil || len(lh.toReplace) == 0 {
			lh.endChangeLocked()
			return
		}
		failed := lh.toReplace
		excluded := lh.quarantineLocked(failed)
		lh.toReplace = map[string]bool{}
		lh.changes++
		if lh.changes > lh.c.cfg.MaxEnsembleChanges {
			lh.failLocked(ErrTooManyEnsembleChanges)
			lh.endChangeLocked()
			return
		}
		md, version, lac := lh.md, lh.version, lh.lac
		lh.mu.Unlock()

		ctx, cancel := context.WithTimeout(lh.c.ctx, 30*time.Second)
		newMd, newVersion, err := lh.updateEnsemble(ctx, md, version, lac, failed, excluded)
		cancel()

		lh.mu.Lock()
		if err != nil {
			lh.c.log.Error("ensemble change failed", "ledger", lh.id, "err", err)
			err = ledgerErr(err, lh.id)
			if lh.c.ctx.Err() != nil && !errors.Is(err, ErrClosed) {
				// Client.Close cut the change short (a metadata request in flight fails with
				// the context's error): what is pending fails with ErrClosed, as elsewhere.
				err = fmt.Errorf("%w: during an ensemble change: %w", ErrClosed, err)
			}
			lh.failLocked(err)
			lh.endChangeLocked()
			return
		}
		if lh.err != nil { // failed meanwhile: nothing to resend
			lh.endChangeLocked()
			return
		}
		lh.md, lh.version = newMd, newVersion
		newEns := lh.currentBookiesLocked()
		for b := range lh.toReplace { // failures, during the change, of bookies it replaced
			if !slices.Contains(newEns, b) {
				delete(lh.toReplace, b)
			}
		}
		lh.c.log.Info("ensemble changed", "ledger", lh.id, "from_entry", lac+1, "ensemble", newEns)
		var sends []sendTarget
		e := int64(lh.md.EnsembleSize)
		for _, op := range lh.pending {
			if op.ensemble == nil || op.popped {
				continue
			}
			old := op.ensemble
			op.ensemble = newEns
			var mask uint64
			for pos := range lh.md.WriteQuorumSize {
				i := (op.entryID + int64(pos)) % e
				if old[i] == newEns[i] {
					continue
				}
				if op.acked&(1<<pos) != 0 {
					op.acked &^= 1 << pos
					op.ackCount--
				}
				mask |= 1 << pos
			}
			op.completed = op.ackCount >= lh.md.AckQuorumSize
			var buf [maxWriteQuorum]sendTarget
			n := lh.prepareSendLocked(op, mask, buf[:0])
			sends = append(sends, buf[:n]...)
		}
		// The sends go out from here, with changing still set so that no add is acknowledged
		// before they are out: an add with Qa acknowledgements already is also sent to the
		// replacement bookie, and its callback releases the caller's buffer (the transport
		// copies the data while sending). Adds appended meanwhile wait in unsent.
		for lh.err == nil && len(lh.toReplace) == 0 {
			for _, op := range lh.unsent {
				var buf [maxWriteQuorum]sendTarget
				n := lh.prepareSendLocked(op, allPositions(lh.md.WriteQuorumSize), buf[:0])
				sends = append(sends, buf[:n]...)
			}
			lh.unsent = nil
			if len(sends) == 0 {
				break
			}
			lh.mu.Unlock()
			lh.send(sends)
			sends = sends[:0]
			lh.mu.Lock()
		}
		if lh.err != nil || len(lh.toReplace) == 0 {
			lh.endChangeLocked()
			return
		}
		// More bookies failed meanwhile: change again before releasing anything.
		lh.mu.Unlock()
		lh.send(sends)
	}
}

// endChangeLocked ends an ensemble change: it wakes Close, pops and delivers what completed
// meanwhile, and unlocks mu.
func (lh *Ledger) endChangeLocked() {
	lh.changing = false
	lh.idle.Broadcast()
	lh.deliverLocked(lh.popLocked(nil))
}

// replaceBookies replaces each bookie of md's last ensemble that is in failed, from entry first
// on (in that ensemble if it starts at first, else in a new one), with one the placement policy
// picks outside excluded; with fallBack, outside failed only when that leaves none. md is
// changed only if every replacement was found. The policy sees the positions that later
// replacements fill as empty: a failed bookie is no neighbour to judge a replacement by (the
// rack-aware policy put a write quorum on one rack, next to a failed bookie's rack).
func (c *Client) replaceBookies(md *metadata.LedgerMetadata, first int64, failed, excluded map[string]bool, fallBack bool) error {
	last, _ := md.LastEnsemble()
	ens := slices.Clone(last.Bookies)
	for i, b := range ens {
		if failed[b] {
			ens[i] = ""
		}
	}
	ex := make(map[string]bool, len(excluded)+len(failed)) // the empty positions' bookies too
	maps.Copy(ex, excluded)
	maps.Copy(ex, failed)
	excluded = ex
	for i, b := range last.Bookies {
		if !failed[b] {
			continue
		}
		ens[i] = b // the bookie to take the place of
		repl, err := c.cfg.Placement.Replace(ens, i, md.WriteQuorumSize, c.writableBookies(), excluded)
		if fallBack && errors.Is(err, ErrNotEnoughBookies) && len(excluded) > len(failed) {
			repl, err = c.cfg.Placement.Replace(ens, i, md.WriteQuorumSize, c.writableBookies(), failed)
		}
		if err != nil {
			return err
		}
		ens[i] = repl
	}
	if last.FirstEntryID == first {
		md.Ensembles[len(md.Ensembles)-1].Bookies = ens
	} else {
		md.Ensembles = append(md.Ensembles, metadata.Ensemble{FirstEntryID: first, Bookies: ens})
	}
	return nil
}

// takenOver says whether md shows that another client took the ledger from its writer: it is
// being recovered (ErrLedgerFenced), or was recovered and closed (ErrLedgerFenced and
// ErrLedgerClosed; the writer's own close never runs during an ensemble change).
func takenOver(md *metadata.LedgerMetadata) error {
	switch md.State {
	case metadata.StateInRecovery:
		return ErrLedgerFenced
	case metadata.StateClosed:
		return fmt.Errorf("%w: %w by another client at entry %d", ErrLedgerFenced, ErrLedgerClosed, md.LastEntryID)
	}
	return nil
}

// updateEnsemble replaces the failed bookies with bookies not in excluded and writes the new
// ensemble into the metadata with compare-and-set, retrying on conflicts; it fails if the
// ledger was closed or is being recovered meanwhile.
func (lh *Ledger) updateEnsemble(ctx context.Context, md *metadata.LedgerMetadata, version metadata.Version, lac int64,
	failed, excluded map[string]bool) (*metadata.LedgerMetadata, metadata.Version, error) {
	backoff := 50 * time.Millisecond
	for {
		if err := takenOver(md); err != nil {
			return nil, 0, err
		}
		// Falling back on bookies replaced earlier: one may be back (a restart), and ending the
		// handle would be worse (BookKeeper also falls back on quarantined bookies).
		next := md.Clone()
		if err := lh.c.replaceBookies(next, lac+1, failed, excluded, true); err != nil {
			// The bookies may have failed the add because another client fenced the ledger:
			// say so rather than that no bookie is left.
			if cur, _, rerr := lh.c.md.Ledgers().Read(ctx, lh.id); rerr == nil && takenOver(cur) != nil {
				return nil, 0, takenOver(cur)
			}
			return nil, 0, err
		}
		v, err := lh.c.md.Ledgers().Update(ctx, lh.id, next, version)
		var bve *metadata.BadVersionError
		switch {
		case err == nil:
			return next, v, nil
		case errors.As(err, &bve) && bve.Metadata != nil:
			md, version = bve.Metadata, bve.Current
			continue
		case errors.As(err, &bve):
			// The conflict came without the current metadata: read it (retrying below if
			// that fails too).
			if cur, v, rerr := lh.c.md.Ledgers().Read(ctx, lh.id); rerr == nil {
				md, version = cur, v
				continue
			}
		case errors.Is(err, metadata.ErrNoSuchLedger):
			return nil, 0, fmt.Errorf("%w: %d was deleted", ErrNoSuchLedger, lh.id)
		case ctx.Err() != nil:
			return nil, 0, fmt.Errorf("ensemble change: %w", err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("ensemble change: %w", ctx.Err())
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Close waits for pending adds and their callbacks, then closes the ledger in the metadata at
// the last entry it acknowledged, also after adds failed (BookKeeper's close of a failed
// handle), unless the ledger was fenced or the bookies refused this client. It must not be
// called from an AppendAsync callback (that goroutine may be the one to run the others).
// Closing a read handle does nothing. Later appends fail with ErrLedgerClosed (also after a
// Close whose ctx ended while it waited), not after one whose ctx was done before the call.
func (lh *Ledger) Close(ctx context.Context) error {
	if lh.readOnly {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err // before closing is set: the handle stays writable
	}
	lh.mu.Lock()
	lh.closing = true
	stop := context.AfterFunc(ctx, func() {
		lh.mu.Lock()
		lh.idle.Broadcast()
		lh.mu.Unlock()
	})
	defer stop()
	// Also after a failure: the failed adds are called back once an ensemble change has sent
	// what it was sending, or once AppendAsync has.
	for (len(lh.pending) > 0 || lh.changing || lh.delivering || len(lh.toDeliver) > 0) && ctx.Err() == nil {
		lh.idle.Wait()
	}
	if err := ctx.Err(); err != nil {
		lh.mu.Unlock()
		return err
	}
	lac, length, ferr := lh.lac, lh.confirmedLength, lh.err
	lh.mu.Unlock()
	if errors.Is(ferr, ErrLedgerFenced) || errors.Is(ferr, ErrUnauthorized) {
		return ferr
	}
	md, v, err := metadata.UpdateLedger(ctx, lh.c.md.Ledgers(), lh.id, func(m *metadata.LedgerMetadata) error {
		switch m.State {
		case metadata.StateClosed:
			if m.LastEntryID == lac && m.Length == length {
				return metadata.ErrUnchanged
			}
			return fmt.Errorf("%w: closed by another client at entry %d, length %d (this handle acknowledged up to %d, length %d)",
				ErrLedgerFenced, m.LastEntryID, m.Length, lac, length)
		case metadata.StateInRecovery:
			return ErrLedgerFenced
		}
		m.State, m.LastEntryID, m.Length = metadata.StateClosed, lac, length
		return nil
	})
	if err != nil {
		return ledgerErr(err, lh.id)
	}
	lh.mu.Lock()
	lh.md, lh.version = md, v
	lh.mu.Unlock()
	return nil
}

// maxPayload is the largest payload that fits a frame: the frame limit less the request
// header, master key, entry header and digest.
func (c *Client) maxPayload(dg *digester) int {
	frame := c.cfg.Transport.MaxFrameSize
	if frame <= 0 {
		frame = protocol.DefaultMaxFrameSize
	}
	return frame - protocol.LengthPrefixSize - protocol.HeaderSize - protocol.MasterKeyLength - dg.headerSize()
}
