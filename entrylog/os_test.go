package entrylog

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

func osConfig(dir string, engine diskio.Engine) Config {
	cfg := memConfig(diskio.NewOS())
	cfg.Dir, cfg.Engine = dir, engine
	cfg.LogSizeLimit = 1 << 20
	return cfg
}

// TestUnfinalizedLogOnOS: a log abandoned without Close (as by a crash) is fallocated and holds
// zeros after its flushed data; another instance scans it to exactly the flushed entries and
// rebuilds its map.
func TestUnfinalizedLogOnOS(t *testing.T) {
	for _, engine := range engines(t) {
		t.Run(engine.String(), func(t *testing.T) {
			cfg := osConfig(t.TempDir(), engine)
			old := mustOpen(t, cfg)
			defer old.Close()
			var flushed []added
			for g := range 4 {
				flushed = append(flushed, addRange(t, old, []int64{1, 2}, int64(g*30), int64(g*30+30))...)
				if err := old.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			addRange(t, old, []int64{1}, 1000, 1003) // written, never flushed
			id := old.CurrentLogID()
			if size := fileSize(t, old.Path(id)); size != cfg.LogSizeLimit {
				t.Fatalf("log is %d bytes, want it fallocated to %d", size, cfg.LogSizeLimit)
			}
			e := mustOpen(t, cfg)
			defer e.Close()
			checkRead(t, e, flushed)
			var n int
			err := e.Scan(id, func(ledger, entry int64, b []byte, loc Location) error {
				if n >= len(flushed) || flushed[n].loc != loc || flushed[n].key != (key{ledger, entry}) {
					return fmt.Errorf("scan entry %d: %d/%d at %v", n, ledger, entry, loc)
				}
				n++
				return nil
			})
			if err != nil || n != len(flushed) {
				t.Fatalf("scan: %d entries (%v), want %d", n, err, len(flushed))
			}
			if m, err := e.LedgersMap(id); err != nil || !equalMaps(m, expectedMaps(flushed)[id]) {
				t.Fatalf("rebuilt map %v (%v)", m, err)
			}
		})
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

const killChildEnv = "RINGKEEPER_ENTRYLOG_KILL_CHILD"

// TestKill9 runs a child process that adds and flushes and prints each flushed entry's location;
// the parent SIGKILLs it at a random moment, then checks that every printed entry reads back
// byte for byte and that every log but the new current one scans cleanly. The directory carries
// over, so later rounds also recover logs that earlier kills left unfinalized.
func TestKill9(t *testing.T) {
	if dir := os.Getenv(killChildEnv); dir != "" {
		killChild(dir)
		return
	}
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	es := engines(t)
	dir := t.TempDir()
	var durable []added
	for round := range rounds {
		engine := es[round%len(es)]
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9$")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir, "RINGKEEPER_ENGINE="+engine.String())
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan []added, 1)
		go func() {
			var as []added
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var a added
				var loc uint64
				if _, err := fmt.Sscanf(sc.Text(), "%d %d %d", &a.ledger, &a.entry, &loc); err == nil {
					a.loc = Location(loc)
					as = append(as, a)
				}
			}
			lines <- as
		}()
		time.Sleep(time.Duration(40+rand.IntN(80)) * time.Millisecond)
		cmd.Process.Kill()
		got := <-lines
		if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != -1 {
			t.Fatalf("round %d: child did not die by the kill: %v", round, err)
		}
		// Reads cost a device round trip each: read this round's entries and a sample of the
		// earlier ones; the scans check every durable entry byte for byte.
		sample := got
		for i := 0; i < len(durable); i += 97 {
			sample = append(sample, durable[i])
		}
		durable = append(durable, got...)
		e := mustOpen(t, osConfig(dir, engine))
		checkRead(t, e, sample)
		verifyScans(t, e, durable, fmt.Sprintf("round %d (%v)", round, engine))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(durable) < rounds*10 {
		t.Fatalf("children flushed only %d entries in %d rounds: the test proves little", len(durable), rounds)
	}
	t.Logf("%d flushed entries verified over %d kills", len(durable), rounds)
}

// killChild adds and flushes until killed, printing "ledger entry location" for each entry once
// the Flush that covers it has returned, one write per Flush.
func killChild(dir string) {
	engine, _ := diskio.ParseEngine(os.Getenv("RINGKEEPER_ENGINE"))
	e, err := Open(osConfig(dir, engine))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	ledger := time.Now().UnixNano() % (1 << 40)
	var line []byte
	var batch []added
	for entry := int64(0); ; entry++ {
		l := ledger + entry%3
		loc, err := e.Add(l, entry, testEntry(l, entry))
		if err != nil {
			fmt.Fprintln(os.Stderr, "child add:", err)
			os.Exit(3)
		}
		batch = append(batch, added{key{l, entry}, loc})
		if len(batch) == 25 {
			if err := e.Flush(); err != nil {
				fmt.Fprintln(os.Stderr, "child flush:", err)
				os.Exit(4)
			}
			line = line[:0]
			for _, a := range batch {
				line = strconv.AppendInt(line, a.ledger, 10)
				line = append(line, ' ')
				line = strconv.AppendInt(line, a.entry, 10)
				line = append(line, ' ')
				line = strconv.AppendUint(line, uint64(a.loc), 10)
				line = append(line, '\n')
			}
			os.Stdout.Write(line)
			batch = batch[:0]
		}
	}
}
