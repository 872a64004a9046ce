package engine

import (
	"bufio"
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

const killChildEnv = "RINGKEEPER_ENGINE_KILL_CHILD"

// killChildEntriesPerWriter bounds each child writer, so that verification stays fast; the
// kill still lands while adds and checkpoints run.
const killChildEntriesPerWriter = 5000

func killConfig(dir string, engine diskio.Engine) Config {
	cfg := DefaultConfig([]string{filepath.Join(dir, "journal")}, []string{filepath.Join(dir, "ledgers0"), filepath.Join(dir, "ledgers1")})
	cfg.WriteCacheMaxSize = 4 << 20 // halves fill often: checkpoints run all the time
	cfg.ReadAheadCacheMaxSize = 1 << 20
	cfg.EntryLogSizeLimit = 2 << 20
	cfg.Journal.Engine = engine
	cfg.Journal.MaxRecordSize = 64 << 10
	cfg.Journal.BufferedWritesThreshold = 64 << 10
	cfg.Journal.MaxFileSize = 1 << 20
	cfg.FlushInterval = 20 * time.Millisecond
	cfg.IndexBlockCacheSize = 8 << 20
	cfg.BookieID = "127.0.0.1:3181"
	cfg.InstanceID = "kill-test"
	return cfg
}

// TestKill9DuringAddsAndCheckpoints SIGKILLs a child process that adds from many goroutines
// while checkpoints run, restarts the engine on the same directories and reads back every
// acknowledged entry. Rounds reuse the directories, so later rounds replay across earlier
// crashes.
func TestKill9DuringAddsAndCheckpoints(t *testing.T) {
	if dir := os.Getenv(killChildEnv); dir != "" {
		killChild(dir)
		return
	}
	rounds := 10
	if testing.Short() {
		rounds = 4
	}
	engines := []diskio.Engine{diskio.EnginePsync}
	if diskio.IOUringAvailable() == nil {
		engines = append(engines, diskio.EngineIOUring)
	}
	dir := t.TempDir()
	acked := map[[2]int64]bool{}
	for round := range rounds {
		engine := engines[round%len(engines)]
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9DuringAddsAndCheckpoints$")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir, "RINGKEEPER_ENGINE="+engine.String(), "RINGKEEPER_ROUND="+strconv.Itoa(round))
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got := make(chan [][2]int64, 1)
		first := make(chan struct{}) // closed at the first acknowledgement
		go func() {
			var ks [][2]int64
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var l, e int64
				if _, err := fmt.Sscanf(sc.Text(), "%d %d", &l, &e); err == nil {
					if len(ks) == 0 {
						close(first)
					}
					ks = append(ks, [2]int64{l, e})
				}
			}
			got <- ks
		}()
		// The kill lands while adds run, however long the child took to start (-race).
		select {
		case <-first:
		case <-time.After(30 * time.Second):
		}
		time.Sleep(time.Duration(20+rand.IntN(180)) * time.Millisecond)
		cmd.Process.Kill()
		ks := <-got
		if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != -1 {
			t.Fatalf("round %d: child did not die by the kill: %v", round, err)
		}
		if len(ks) == 0 {
			t.Fatalf("round %d: the child acknowledged nothing before the kill", round)
		}
		for _, k := range ks {
			acked[k] = true
		}
		e, err := Open(killConfig(dir, engine))
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		// In (ledger, entry) order, so that read-ahead serves most reads from the read cache.
		keys := slices.SortedFunc(maps.Keys(acked), func(a, b [2]int64) int {
			return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
		})
		for _, k := range keys {
			mustRead(t, e, k[0], k[1])
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d (%v): %d acknowledged this round, %d verified", round, engine, len(ks), len(acked))
	}
}

func killChild(dir string) {
	engine, _ := diskio.ParseEngine(os.Getenv("RINGKEEPER_ENGINE"))
	round, _ := strconv.Atoi(os.Getenv("RINGKEEPER_ROUND"))
	e, err := Open(killConfig(dir, engine))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	var outMu sync.Mutex
	for w := range 8 {
		go func() {
			ledger := int64(round*1000 + w)
			sem := make(chan struct{}, 64)
			for en := int64(0); en < killChildEntriesPerWriter; en++ {
				sem <- struct{}{}
				err := e.Add(testKey, storedEntry(ledger, en), false, func(ctx any, err error) {
					<-sem
					if err == nil {
						line := strconv.AppendInt(nil, ledger, 10)
						line = append(line, ' ')
						line = strconv.AppendInt(line, ctx.(int64), 10)
						line = append(line, '\n')
						outMu.Lock()
						os.Stdout.Write(line)
						outMu.Unlock()
					}
				}, en)
				if err != nil {
					<-sem
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	select {}
}
