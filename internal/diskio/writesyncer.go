package diskio

import (
	"errors"
	"fmt"
	"sync"
)

// SyncMode says what a WriteRequest makes durable.
type SyncMode uint8

const (
	// SyncNone only writes: the data may still sit in the device's volatile cache.
	SyncNone SyncMode = iota
	// SyncWrite makes this write durable (RWF_DSYNC: a FUA write where the device supports it,
	// with the metadata needed to read it back). Earlier unsynced writes are not covered.
	SyncWrite
	// SyncFile writes, then fdatasyncs the file: everything written to it before is durable too.
	SyncFile
)

// WriteRequest is one write of Buf at Offset of File, made durable as Sync says.
type WriteRequest struct {
	File File
	// Buf must stay untouched until the request's Completion arrives. For direct files it must be
	// aligned (a Slab buffer).
	Buf []byte
	// BufIndex is Buf's index among the buffers registered with the WriteSyncer, or -1.
	BufIndex int
	Offset   int64
	Sync     SyncMode
	// ID is returned in the Completion.
	ID uint64
}

// Completion reports the end of a WriteRequest. Err is the write's error, else the sync's.
type Completion struct {
	ID  uint64
	Err error
}

// WriteSyncer runs write+fdatasync pairs in the background, up to Depth at once.
// Submit and Close are called by one goroutine (the owner); Completions may be read by another.
type WriteSyncer interface {
	// Submit starts req. The caller must not have more than Depth requests outstanding (submitted
	// and not yet received from Completions); Submit then never blocks on the device.
	Submit(req WriteRequest) error
	// Completions delivers exactly one Completion per submitted request, in any order.
	Completions() <-chan Completion
	// Depth is the number of requests that may be outstanding.
	Depth() int
	// Engine is the engine that serves the requests.
	Engine() Engine
	// Close waits for outstanding requests and releases resources. Completions is closed after
	// the last one has been delivered.
	Close() error
}

// ErrTooManyOutstanding is returned by Submit when Depth requests are already outstanding.
var ErrTooManyOutstanding = errors.New("diskio: too many outstanding write requests")

// NewWriteSyncer returns a WriteSyncer on the chosen engine. EngineAuto picks io_uring when it
// is available and falls back to psync. registered may name buffers that requests will use
// (io_uring registers them so that writes need no per-request page pinning).
func NewWriteSyncer(engine Engine, depth int, registered [][]byte) (WriteSyncer, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("diskio: write syncer depth %d must be positive", depth)
	}
	switch engine {
	case EnginePsync:
		return newPsyncWriteSyncer(depth), nil
	case EngineIOUring:
		return newUringWriteSyncer(depth, registered)
	case EngineAuto:
		if err := IOUringAvailable(); err != nil {
			return newPsyncWriteSyncer(depth), nil
		}
		return newUringWriteSyncer(depth, registered)
	}
	return nil, fmt.Errorf("diskio: unknown engine %v", engine)
}

// psyncWriteSyncer serves requests with pwrite+fdatasync on depth goroutines. With two or more,
// one request's write overlaps another's fdatasync.
type psyncWriteSyncer struct {
	requests    chan WriteRequest
	completions chan Completion
	done        chan struct{}
	depth       int
	workers     int
	exited      chan struct{}
	closeOnce   sync.Once
	closed      chan struct{} // closed after the last Completion was delivered
}

func newPsyncWriteSyncer(depth int) *psyncWriteSyncer {
	w := &psyncWriteSyncer{
		requests:    make(chan WriteRequest, depth),
		completions: make(chan Completion, depth),
		depth:       depth,
		workers:     depth,
		exited:      make(chan struct{}, depth),
		closed:      make(chan struct{}),
	}
	for range depth {
		go w.work()
	}
	go func() {
		for range w.workers {
			<-w.exited
		}
		close(w.completions)
		close(w.closed)
	}()
	return w
}

func (w *psyncWriteSyncer) work() {
	defer func() { w.exited <- struct{}{} }()
	for req := range w.requests {
		w.completions <- Completion{ID: req.ID, Err: writeSync(req)}
	}
}

// writeSync performs one request synchronously.
func writeSync(req WriteRequest) error {
	if dsync, ok := req.File.(interface {
		WriteAtDataSync(p []byte, off int64) error
	}); ok && req.Sync == SyncWrite {
		return dsync.WriteAtDataSync(req.Buf, req.Offset)
	}
	if _, err := req.File.WriteAt(req.Buf, req.Offset); err != nil {
		return err
	}
	if req.Sync != SyncNone {
		return req.File.SyncData()
	}
	return nil
}

func (w *psyncWriteSyncer) Submit(req WriteRequest) error {
	select {
	case w.requests <- req:
		return nil
	default:
		return ErrTooManyOutstanding
	}
}

func (w *psyncWriteSyncer) Completions() <-chan Completion { return w.completions }
func (w *psyncWriteSyncer) Depth() int                     { return w.depth }
func (w *psyncWriteSyncer) Engine() Engine                 { return EnginePsync }

// Close waits for the requests in flight; a second Close only waits.
func (w *psyncWriteSyncer) Close() error {
	w.closeOnce.Do(func() { close(w.requests) })
	<-w.closed
	return nil
}
