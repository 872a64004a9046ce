package server

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// Bounds of the blocking-add workers: adds that the storage could not take without waiting
// (NonBlockingAdder) wait here instead of on an event loop.
const (
	blockingAddWorkers  = 4
	blockingAddQueue    = 4096
	blockingAddMaxBytes = 64 << 20 // entry copies held by queued adds
)

// ErrTooManyAdds answers an add when even the blocking-add queue is full (ETOOMANYREQUESTS).
var ErrTooManyAdds = errors.New("server: too many adds waiting for storage")

type blockingAdd struct {
	key      [protocol.MasterKeyLength]byte
	entry    []byte // a copy: the receive buffer is reused after the event loop returns
	recovery bool
	op       *addOp
}

// blockingAdds runs Storage.Add for adds that must wait (a full write cache), so the event
// loops never do.
type blockingAdds struct {
	workerPool[blockingAdd]
	bytes atomic.Int64 // held by queued entry copies, at most blockingAddMaxBytes
}

func (b *blockingAdds) start(s *Server, workers, queue int) {
	b.workerPool.start(workers, queue, func(t blockingAdd) {
		b.bytes.Add(-int64(len(t.entry)))
		s.blockingAdd(t)
	})
}

// blockingAdd calls Storage.Add for a queued add. A panic in it is contained as on the event
// loop (handleAdd): the add's reservation is given back and its connection is closed, and the
// worker goes on.
func (s *Server) blockingAdd(t blockingAdd) {
	cc := t.op.cc
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			cc.releaseAdd()
			s.recovered(cc, r)
			cc.closeAsync()
		}
	}()
	err := s.storage.Add(t.key[:], t.entry, t.recovery, s.addDone, t.op)
	returned = true
	if err != nil {
		s.addDone(t.op, err)
	}
}

// submit queues an add with a copy of its entry; false if the queue or its byte budget is full.
func (b *blockingAdds) submit(r *protocol.AddRequest, op *addOp) bool {
	n := int64(len(r.Entry))
	if b.bytes.Add(n) > blockingAddMaxBytes {
		b.bytes.Add(-n)
		return false
	}
	t := blockingAdd{key: r.MasterKey, entry: append([]byte(nil), r.Entry...), recovery: r.IsRecoveryAdd(), op: op}
	if !b.workerPool.submit(t) {
		b.bytes.Add(-n)
		return false
	}
	return true
}

// stop ends the workers; the server has waited for adds in flight first, so the queue is empty.
func (b *blockingAdds) stop(ctx context.Context, s *Server) error {
	return b.workerPool.stop(ctx, func(t blockingAdd) { s.addDone(t.op, ErrTooManyAdds) })
}
