// Command wakeprobe measures how long a goroutine made runnable by a goroutine that keeps
// running waits before it runs, against how long an OS thread woken the same way waits, a
// goroutine parked in the netpoller woken through a pipe, and a waker that yields right after
// the wake-up. It explains the hand-off costs quoted
// in BENCHMARKS.md: each hand-off of work between goroutines (an event loop waking the
// journal, a callback waking a writer) pays the first.
//
//	go run ./scripts/wakeprobe            # GOMAXPROCS as the runtime sets it
//	GOMAXPROCS=4 go run ./scripts/wakeprobe
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"
)

const (
	rounds = 2000
	idle   = 200 * time.Microsecond // let the other side go idle first
	busy   = 300 * time.Microsecond // the waker keeps its CPU this long after waking
)

var start = time.Now()

func now() int64 { return int64(time.Since(start)) }

func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
	}
}

// goroutines: a channel send readies the receiver (on the sender's P); the sender keeps
// running, so the receiver runs only when another P takes it.
func goroutines() []time.Duration {
	ch := make(chan int64)
	res := make(chan time.Duration, 1)
	go func() {
		for sent := range ch {
			res <- time.Duration(now() - sent)
		}
	}()
	var lat []time.Duration
	for range rounds {
		time.Sleep(idle)
		ch <- now()
		spin(busy)
		lat = append(lat, <-res)
	}
	close(ch)
	return lat
}

// threads: the same with two locked OS threads, the waiter blocked in read(2) on a pipe.
func threads() []time.Duration {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		panic(err)
	}
	res := make(chan time.Duration, 1)
	go func() {
		runtime.LockOSThread()
		b := make([]byte, 8)
		for {
			if n, err := syscall.Read(p[0], b); n != 8 || err != nil {
				return
			}
			res <- time.Duration(now() - int64(binary.LittleEndian.Uint64(b)))
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var lat []time.Duration
	b := make([]byte, 8)
	for range rounds {
		time.Sleep(idle)
		binary.LittleEndian.PutUint64(b, uint64(now()))
		if _, err := syscall.Write(p[1], b); err != nil {
			panic(err)
		}
		spin(busy)
		lat = append(lat, <-res)
	}
	syscall.Close(p[1])
	return lat
}

// yielding: as goroutines, but the waker yields (runtime.Gosched) right after the send, so
// the receiver runs at once on the waker's P; self is how long the waker was off its CPU.
// Fast, but a consumer woken this way finds one item where it would have found a batch:
// used only where the woken goroutines are producers whose work the waker then batches
// (diskio's shared read ring).
func yielding() (lat, self []time.Duration) {
	ch := make(chan int64)
	res := make(chan time.Duration, 1)
	go func() {
		for sent := range ch {
			res <- time.Duration(now() - sent)
		}
	}()
	for range rounds {
		time.Sleep(idle)
		ch <- now()
		t := now()
		runtime.Gosched()
		self = append(self, time.Duration(now()-t))
		spin(busy)
		lat = append(lat, <-res)
	}
	close(ch)
	return lat, self
}

// netpolled: the waiter blocks reading an os.Pipe (parked in the netpoller); the waker writes
// to it and keeps running. The netpoller hands the waiter to an idle P, not to the waker's.
func netpolled() []time.Duration {
	r, w, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	res := make(chan time.Duration, 1)
	go func() {
		b := make([]byte, 8)
		for {
			if n, err := r.Read(b); n != 8 || err != nil {
				return
			}
			res <- time.Duration(now() - int64(binary.LittleEndian.Uint64(b)))
		}
	}()
	var lat []time.Duration
	b := make([]byte, 8)
	for range rounds {
		time.Sleep(idle)
		binary.LittleEndian.PutUint64(b, uint64(now()))
		if _, err := w.Write(b); err != nil {
			panic(err)
		}
		spin(busy)
		lat = append(lat, <-res)
	}
	w.Close()
	return lat
}

func report(name string, lat []time.Duration) {
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))].Round(100 * time.Nanosecond) }
	fmt.Printf("%-34s p50 %8v  p90 %8v  p99 %8v\n", name, q(0.5), q(0.9), q(0.99))
}

func main() {
	fmt.Printf("GOMAXPROCS %d, %d CPUs; the waker stays busy %v after each wake-up\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), busy)
	report("goroutine woken by a busy one", goroutines())
	report("OS thread woken by a busy one", threads())
	report("netpolled goroutine, busy waker", netpolled())
	lat, self := yielding()
	report("goroutine woken, the waker yields", lat)
	report("  the yielding waker's own delay", self)
}
