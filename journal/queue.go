package journal

import (
	"sync"
	"sync/atomic"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// queue is the bounded hand-off from producers to the journal's owner goroutine. Producers
// append single records or batches under a short lock; the owner takes everything queued at
// once by swapping slices, so no record crosses the boundary alone (BookKeeper's
// BatchedArrayBlockingQueue lesson: batches, not items).
type queue struct {
	// mu guards items, spare and closed; notFull waits on it.
	mu      sync.Mutex
	notFull *sync.Cond
	items   []*Entry
	spare   []*Entry
	limit   int
	closed  error
	// oldestNs is when the oldest queued record was pushed (monotime; one clock read when the
	// queue turns non-empty, none per record).
	oldestNs int64
	// notify holds a token when items went from empty to non-empty since the owner last looked.
	notify chan struct{}
	// queued mirrors len(items), for full without the lock (an event loop asks per add).
	queued atomic.Int64
}

func newQueue(limit int) *queue {
	q := &queue{
		items:  make([]*Entry, 0, limit),
		spare:  make([]*Entry, 0, limit),
		limit:  limit,
		notify: make(chan struct{}, 1),
	}
	q.notFull = sync.NewCond(&q.mu)
	return q
}

// push appends es, waiting while the queue has no room for them (a batch larger than the limit
// waits for an empty queue). It fails only once the queue is closed.
func (q *queue) push(es ...*Entry) error {
	q.mu.Lock()
	for q.closed == nil && len(q.items) > 0 && len(q.items)+len(es) > q.limit {
		q.notFull.Wait()
	}
	if q.closed != nil {
		err := q.closed
		q.mu.Unlock()
		return err
	}
	wasEmpty := len(q.items) == 0
	if wasEmpty {
		q.oldestNs = monotime.Now()
	}
	q.items = append(q.items, es...)
	q.queued.Store(int64(len(q.items)))
	q.mu.Unlock()
	if wasEmpty {
		select {
		case q.notify <- struct{}{}:
		default:
		}
	}
	return nil
}

// take returns everything queued, in order, and when its first record was pushed. The returned
// slice is valid until the next take.
func (q *queue) take() (batch []*Entry, oldestNs int64) {
	q.mu.Lock()
	batch, oldestNs = q.items, q.oldestNs
	q.items = q.spare[:0]
	q.spare = batch
	q.queued.Store(0)
	wasFull := len(batch) > 0
	q.mu.Unlock()
	if wasFull {
		q.notFull.Broadcast()
	}
	return batch, oldestNs
}

// full reports whether a push would wait now.
func (q *queue) full() bool { return q.queued.Load() >= int64(q.limit) }

// close makes later pushes fail with err and wakes blocked producers. Already queued records
// are still taken.
func (q *queue) close(err error) {
	q.mu.Lock()
	if q.closed == nil {
		q.closed = err
	}
	q.mu.Unlock()
	q.notFull.Broadcast()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// isClosed reports whether close was called.
func (q *queue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed != nil
}

// length is the number of queued records.
func (q *queue) length() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
