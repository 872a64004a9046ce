package server

import (
	"context"
	"encoding/binary"
	"errors"
	"math"

	"github.com/valyala/bytebufferpool"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// errStopping answers a fencing read whose fence was still pending when the server stopped.
var errStopping = errors.New("server: stopping")

// readTask is a read or batch read handed to the worker pool.
type readTask struct {
	cc      *connState
	header  protocol.Header
	start   int64 // monotime.Now at decode
	fencing bool
	key     [protocol.MasterKeyLength]byte

	ledgerID int64
	entryID  int64 // the start entry of a batch read

	// Batch reads only.
	requestID int64
	maxCount  int32
	maxSize   int64
}

func (s *Server) newReadTask(cc *connState, h protocol.Header, start int64) *readTask {
	t, _ := s.readTasks.Get().(*readTask)
	if t == nil {
		t = new(readTask)
	}
	*t = readTask{cc: cc, header: h, start: start}
	return t
}

func (s *Server) putReadTask(t *readTask) {
	*t = readTask{}
	s.readTasks.Put(t)
}

func (t *readTask) isBatch() bool { return t.header.Op == protocol.OpBatchReadEntry }

// appendError appends the error response to the task's request.
func (t *readTask) appendError(dst []byte, rc protocol.ReturnCode) []byte {
	if t.isBatch() {
		return appendBatchError(dst, &protocol.BatchReadRequest{Header: t.header, LedgerID: t.ledgerID,
			StartEntryID: t.entryID, RequestID: t.requestID}, rc)
	}
	r := protocol.ReadRequest{Header: t.header, LedgerID: t.ledgerID, EntryID: t.entryID}
	out, _ := r.AppendResponse(dst, rc, nil)
	return out
}

// startReadPool starts the read workers.
func (s *Server) startReadPool() {
	s.pool.start(s.cfg.NumReadWorkerThreads, s.cfg.ReadWorkerQueueSize, s.runRead)
}

// stopReadPool ends the read workers once they finish their current task, then drops what is
// still queued (its connections are closed by then).
func (s *Server) stopReadPool(ctx context.Context) error {
	return s.pool.stop(ctx, func(t *readTask) {
		t.cc.releaseRead()
		s.putReadTask(t)
	})
}

// runRead serves one task on a worker goroutine: fence first if asked, then read, then queue
// the response on the connection. A read for a connection over its outbound limit, or when the
// server's unwritten read bytes are spent, is answered ETOOMANYREQUESTS: before reading (and
// fencing) when that is already so, and after reading when the response does not fit
// (queueRead; a fencing read's response is not refused then).
func (s *Server) runRead(t *readTask) {
	cc := t.cc
	defer func() {
		if r := recover(); r != nil {
			s.recovered(cc, r)
			cc.closeAsync()
		}
		cc.releaseRead()
		s.putReadTask(t)
	}()
	if cc.isClosed() {
		return
	}
	b := bytebufferpool.Get()
	rc := protocol.EOK
	if cc.readBudgetSpent() { // the client is not reading its responses, or nobody is
		rc = protocol.ETOOMANYREQUESTS
	}
	if rc == protocol.EOK && t.fencing {
		rc = s.fence(t)
	}
	if rc == protocol.EOK {
		if t.isBatch() {
			b.B, rc = s.readBatch(t, b.B[:0])
		} else {
			b.B, rc = s.readOne(t, b.B[:0])
		}
	}
	if rc == protocol.EOK {
		if cc.queueRead(b, t.fencing) {
			s.metrics.observeRead(t.start, true)
			return
		}
		rc = protocol.ETOOMANYREQUESTS
	}
	// Counted by the code sent, as adds are: Storage's errors can map to ETOOMANYREQUESTS too.
	if rc == protocol.ETOOMANYREQUESTS {
		s.stats.rejected.Add(1)
		s.metrics.readRejected()
	}
	b.B = t.appendError(b.B[:0], rc)
	cc.queueBuf(b)
	s.metrics.observeRead(t.start, false)
}

// fence fences the ledger and waits until the fence is durable (a worker goroutine may wait;
// fencing reads are rare, recovery-time requests).
func (s *Server) fence(t *readTask) protocol.ReturnCode {
	done := make(chan error, 1)
	if err := s.storage.Fence(t.ledgerID, t.key[:], s.fenceDone, done); err != nil {
		rc := s.cfg.ErrorCode(err)
		s.log.Debug("server: fence refused", "remote", t.cc.remote, "ledger", t.ledgerID, "code", rc, "err", err)
		return rc
	}
	var err error
	select {
	case err = <-done:
	case <-s.pool.quit:
		err = errStopping
	}
	if err != nil {
		rc := s.cfg.ErrorCode(err)
		s.log.Warn("server: fence failed", "remote", t.cc.remote, "ledger", t.ledgerID, "code", rc, "err", err)
		return rc
	}
	s.log.Info("server: ledger fenced", "remote", t.cc.remote, "ledger", t.ledgerID)
	return protocol.EOK
}

// completeFence is the Storage.Fence callback (bound once as s.fenceDone).
func completeFence(ctx any, err error) {
	ctx.(chan error) <- err
}

// readOne appends a read response: the header, then Storage.Read appends the entry in place.
func (s *Server) readOne(t *readTask, dst []byte) ([]byte, protocol.ReturnCode) {
	r := protocol.ReadRequest{Header: t.header, LedgerID: t.ledgerID, EntryID: t.entryID}
	dst, _ = r.AppendResponse(dst, protocol.EOK, nil)
	dst, err := s.storage.Read(t.ledgerID, t.entryID, dst)
	if err != nil {
		return dst[:0], s.cfg.ErrorCode(err)
	}
	if err := protocol.PatchFrameLength(dst, 0); err != nil {
		return dst[:0], protocol.EIO
	}
	return dst, protocol.EOK
}

// readBatch appends a batch read response with entries from the start entry on, as
// BookKeeper's BatchedReadEntryProcessor does: at most maxCount entries (0: no count limit);
// the first entry is always sent, later ones only while the response stays within maxSize and
// the frame limit; it stops at the first entry it cannot read, and an error on the first entry
// is the response's code. A start entry of -1 reads only the last entry.
func (s *Server) readBatch(t *readTask, dst []byte) ([]byte, protocol.ReturnCode) {
	dst, err := protocol.AppendBatchReadResponse(dst, protocol.BatchReadResponse{Header: t.header, RC: protocol.EOK,
		LedgerID: t.ledgerID, StartEntryID: t.entryID, RequestID: t.requestID})
	if err != nil {
		return dst[:0], protocol.EIO
	}
	count := int64(t.maxCount)
	if count <= 0 {
		count = math.MaxInt64
	}
	if t.entryID == protocol.LastAddConfirmedEntryID {
		count = 1
	}
	limit := min(t.maxSize, int64(s.cfg.MaxFrameSize))
	frameSize := int64(len(dst)) // BookKeeper counts 24 + 8 + 4 before the entries; close enough
	for i := int64(0); i < count; i++ {
		mark := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		var err error
		dst, err = s.storage.Read(t.ledgerID, t.entryID+i, dst)
		if err != nil {
			if i == 0 {
				return dst[:0], s.cfg.ErrorCode(err)
			}
			dst = dst[:mark]
			break
		}
		n := len(dst) - mark - 4
		frameSize += int64(n) + 4
		if i > 0 && (frameSize > limit || n > math.MaxInt32) {
			dst = dst[:mark]
			break
		}
		binary.BigEndian.PutUint32(dst[mark:], uint32(n))
	}
	if err := protocol.PatchFrameLength(dst, 0); err != nil {
		return dst[:0], protocol.EIO
	}
	return dst, protocol.EOK
}
