package journal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

const failpointChildEnv = "RINGKEEPER_JOURNAL_FAILPOINT_CHILD"

// Kill sites. The one between a group's write and its sync has no place in the journal: an
// RWF_DSYNC write or io_uring's linked write+fdatasync leave no user-space moment between the
// two. The child reaches it by serving the journal with psync over a file that lacks
// WriteAtDataSync, so every group is a pwrite then an fdatasync, and dies in the fdatasync.
const (
	killBeforeSubmit = "before-submit"
	killBeforeSync   = "write-done-before-sync"
	killBeforeAcks   = "sync-done-before-callbacks"
)

// TestKill9AtFailpoints runs a child that appends from many goroutines, reports every
// acknowledgement through a pipe, and SIGKILLs itself at a failpoint after a random number of
// groups (reliability §5.1): before a group's write is submitted, after the write but before
// its sync, after the sync but before its callbacks. The parent replays: every acknowledged
// record must be there, every record intact, and each ledger's entries exactly 0, 1, 2, ...
// once each in order (a ledger is appended in order, and replay returns a prefix of the
// journal). A directory carries over five rounds, so replay also crosses earlier kills'
// tails. RINGKEEPER_CRASH_SEED reruns a seed.
func TestKill9AtFailpoints(t *testing.T) {
	if dir := os.Getenv(failpointChildEnv); dir != "" {
		failpointChild(dir)
		return
	}
	rounds := 200
	if testing.Short() {
		rounds = 12
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RINGKEEPER_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (RINGKEEPER_CRASH_SEED reruns it)", seed)
	es := engines(t)
	sites := []string{killBeforeSubmit, killBeforeSync, killBeforeAcks}
	var dir string
	var acked []key // this directory's, over its rounds
	total := 0
	for round := range rounds {
		if round%5 == 0 {
			dir, acked = t.TempDir(), nil
		}
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		site := sites[round%len(sites)]
		engine := es[rng.IntN(len(es))]
		syncData := rng.IntN(4) != 0
		if site == killBeforeSync {
			engine, syncData = diskio.EnginePsync, true // see the sites' comment
		}
		groups := 1 + rng.IntN(40)
		depth := 1 + rng.IntN(4)
		desc := fmt.Sprintf("seed %d round %d: kill at %s after %d groups, %v, depth %d, syncData %v",
			seed, round, site, groups, engine, depth, syncData)
		ks := runFailpointChild(t, desc, dir, site, groups, engine, depth, syncData)
		acked = append(acked, ks...)
		total += len(ks)
		checkKilledJournal(t, desc, dir, acked)
	}
	if total < rounds {
		t.Fatalf("children acknowledged only %d records in %d rounds: the test proves little", total, rounds)
	}
	t.Logf("%d records acknowledged and verified over %d kills", total, rounds)
}

// runFailpointChild runs one child until it kills itself and returns the records it
// acknowledged.
func runFailpointChild(t *testing.T, desc, dir, site string, groups int, engine diskio.Engine, depth int, syncData bool) []key {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9AtFailpoints$")
	cmd.Env = append(os.Environ(), failpointChildEnv+"="+dir,
		fmt.Sprintf("RINGKEEPER_FAILPOINT=%s,%d,%d,%d,%v", site, groups, engine, depth, syncData))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := collectAcked(out)
	timer := time.AfterFunc(20*time.Second, func() { cmd.Process.Kill() })
	ks := <-lines
	cmd.Wait()
	if !timer.Stop() {
		t.Fatalf("%s: the child did not reach its failpoint in 20 s; stderr:\n%s", desc, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s: the child did not die by its kill (%v); stderr:\n%s", desc, cmd.ProcessState, stderr.String())
	}
	return ks
}

// checkKilledJournal replays dir (truncating the torn tail, as a bookie does) and checks it
// against the acknowledged records.
func checkKilledJournal(t *testing.T, desc, dir string, acked []key) {
	t.Helper()
	next := make(map[int64]int64) // ledger → the entry id replay must return next
	_, err := Replay(t0(), ReplayOptions{Dir: dir, Truncate: true}, func(r *Record) error {
		if r.Type != RecordData {
			return nil
		}
		k := key{r.LedgerID, r.EntryID}
		if want := testPayload(k.ledger, k.entry, payloadSize(k.ledger, k.entry)); !bytes.Equal(r.Payload, want) {
			return fmt.Errorf("record %v: payload differs", k)
		}
		if k.entry != next[k.ledger] {
			return fmt.Errorf("ledger %d: replayed entry %d, expected %d (a duplicate, a gap or out of order)", k.ledger, k.entry, next[k.ledger])
		}
		next[k.ledger]++
		return nil
	})
	if err != nil {
		t.Fatalf("%s: replay: %v", desc, err)
	}
	for _, k := range acked {
		if k.entry >= next[k.ledger] {
			t.Fatalf("%s: acknowledged record %v lost (replay has %d entries of ledger %d)", desc, k, next[k.ledger], k.ledger)
		}
	}
}

// failpointChild replays dir, opens a journal on it with the parent's parameters and appends
// from 16 goroutines, writing "ledger entry" to stdout for each acknowledgement (one write
// system call, so the line is in the pipe before anything later can happen), until the
// failpoint kills it.
func failpointChild(dir string) {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		os.Exit(3)
	}
	var site string
	var groups, engine, depth int
	var syncData bool
	params := bytes.ReplaceAll([]byte(os.Getenv("RINGKEEPER_FAILPOINT")), []byte(","), []byte(" "))
	if _, err := fmt.Sscan(string(params), &site, &groups, &engine, &depth, &syncData); err != nil {
		fail("child parameters %q: %v", params, err)
	}
	if _, err := Replay(t0(), ReplayOptions{Dir: dir, Truncate: true}, func(*Record) error { return nil }); err != nil {
		fail("child replay: %v", err)
	}
	die := func() {
		// The goroutine at the failpoint stops there; the others run on a moment (callbacks
		// already queued are delivered, groups in flight complete), then the process dies.
		time.Sleep(time.Millisecond)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never go on past the failpoint
	}
	var submitted, hits atomic.Int64
	failpoint = func(s failpointSite) {
		if s == fpBeforeSubmit {
			submitted.Add(1)
		}
		if (s == fpBeforeSubmit && site == killBeforeSubmit || s == fpAfterSync && site == killBeforeAcks) &&
			hits.Add(1) == int64(groups) {
			die()
		}
	}
	cfg := DefaultConfig(dir)
	cfg.Engine = diskio.Engine(engine)
	cfg.PipelineDepth = depth
	cfg.SyncData = syncData
	cfg.PageCacheFlushInterval = time.Millisecond
	cfg.MaxGroupWait = 200 * time.Microsecond
	cfg.MaxRecordSize = 4 << 10
	cfg.BufferedWritesThreshold = 16 << 10
	cfg.MaxFileSize = 256 << 10 // rollovers every few groups
	if site == killBeforeSync {
		// After the first group was submitted, every SyncData is a group's (the session's
		// first file is synced with SyncData while Open waits; later headers with Sync).
		cfg.FS = syncHookFS{FS: diskio.NewOS(), beforeSync: func() {
			if submitted.Load() > 0 && hits.Add(1) == int64(groups) {
				die()
			}
		}}
	}
	j, err := Open(cfg)
	if err != nil {
		fail("child open: %v", err)
	}
	appendAndReportUntilKilled(j)
}

// syncHookFS serves files without WriteAtDataSync, so that psync writes each group and then
// calls SyncData, and calls beforeSync before each SyncData.
type syncHookFS struct {
	diskio.FS
	beforeSync func()
}

type syncHookFile struct {
	diskio.File
	beforeSync func()
}

func (fs syncHookFS) Create(name string, opts diskio.Options) (diskio.File, error) {
	f, err := fs.FS.Create(name, opts)
	if err != nil {
		return nil, err
	}
	return syncHookFile{f, fs.beforeSync}, nil
}

func (fs syncHookFS) Open(name string, opts diskio.Options) (diskio.File, error) {
	f, err := fs.FS.Open(name, opts)
	if err != nil {
		return nil, err
	}
	return syncHookFile{f, fs.beforeSync}, nil
}

func (f syncHookFile) SyncData() error {
	f.beforeSync()
	return f.File.SyncData()
}
