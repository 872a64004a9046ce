package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// Reasons the server closes a connection (metrics label and log attribute).
const (
	closeProtocol   = "protocol"    // undecodable frame (ActionClose, bad length, oversize)
	closeSlowClient = "slow_client" // inbound bytes over the limit while decoding is paused
	closePanic      = "panic"       // a request handler panicked
	closeAuth       = "auth"        // authentication refused or impossible
)

// addOp is the context of one add between Storage.Add and its completion.
type addOp struct {
	cc       *connState
	version  uint8
	ledgerID int64
	entryID  int64
	start    int64 // monotime.Now at decode
}

// oversizeAddHead is the start of an add frame that names its entry: length prefix, header,
// master key and the stored entry's 32-byte header.
const oversizeAddHead = protocol.LengthPrefixSize + protocol.HeaderSize + protocol.MasterKeyLength + protocol.StoredEntryHeaderSize

// maxDiscardFrames bounds the oversize adds whose bytes are discarded: a frame announcing
// more than maxDiscardFrames × MaxFrameSize closes the connection at its length prefix. The
// discard is for a client whose own frame limit is larger than the bookie's (#2357), a
// configuration mismatch; 8 × MaxFrameSize (40 MiB at the default) leaves room for such
// clients, while a claim far beyond it (up to 2 GiB) is more likely a stream out of step or a hostile
// one, and discarding it would tie the connection to that much traffic for nothing.
const maxDiscardFrames = 8

// oversize decides what to do with a frame over MaxFrameSize whose first bytes are head (at
// least the length prefix). An add (on an authenticated connection, where authentication is
// on) of at most maxDiscardFrames × MaxFrameSize is answered EBADREQ and its bytes are then
// discarded as they arrive, never buffered: closing the connection, as Netty's frame decoder
// does, fails every request in flight on it, of every ledger, and clients take that for a
// bookie failure and change ensembles (BookKeeper #2357). Anything else closes the
// connection, as the stream may be out of step. skip > 0: discard that many bytes, from
// head's start; wait: read more first; neither: close.
func (cc *connState) oversize(head []byte) (skip int, wait bool) {
	s := cc.srv
	if int64(binary.BigEndian.Uint32(head))+protocol.LengthPrefixSize > int64(s.cfg.MaxFrameSize)*maxDiscardFrames {
		return 0, false
	}
	if len(head) < protocol.LengthPrefixSize+protocol.HeaderSize {
		return 0, true
	}
	h := protocol.ParseHeader(binary.BigEndian.Uint32(head[protocol.LengthPrefixSize:]))
	if h.Op != protocol.OpAddEntry || cc.unauthorized() {
		return 0, false
	}
	if len(head) < oversizeAddHead {
		return 0, true
	}
	// The head decodes as an add with an empty payload (its ids and master key).
	req := &cc.req
	if err := protocol.DecodeRequest(head[protocol.LengthPrefixSize:oversizeAddHead], req); err != nil ||
		req.Header.Op != protocol.OpAddEntry {
		return 0, false
	}
	size := int(binary.BigEndian.Uint32(head)) + protocol.LengthPrefixSize
	s.stats.badRequests.Add(1)
	s.metrics.observeAdd(monotime.Now(), false)
	s.log.Warn("server: add over the frame limit (nettyMaxFrameSizeBytes) answered EBADREQ", "remote", cc.remote,
		"ledger", req.Add.LedgerID, "entry", req.Add.EntryID, "size", size, "limit", s.cfg.MaxFrameSize)
	cc.immediate = req.Add.AppendResponse(cc.immediate, protocol.EBADREQ)
	return size, false
}

// handleFrame decodes one request frame (the bytes after the length prefix, aliasing the
// receive buffer) and dispatches it. It runs on the connection's reader and never blocks.
// closeConn reports that the connection must be closed (its reason already logged).
func (cc *connState) handleFrame(frame []byte) (closeConn bool) {
	s := cc.srv
	req := &cc.req
	if err := protocol.DecodeRequest(frame, req); err != nil {
		de, ok := protocol.AsDecodeError(err)
		if ok && de.Action == protocol.ActionRespond {
			s.stats.badRequests.Add(1)
			s.log.Debug("server: bad request answered", "remote", cc.remote, "code", de.Code, "err", err)
			cc.immediate = de.AppendResponse(cc.immediate)
			return false
		}
		s.closeFor(cc, closeProtocol, err)
		return true
	}
	if req.Header.Op == protocol.OpAuth {
		return cc.handleAuth(&req.Auth)
	}
	if cc.unauthorized() {
		// BookKeeper's AuthHandler for v2: adds and reads (batch reads are reads) get EUA.
		cc.respond(req, protocol.EUA)
		return false
	}
	switch req.Header.Op {
	case protocol.OpAddEntry:
		cc.handleAdd(&req.Add)
	case protocol.OpReadEntry:
		cc.handleRead(&req.Read)
	case protocol.OpBatchReadEntry:
		cc.handleBatchRead(&req.BatchRead)
	default:
		// DecodeRequest accepts no other opcode; be defensive rather than silent.
		s.closeFor(cc, closeProtocol, fmt.Errorf("server: undispatchable opcode %v", req.Header.Op))
		return true
	}
	return false
}

// respond appends an error response to a decoded add, read or batch read.
func (cc *connState) respond(req *protocol.Request, rc protocol.ReturnCode) {
	switch req.Header.Op {
	case protocol.OpAddEntry:
		cc.immediate = req.Add.AppendResponse(cc.immediate, rc)
	case protocol.OpReadEntry:
		cc.immediate, _ = req.Read.AppendResponse(cc.immediate, rc, nil)
	case protocol.OpBatchReadEntry:
		cc.immediate = appendBatchError(cc.immediate, &req.BatchRead, rc)
	}
}

func appendBatchError(dst []byte, r *protocol.BatchReadRequest, rc protocol.ReturnCode) []byte {
	out, err := protocol.AppendBatchReadResponse(dst, protocol.BatchReadResponse{
		Header: protocol.Header{Version: r.Header.Version}, RC: rc,
		LedgerID: r.LedgerID, StartEntryID: r.StartEntryID, RequestID: r.RequestID})
	if err != nil { // cannot happen: no data
		return dst
	}
	return out
}

// handleAdd hands an add to storage, or answers it at once. Adds answered on the reader are
// observed as failed add requests, as BookKeeper records them; the clock is read once per add
// either way.
func (cc *connState) handleAdd(r *protocol.AddRequest) {
	s := cc.srv
	start := monotime.Now()
	if r.LedgerID < 0 || r.EntryID < 0 {
		cc.immediate = r.AppendResponse(cc.immediate, protocol.EBADREQ)
		s.metrics.observeAdd(start, false)
		return
	}
	// As BookKeeper: a read-only bookie takes only high-priority adds (recovery sends its adds
	// with FlagRecoveryAdd|FlagHighPriority); a recovery add without the flag is refused too.
	if !r.IsHighPriority() && s.storage.ReadOnly() {
		cc.immediate = r.AppendResponse(cc.immediate, protocol.EREADONLY)
		s.metrics.observeAdd(start, false)
		return
	}
	if !cc.acquireAdd() {
		s.stats.rejected.Add(1)
		s.metrics.addRejected()
		cc.immediate = r.AppendResponse(cc.immediate, protocol.ETOOMANYREQUESTS)
		s.metrics.observeAdd(start, false)
		return
	}
	op, _ := s.addOps.Get().(*addOp)
	if op == nil {
		op = new(addOp)
	}
	*op = addOp{cc: cc, version: r.Header.Version, ledgerID: r.LedgerID, entryID: r.EntryID, start: start}
	returned := false
	defer func() {
		if !returned { // Storage.Add panicked: give the reservation back; the reader recovers
			cc.releaseAdd()
		}
	}()
	var err error
	if nb, ok := s.storage.(NonBlockingAdder); ok {
		var queued bool
		queued, err = nb.TryAdd(r.MasterKey[:], r.Entry, r.IsRecoveryAdd(), s.addDone, op)
		if !queued && err == nil && !s.blocking.submit(r, op) {
			err = ErrTooManyAdds
		}
	} else {
		err = s.storage.Add(r.MasterKey[:], r.Entry, r.IsRecoveryAdd(), s.addDone, op)
	}
	returned = true
	if err != nil {
		cc.releaseAdd()
		rc := s.addErrorCode(err)
		s.metrics.observeAdd(op.start, false)
		*op = addOp{}
		s.addOps.Put(op)
		s.log.Debug("server: add refused", "remote", cc.remote, "ledger", r.LedgerID, "entry", r.EntryID, "code", rc, "err", err)
		cc.immediate = r.AppendResponse(cc.immediate, rc)
	}
}

// completeAdd is the Storage.Add callback (bound once as s.addDone): it queues the response
// on the connection, which wakes the writer if the queue was empty.
func (s *Server) completeAdd(ctx any, err error) {
	op := ctx.(*addOp)
	cc, version, ledgerID, entryID, start := op.cc, op.version, op.ledgerID, op.entryID, op.start
	*op = addOp{}
	s.addOps.Put(op)
	rc := protocol.EOK
	if err != nil {
		rc = s.addErrorCode(err)
		s.log.Debug("server: add failed", "remote", cc.remote, "ledger", ledgerID, "entry", entryID, "code", rc, "err", err)
	}
	cc.queueAdd(version, rc, ledgerID, entryID)
	cc.releaseAdd()
	s.metrics.observeAdd(start, rc == protocol.EOK)
}

// addErrorCode is the return code of an add that failed with err: ETOOMANYREQUESTS for the
// server's own ErrTooManyAdds (whatever Config.ErrorCode says), else Config.ErrorCode's. An add
// answered ETOOMANYREQUESTS is counted as rejected, as those refused on the reader are.
func (s *Server) addErrorCode(err error) protocol.ReturnCode {
	rc := protocol.ETOOMANYREQUESTS
	if !errors.Is(err, ErrTooManyAdds) {
		rc = s.cfg.ErrorCode(err)
	}
	if rc == protocol.ETOOMANYREQUESTS {
		s.stats.rejected.Add(1)
		s.metrics.addRejected()
	}
	return rc
}

// handleRead answers a read from the cache on the reader when it can, else queues it for the
// read workers. Every read is observed in the read latency, those answered here included.
func (cc *connState) handleRead(r *protocol.ReadRequest) {
	s := cc.srv
	start := monotime.Now()
	if r.EntryID < protocol.LastAddConfirmedEntryID || r.LedgerID < 0 {
		cc.immediate, _ = r.AppendResponse(cc.immediate, protocol.EBADREQ, nil)
		s.metrics.observeRead(start, false)
		return
	}
	if r.IsFencing() && !r.HasMasterKey {
		// BookKeeper: "Password not provided, Not safe to fence". Fencing under no key would
		// also create the ledger here with an empty one, locking its writer out.
		cc.immediate, _ = r.AppendResponse(cc.immediate, protocol.EUA, nil)
		s.metrics.observeRead(start, false)
		return
	}
	if !r.IsFencing() && r.EntryID >= 0 {
		at := len(cc.immediate)
		buf, _ := r.AppendResponse(cc.immediate, protocol.EOK, nil)
		buf, ok := s.storage.ReadCached(r.LedgerID, r.EntryID, buf)
		if ok && protocol.PatchFrameLength(buf, at) == nil {
			// A cached response counts against MaxUnwrittenReadBytes as a worker's does
			// (queueRead); the reader adds its cached responses to the total when it hands the
			// immediate buffer on, one atomic operation per batch rather than per read.
			n := int64(len(buf) - at)
			if held := s.unwrittenReads.Load() + int64(cc.immediateRead); held > 0 && held+n > cc.readAllowance() {
				s.stats.rejected.Add(1)
				s.metrics.readRejected()
				cc.immediate, _ = r.AppendResponse(buf[:at], protocol.ETOOMANYREQUESTS, nil)
				s.metrics.observeRead(start, false)
				return
			}
			cc.immediate = buf
			cc.immediateRead += int(n)
			s.stats.cachedReads.Add(1)
			s.metrics.observeRead(start, true)
			return
		}
		cc.immediate = buf[:at]
	}
	t := s.newReadTask(cc, r.Header, start)
	t.ledgerID, t.entryID = r.LedgerID, r.EntryID
	t.fencing, t.key = r.IsFencing(), r.MasterKey
	cc.submitRead(t)
}

func (cc *connState) handleBatchRead(r *protocol.BatchReadRequest) {
	s := cc.srv
	start := monotime.Now()
	if r.StartEntryID < protocol.LastAddConfirmedEntryID || r.LedgerID < 0 {
		cc.immediate = appendBatchError(cc.immediate, r, protocol.EBADREQ)
		s.metrics.observeRead(start, false)
		return
	}
	if r.IsFencing() && !r.HasMasterKey {
		cc.immediate = appendBatchError(cc.immediate, r, protocol.EUA)
		s.metrics.observeRead(start, false)
		return
	}
	t := s.newReadTask(cc, r.Header, start)
	t.ledgerID, t.entryID = r.LedgerID, r.StartEntryID
	t.fencing, t.key = r.IsFencing(), r.MasterKey
	t.requestID, t.maxCount, t.maxSize = r.RequestID, r.MaxCount, r.MaxSize
	cc.submitRead(t)
}

// submitRead reserves the read against the limits and queues it for the worker pool, or
// answers ETOOMANYREQUESTS.
func (cc *connState) submitRead(t *readTask) {
	s := cc.srv
	if cc.acquireRead() {
		if s.pool.submit(t) {
			return
		}
		cc.releaseRead()
	}
	s.stats.rejected.Add(1)
	s.metrics.readRejected()
	cc.immediate = t.appendError(cc.immediate, protocol.ETOOMANYREQUESTS)
	s.metrics.observeRead(t.start, false)
	s.putReadTask(t)
}

// unauthorized reports whether adds and reads on the connection are refused (EUA): it has
// not authenticated where authentication is required, it is plaintext where only TLS is
// served, or its certificate was not authorized.
func (cc *connState) unauthorized() bool {
	return cc.refused || cc.srv.cfg.Auth != nil && !cc.authed
}

func (cc *connState) handleAuth(r *protocol.AuthRequest) (closeConn bool) {
	s := cc.srv
	p := s.cfg.Auth
	if cc.refused {
		s.closeFor(cc, closeAuth, errors.New("server: AUTH on a connection refused service (the plaintext port of a TLS-only bookie, or a client certificate not authorized)"))
		return true
	}
	if p == nil {
		s.closeFor(cc, closeAuth, fmt.Errorf("server: AUTH from plugin %q but authentication is not configured", r.Message.PluginName))
		return true
	}
	name := p.Name()
	if string(r.Message.PluginName) != name {
		s.closeFor(cc, closeAuth, fmt.Errorf("server: AUTH from plugin %q, expected %q", r.Message.PluginName, name))
		return true
	}
	if cc.authSess == nil {
		cc.authSess = p.NewSession(cc.remote)
	}
	answer, done, err := cc.authSess.Step(r.Message.Payload)
	if err != nil {
		s.stats.authFailures.Add(1)
		s.closeFor(cc, closeAuth, err)
		return true
	}
	out, err := protocol.AppendAuthResponse(cc.immediate, protocol.AuthResponse{
		Header:  protocol.Header{Version: protocol.CurrentVersion, Op: protocol.OpAuth},
		Message: protocol.AuthMessage{PluginName: []byte(name), Payload: answer}})
	if err != nil {
		s.closeFor(cc, closeAuth, err)
		return true
	}
	cc.immediate = out
	if done {
		cc.authed, cc.authSess = true, nil
		s.log.Debug("server: client authenticated", "remote", cc.remote, "plugin", name)
	}
	return false
}

// closeFor logs and counts a close decided by the server.
func (s *Server) closeFor(cc *connState, reason string, err error) {
	switch reason {
	case closeProtocol:
		s.stats.protocolCloses.Add(1)
	case closeSlowClient:
		s.stats.slowClientCloses.Add(1)
	case closePanic:
		s.stats.panics.Add(1)
	}
	s.metrics.connClosed(reason)
	level := s.log.Info
	if reason == closePanic {
		level = s.log.Error
	}
	level("server: closing connection", "remote", cc.remote, "reason", reason, "err", err)
}

// recovered handles a panic caught on a connection's reader or on a read worker: the
// connection is closed and the process goes on. The panic is a bug; it is logged with its
// stack at error level and counted.
func (s *Server) recovered(cc *connState, r any) {
	s.closeFor(cc, closePanic, fmt.Errorf("server: panic: %v\n%s", r, debug.Stack()))
}
