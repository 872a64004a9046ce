package cluster_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/dlog"
	"github.com/ringkeeper/ringkeeper/engine"
)

// Leak tolerances. A cycle opens and closes dozens of connections, files and goroutines and a
// whole bookie, so a leak of any of them per cycle (or per restart) grows by the number of
// cycles; the slack only absorbs what varies from moment to moment: open files (pebble's
// tables, entry-log readers) by up to about 5, the rest (sockets, pipes, eventfds, io_urings,
// deleted files still open) hardly, goroutines by a couple on their way out.
const (
	leakFDSlack        = 8
	leakOtherFDSlack   = 3 // fds that are not open files of the cluster's data
	leakGoroutineSlack = 4
	// leakHeapPerCycle bounds the live heap's growth per cycle: the embedded etcd keeps its
	// raft log and the history of every key a cycle writes (about 40 KiB a cycle).
	leakHeapPerCycle = 256 << 10
	leakHeapSlack    = 4 << 20
)

// TestNoLeaksOverCycles runs the whole life of ledgers, logs and bookies in cycles (create,
// write (3,3,2) and (1,1,1), read sequentially and at random, from caches and from entry logs,
// close, open with recovery, delete; a bookie stopped and restarted under a writer, which
// changes its ensemble; checkpoints, garbage collection and forced compaction; a dlog log
// written, read, truncated and deleted, on a client of its own; the bookies' metrics
// scraped) and checks that file descriptors, goroutines and the live heap come back to where
// they were after the first cycle: a bookie runs for months.
func TestNoLeaksOverCycles(t *testing.T) {
	cycles := 20
	if testing.Short() {
		cycles = 10 // still more than any slack below
	}
	quiet := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	dataDir := t.TempDir()
	c, err := cluster.Start(ctx, cluster.Config{
		DataDir: dataDir, Bookies: 3, UnsafeNoFsync: true, Logger: quiet,
		HTTPBasePort: -1, // the admin and metrics server restarts with its bookie too
		Bookie: func(i int, cfg *bookie.Config) {
			clustertest.SmallBookie(i, cfg)
			// Logs fill, complete and get compacted every cycle (the smallest log must hold a
			// largest entry).
			cfg.Engine.EntryLogSizeLimit = 1 << 20
			cfg.Server.MaxFrameSize, cfg.Engine.Journal.MaxRecordSize = 64<<10, 64<<10
			cfg.Engine.GC.WaitTime = time.Hour // the test runs GC itself
			cfg.Engine.GC.MetadataOpRate = 0
			cfg.Engine.GC.MajorThreshold = 1 // compact every log with dead data
			cfg.Engine.GC.ForceAllowWhenNoSpace = true
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	ccfg := client.DefaultConfig(c.MetadataURI())
	ccfg.Transport.AddTimeout = 2 * time.Second
	ccfg.Transport.ReadTimeout = 2 * time.Second
	ccfg.Transport.ReconnectMax = 100 * time.Millisecond
	ccfg.SpeculativeReadTimeout = 200 * time.Millisecond
	ccfg.Logger = quiet
	cl, err := client.New(ctx, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	lc := &leakCycle{t: t, c: c, cl: cl, rng: rand.New(rand.NewPCG(1, 2)), http: &http.Client{Transport: &http.Transport{}}}
	defer lc.http.CloseIdleConnections()
	lc.run(0) // warm-up: pools, caches, etcd's and pebble's first files, lazily started goroutines
	base := takeLeakSnapshot(t)
	start := time.Now()
	for i := 1; i <= cycles; i++ {
		lc.run(i)
	}
	t.Logf("%d cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
	// Not vacuous: compaction copied live entries out of logs and removed them (counters of the
	// bookies' current engines, restarted now and then).
	var removed, compacted uint64
	for i := range c.Size() {
		st := c.Bookie(i).Engine().GCStatus()
		removed, compacted = removed+st.RemovedLogs, compacted+st.CompactedLogs
	}
	if compacted == 0 {
		t.Errorf("garbage collection removed %d logs and compacted none", removed)
	}
	checkNoLeaks(t, base, cycles, dataDir)
}

// leakCycle is the state carried from one cycle to the next: the (1,1,1) ledger of the
// previous cycle is deleted one cycle late, so that entry logs hold live and dead data and
// compaction has entries to copy.
type leakCycle struct {
	t    *testing.T
	c    *cluster.Cluster
	cl   *client.Client
	rng  *rand.Rand
	keep int64 // the previous cycle's (1,1,1) ledger; 0: none
	http *http.Client
}

var leakPassword = []byte("leak")

func leakPayload(ledger, entry int64, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint64(b, uint64(ledger))
	binary.BigEndian.PutUint64(b[8:], uint64(entry))
	for i := 16; i < size; i++ {
		b[i] = byte(ledger + entry + int64(i))
	}
	return b
}

func (lc *leakCycle) run(cycle int) {
	t, c, cl := lc.t, lc.c, lc.cl
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("cycle %d: %s: %v", cycle, what, err)
		}
	}
	const size, n = 4 << 10, 120

	// Every bookie was restarted recently: the client may not have seen the last one come back.
	create := func(e, qw, qa int) *client.Ledger {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: e, WriteQuorum: qw, AckQuorum: qa, Password: leakPassword})
			if err == nil {
				return lh
			}
			if !errors.Is(err, client.ErrNotEnoughBookies) || time.Now().After(deadline) {
				fail(fmt.Sprintf("create (%d,%d,%d)", e, qw, qa), err)
			}
		}
	}
	write := func(lh *client.Ledger, first, last int64) {
		t.Helper()
		errs := make(chan error, last-first+1)
		for e := first; e <= last; e++ {
			if e%3 == 0 { // a synchronous append now and then, pipelined ones otherwise
				_, err := lh.Append(ctx, leakPayload(lh.ID(), e, size))
				errs <- err
				continue
			}
			lh.AppendAsync(leakPayload(lh.ID(), e, size), func(_ int64, err error) { errs <- err })
		}
		for e := first; e <= last; e++ {
			fail(fmt.Sprintf("write ledger %d", lh.ID()), <-errs)
		}
	}
	check := func(lh *client.Ledger, e client.Entry) {
		t.Helper()
		if !bytes.Equal(e.Payload, leakPayload(lh.ID(), e.EntryID, size)) {
			t.Fatalf("cycle %d: ledger %d entry %d: wrong payload", cycle, lh.ID(), e.EntryID)
		}
	}
	readAll := func(lh *client.Ledger, last int64) {
		t.Helper()
		got := int64(0)
		for deadline := time.Now().Add(5 * time.Second); got <= last; {
			from := got
			for e, err := range lh.Entries(ctx, from, last) {
				// The only replica of a (1,1,1) entry may be a bookie that just restarted,
				// whose connection is still in its reconnect backoff.
				if errors.Is(err, client.ErrBookieUnavailable) && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
					break
				}
				fail(fmt.Sprintf("read ledger %d", lh.ID()), err)
				check(lh, e)
				got++
			}
			if got == from && time.Now().After(deadline) {
				t.Fatalf("cycle %d: ledger %d: no entry from %d on, want up to %d", cycle, lh.ID(), from, last)
			}
		}
	}
	readRandom := func(lh *client.Ledger, last int64, k int) {
		t.Helper()
		for range k {
			id := lc.rng.Int64N(last + 1)
			es, err := lh.Read(ctx, id, id)
			fail(fmt.Sprintf("read ledger %d entry %d", lh.ID(), id), err)
			check(lh, es[0])
		}
	}

	// All bookies up: a (3,3,2) ledger written, closed and read; a (3,3,2) ledger left open
	// for recovery; a (1,1,1) ledger that will lose its bookie.
	full := create(3, 3, 2)
	write(full, 0, n-1)
	fail("close", full.Close(ctx))
	readAll(full, n-1)
	open := create(3, 3, 2)
	write(open, 0, n/4)
	single := create(1, 1, 1)
	write(single, 0, n/2-1)

	// Stop the (1,1,1) ledger's bookie and write on: the client loses its connection and the
	// ledger changes ensemble. Reads of the (3,3,2) ledgers fail over from the stopped bookie,
	// and recovery fences and closes the open one with two bookies of three.
	down := slices.Index(c.BookieAddrs(), single.Metadata().Ensembles[0].Bookies[0])
	if down < 0 {
		t.Fatalf("cycle %d: bookie %s of ledger %d is not in the cluster", cycle, single.Metadata().Ensembles[0].Bookies[0], single.ID())
	}
	fail("stop bookie", c.StopBookie(ctx, down))
	write(single, n/2, n-1)
	if ens := single.Metadata().Ensembles; len(ens) < 2 {
		t.Fatalf("cycle %d: ledger %d kept its ensemble %v with its bookie stopped", cycle, single.ID(), ens)
	}
	readRandom(full, n-1, 20)
	recovered, err := cl.OpenLedger(ctx, open.ID(), leakPassword, true)
	fail("open with recovery", err)
	readAll(recovered, recovered.LastAddConfirmed())
	if err := open.Close(ctx); err != nil && !errors.Is(err, client.ErrLedgerFenced) && !errors.Is(err, client.ErrLedgerClosed) {
		fail("close the fenced writer", err)
	}
	fail("close the recovered handle", recovered.Close(ctx))

	// Bring it back (a new engine: empty caches, its connections accepted anew); its entries
	// of the (1,1,1) ledger are read from its entry logs.
	fail("restart bookie", c.StartBookie(ctx, down))
	fail("close", single.Close(ctx))
	reopened, err := cl.OpenLedger(ctx, single.ID(), leakPassword, true)
	fail("open with recovery", err)
	readAll(reopened, n-1)
	fail("close", reopened.Close(ctx))

	// Checkpoint every bookie, so that reads miss the write cache; random reads also miss the
	// read-ahead cache.
	for i := range c.Size() {
		fail("checkpoint", c.Bookie(i).Engine().Checkpoint())
	}
	readRandom(full, n-1, 20)
	readAll(full, n-1)

	lc.dlog(ctx, cycle)

	// Scrape every bookie's metrics, as Prometheus does, over a connection kept alive across
	// cycles (the restarted bookie's server closes its own).
	for i := range c.Size() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Bookie(i).HTTPAddr()+"/metrics", nil)
		fail("metrics request", err)
		resp, err := lc.http.Do(req)
		fail("scrape metrics", err)
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fail("read metrics", err)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("cycle %d: bookie %d: GET /metrics: %s", cycle, i, resp.Status)
		}
	}

	// Delete everything but the (1,1,1) ledger (deleted next cycle), then collect garbage and
	// force a major compaction on every bookie: completed logs are removed or compacted.
	for _, id := range []int64{full.ID(), open.ID(), lc.keep} {
		if id != 0 {
			fail("delete", cl.DeleteLedger(ctx, id))
		}
	}
	lc.keep = single.ID()
	for i := range c.Size() {
		e := c.Bookie(i).Engine()
		fail("checkpoint", e.Checkpoint())
		fail("gc", e.RunGC(ctx, &engine.GCRequest{ForceMajor: true}))
	}
}

// dlog opens a namespace with a client of its own (closed again), writes a log across
// several segments, reads it, truncates it (deleting segments and their ledgers), closes the
// writer and reader and deletes the log.
func (lc *leakCycle) dlog(ctx context.Context, cycle int) {
	t := lc.t
	t.Helper()
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("cycle %d: dlog: %s: %v", cycle, what, err)
		}
	}
	ns, err := dlog.OpenNamespace(ctx, lc.c.MetadataURI(), dlog.Config{
		LockTTL: 2 * time.Second, TailPollInterval: 5 * time.Millisecond, MaxLogSegmentBytes: 16 << 10,
		Logger: slog.New(slog.DiscardHandler),
	})
	fail("open namespace", err)
	defer ns.Close()
	name := "leak-" + strconv.Itoa(cycle)
	l, err := ns.CreateLog(ctx, name)
	fail("create log", err)
	w, err := l.OpenWriter(ctx)
	fail("open writer", err)
	const records = 60
	var mid dlog.DLSN
	for tx := int64(1); tx <= records; tx++ {
		d, err := w.Write(ctx, dlog.Record{TxID: tx, Payload: bytes.Repeat([]byte{byte(tx)}, 1000)})
		fail("write", err)
		if tx == records*3/4 {
			mid = d
		}
	}
	r, err := l.OpenReader(ctx, dlog.Head())
	fail("open reader", err)
	for tx := int64(1); tx <= records; tx++ {
		rec, err := r.Next(ctx)
		fail("read", err)
		if rec.TxID != tx || len(rec.Payload) != 1000 || rec.Payload[0] != byte(tx) {
			t.Fatalf("cycle %d: dlog: read txid %d (%d bytes), want %d", cycle, rec.TxID, len(rec.Payload), tx)
		}
	}
	fail("truncate", w.Truncate(ctx, mid))
	segs, err := l.Segments(ctx)
	fail("segments", err)
	if len(segs) == 0 || segs[0].SeqNo == 1 {
		t.Fatalf("cycle %d: dlog: truncation deleted no segment (%d left)", cycle, len(segs))
	}
	fail("close reader", r.Close())
	fail("close writer", w.Close(ctx))
	fail("delete log", ns.DeleteLog(ctx, name))
}

// leakSnapshot is what the process holds at one moment.
type leakSnapshot struct {
	fds        map[string]string // fd number -> os.Readlink target
	goroutines map[string][]string
	heap       uint64 // live heap after a GC
}

func takeLeakSnapshot(t *testing.T) leakSnapshot {
	t.Helper()
	s := leakSnapshot{fds: map[string]string{}, goroutines: goroutinesByTop()}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory's own fd, closed already
		}
		s.fds[e.Name()] = target
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.heap = ms.HeapAlloc
	return s
}

func (s leakSnapshot) numGoroutines() int {
	n := 0
	for _, g := range s.goroutines {
		n += len(g)
	}
	return n
}

// otherFDs counts the fds that are not open files of the cluster's data under dataDir (a
// data file that was deleted while open counts here).
func (s leakSnapshot) otherFDs(dataDir string) int {
	n := 0
	for _, target := range s.fds {
		if !strings.HasPrefix(target, dataDir+"/") || strings.HasSuffix(target, " (deleted)") {
			n++
		}
	}
	return n
}

// checkNoLeaks waits for closed things to finish closing (connections in their last read,
// goroutines on their way out), then compares with base.
func checkNoLeaks(t *testing.T, base leakSnapshot, cycles int, dataDir string) {
	t.Helper()
	heapLimit := base.heap + leakHeapSlack + uint64(cycles)*leakHeapPerCycle
	var now leakSnapshot
	fdsGrew := func() bool {
		return len(now.fds) > len(base.fds)+leakFDSlack || now.otherFDs(dataDir) > base.otherFDs(dataDir)+leakOtherFDSlack
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		now = takeLeakSnapshot(t)
		if !fdsGrew() && now.numGoroutines() <= base.numGoroutines()+leakGoroutineSlack && now.heap <= heapLimit ||
			time.Now().After(deadline) {
			break
		}
	}
	t.Logf("fds %d -> %d (not data files: %d -> %d), goroutines %d -> %d, live heap %.1f -> %.1f MiB",
		len(base.fds), len(now.fds), base.otherFDs(dataDir), now.otherFDs(dataDir),
		base.numGoroutines(), now.numGoroutines(), float64(base.heap)/(1<<20), float64(now.heap)/(1<<20))
	if fdsGrew() {
		// fd numbers are reused; what grew is the number of fds of a kind.
		byKind := func(fds map[string]string) map[string][]string {
			m := map[string][]string{}
			for fd, target := range fds {
				k := fdKind(target)
				m[k] = append(m[k], fd+" -> "+target)
			}
			return m
		}
		was, is := byKind(base.fds), byKind(now.fds)
		var grew []string
		for k, fds := range is {
			if len(fds) > len(was[k]) {
				slices.Sort(fds)
				grew = append(grew, fmt.Sprintf("+%d (%d -> %d) %s:\n\t%s", len(fds)-len(was[k]), len(was[k]), len(fds), k,
					strings.Join(fds, "\n\t")))
			}
		}
		slices.Sort(grew)
		t.Errorf("open fds grew from %d to %d (not data files: %d to %d) over %d cycles; by kind:\n%s",
			len(base.fds), len(now.fds), base.otherFDs(dataDir), now.otherFDs(dataDir), cycles, strings.Join(grew, "\n"))
	}
	if now.numGoroutines() > base.numGoroutines()+leakGoroutineSlack {
		var b strings.Builder
		tops := make([]string, 0, len(now.goroutines))
		for top := range now.goroutines {
			tops = append(tops, top)
		}
		slices.Sort(tops)
		for _, top := range tops {
			if d := len(now.goroutines[top]) - len(base.goroutines[top]); d > 0 {
				fmt.Fprintf(&b, "+%d (%d -> %d) %s; one of them:\n%s\n\n", d, len(base.goroutines[top]), len(now.goroutines[top]),
					top, now.goroutines[top][0])
			}
		}
		t.Errorf("goroutines grew from %d to %d over %d cycles; by top function:\n%s",
			base.numGoroutines(), now.numGoroutines(), cycles, b.String())
	}
	if now.heap > heapLimit {
		t.Errorf("live heap grew from %.1f to %.1f MiB over %d cycles (limit %.1f MiB)",
			float64(base.heap)/(1<<20), float64(now.heap)/(1<<20), cycles, float64(heapLimit)/(1<<20))
	}
}

var (
	hexFile = regexp.MustCompile(`^[0-9a-f]+\.(log|txn)$`)
	number  = regexp.MustCompile(`[0-9]+`)
)

// fdKind is an fd's target without its numbers: socket:[N], current/N.log, index/N.sst.
func fdKind(target string) string {
	if !strings.HasPrefix(target, "/") {
		return number.ReplaceAllString(target, "N")
	}
	base := hexFile.ReplaceAllString(filepath.Base(target), "N.$1")
	return number.ReplaceAllString(filepath.Base(filepath.Dir(target))+"/"+base, "N")
}

var goroutineHeader = regexp.MustCompile(`^goroutine \d+ \[[^\]]*\]:\n`)

// goroutinesByTop groups every goroutine's stack by its top function outside the standard
// library (where it waits: the first frame of a module such as github.com/...) and the
// function that started it.
func goroutinesByTop() map[string][]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string][]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(goroutineHeader.ReplaceAllString(g, ""), "\n")
		top, created := "", ""
		for _, line := range lines {
			if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "...") {
				continue // a file:line, or elided frames
			}
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "created" {
				created = " (created by " + f[2] + ")"
				break
			}
			fn := line
			if j := strings.LastIndexByte(fn, '('); j > 0 {
				fn = fn[:j] // the arguments
			}
			pkg := fn[:strings.LastIndexByte(fn, '/')+1] + strings.SplitN(fn[strings.LastIndexByte(fn, '/')+1:], ".", 2)[0]
			if top == "" && strings.Contains(strings.SplitN(pkg, "/", 2)[0], ".") {
				top = fn
			}
		}
		if top == "" && len(lines) > 0 {
			top = lines[0]
		}
		out[top+created] = append(out[top+created], g)
	}
	return out
}
