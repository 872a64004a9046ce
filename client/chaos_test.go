package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/metadata/embedded"
)

const chaosBookieEnv = "RINGKEEPER_CHAOS_BOOKIE"

// TestChaosBookieKills runs 5 bookie processes and a writer with (3,3,2). Bookies are
// SIGKILLed and restarted at random (one down at a time, so an ensemble change always finds a replacement) while the writer appends,
// starting a new ledger whenever one fails. Afterwards every ledger is recovered and closed,
// and every acknowledged entry is read back.
func TestChaosBookieKills(t *testing.T) {
	if os.Getenv(chaosBookieEnv) != "" {
		runChaosBookie()
		return
	}
	duration := 60 * time.Second
	if testing.Short() {
		duration = 10 * time.Second
	}
	ctx := context.Background()
	base := t.TempDir()
	etcd, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(base, "etcd"), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	const n = 5
	type proc struct {
		port int
		cmd  *exec.Cmd
	}
	procs := make([]*proc, n)
	start := func(i int) {
		p := procs[i]
		cmd := exec.Command(os.Args[0], "-test.run=^TestChaosBookieKills$")
		cmd.Env = append(os.Environ(), chaosBookieEnv+"=1", "RK_URI="+etcd.URI(),
			"RK_DIR="+filepath.Join(base, "bookie"+strconv.Itoa(i)), "RK_PORT="+strconv.Itoa(p.port))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p.cmd = cmd
	}
	for i := range n {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		procs[i] = &proc{port: ln.Addr().(*net.TCPAddr).Port}
		ln.Close()
		start(i)
	}
	defer func() {
		for _, p := range procs {
			if p.cmd != nil {
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
		}
	}()
	cfg := DefaultConfig(etcd.URI())
	cfg.Transport.AddTimeout = 2 * time.Second
	cfg.Transport.ReadTimeout = 2 * time.Second
	cfg.Transport.ReconnectMax = 200 * time.Millisecond
	cfg.SpeculativeReadTimeout = 300 * time.Millisecond
	cl, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Wait until all bookies registered.
	deadline := time.Now().Add(30 * time.Second)
	for len(cl.writableBookies()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d bookies registered", len(cl.writableBookies()))
		}
		time.Sleep(50 * time.Millisecond)
	}

	stop := make(chan struct{})
	var chaos sync.WaitGroup
	chaos.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		down := map[int]time.Time{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(300+rng.IntN(700)) * time.Millisecond):
			}
			for i, until := range down {
				if time.Now().After(until) {
					start(i)
					delete(down, i)
				}
			}
			if len(down) < 1 {
				i := rng.IntN(n)
				if _, ok := down[i]; !ok {
					procs[i].cmd.Process.Kill()
					procs[i].cmd.Wait()
					down[i] = time.Now().Add(time.Duration(500+rng.IntN(2000)) * time.Millisecond)
				}
			}
		}
	})

	acked := map[int64]int64{} // ledger → highest acknowledged entry (all below are acknowledged too)
	var ledgers []int64
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
		if err != nil {
			time.Sleep(100 * time.Millisecond) // not enough bookies right now
			continue
		}
		ledgers = append(ledgers, lh.ID())
		acked[lh.ID()] = -1
		for time.Now().Before(end) {
			next := acked[lh.ID()] + 1
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			id, err := lh.Append(actx, payload(lh.ID(), next))
			cancel()
			if err != nil {
				break
			}
			if id != next {
				t.Fatalf("ledger %d: append returned %d, want %d", lh.ID(), id, next)
			}
			acked[lh.ID()] = id
		}
	}
	close(stop)
	chaos.Wait()
	// Bring every bookie back for verification.
	for i, p := range procs {
		if p.cmd.ProcessState != nil {
			start(i)
		}
	}
	time.Sleep(3 * time.Second)
	total := int64(0)
	for _, id := range ledgers {
		var rh *Ledger
		var err error
		for attempt := 0; attempt < 20; attempt++ {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			rh, err = cl.OpenLedger(rctx, id, password, true)
			cancel()
			if err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("ledger %d: recovery: %v", id, err)
		}
		md := rh.Metadata()
		if md.LastEntryID < acked[id] {
			t.Fatalf("ledger %d closed at %d but entry %d was acknowledged: data loss", id, md.LastEntryID, acked[id])
		}
		if acked[id] >= 0 {
			entries, err := rh.Read(ctx, 0, acked[id])
			if err != nil {
				t.Fatalf("ledger %d: read 0..%d: %v", id, acked[id], err)
			}
			for i, e := range entries {
				if string(e.Payload) != string(payload(id, int64(i))) {
					t.Fatalf("ledger %d entry %d: wrong payload", id, i)
				}
			}
		}
		total += acked[id] + 1
	}
	if total == 0 {
		t.Fatal("nothing was acknowledged during the chaos run")
	}
	t.Logf("%d ledgers, %d acknowledged entries verified after %v of bookie kills", len(ledgers), total, duration)
}

func runChaosBookie() {
	port, _ := strconv.Atoi(os.Getenv("RK_PORT"))
	dir := os.Getenv("RK_DIR")
	cfg := bookie.DefaultConfig()
	cfg.ListenAddress, cfg.BookiePort = "127.0.0.1", port
	cfg.MetadataServiceURI = os.Getenv("RK_URI")
	cfg.PrometheusStatsHTTPPort = 0
	cfg.RegistrationTTL = time.Second
	cfg.Engine.JournalDirs = []string{filepath.Join(dir, "journal")}
	cfg.Engine.LedgerDirs = []string{filepath.Join(dir, "ledgers")}
	cfg.Engine.WriteCacheMaxSize = 16 << 20
	cfg.Engine.ReadAheadCacheMaxSize = 4 << 20
	cfg.Engine.IndexBlockCacheSize = 4 << 20
	cfg.Engine.Journal.MaxFileSize = 32 << 20
	cfg.Engine.EntryLogSizeLimit = 64 << 20
	cfg.Server.NumEventLoops = 1
	var b *bookie.Bookie
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		// A restarted bookie waits for its previous registration's lease to run out.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, err = bookie.Start(ctx, cfg)
		cancel()
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos bookie:", err)
		os.Exit(2)
	}
	_ = b
	select {}
}
