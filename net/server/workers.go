package server

import (
	"context"
	"sync"
)

// workerPool is a fixed set of goroutines running tasks from a bounded queue; submit never
// blocks (a full queue is the caller's to answer).
type workerPool[T any] struct {
	tasks chan T
	quit  chan struct{} // closed by stop: workers exit, waits on it give up
	wg    sync.WaitGroup
}

func (p *workerPool[T]) start(workers, queue int, run func(T)) {
	p.tasks = make(chan T, queue)
	p.quit = make(chan struct{})
	p.wg.Add(workers)
	for range workers {
		go func() {
			defer p.wg.Done()
			for {
				select {
				case t := <-p.tasks:
					run(t)
				case <-p.quit:
					return
				}
			}
		}()
	}
}

// submit queues t; false means the queue is full.
func (p *workerPool[T]) submit(t T) bool {
	select {
	case p.tasks <- t:
		return true
	default:
		return false
	}
}

// stop ends the workers, hands what is still queued to drop, and waits for the workers to
// finish their current task, at most until ctx ends (a task stuck in storage must not hold the
// server's Stop; it finishes on its own and finds its connection closed).
func (p *workerPool[T]) stop(ctx context.Context, drop func(T)) error {
	close(p.quit)
	for drained := false; !drained; {
		select {
		case t := <-p.tasks:
			drop(t)
		default:
			drained = true
		}
	}
	return waitGroup(ctx, &p.wg)
}
