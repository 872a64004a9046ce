package server

import "sync"

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

// stop ends the workers once they finish their current task, then hands what is still queued
// to drop.
func (p *workerPool[T]) stop(drop func(T)) {
	close(p.quit)
	p.wg.Wait()
	for {
		select {
		case t := <-p.tasks:
			drop(t)
		default:
			return
		}
	}
}
