package bookie

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

const killChildEnv = "RINGKEEPER_BOOKIE_KILL_CHILD"

// TestKill9DuringAddFlood floods a bookie process with pipelined adds over several
// connections, SIGKILLs it, restarts it on the same directories and reads back every add that
// was acknowledged.
func TestKill9DuringAddFlood(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		runKillChild()
		return
	}
	uri := startMetadataForKill(t)
	dir := t.TempDir()
	port := freePort(t)
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	acked := map[[2]int64]bool{}
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9DuringAddFlood$")
		cmd.Env = append(os.Environ(), killChildEnv+"=1", "RK_URI="+uri, "RK_DIR="+dir, "RK_PORT="+strconv.Itoa(port))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		waitListening(t, addr)
		var mu sync.Mutex
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for conn := range 4 {
			wg.Go(func() {
				c, err := servertest.Dial(addr)
				if err != nil {
					return
				}
				defer c.Close()
				ledger := int64(round*10 + conn)
				go func() {
					// The sender pipelines; responses are read below, in order.
					for e := int64(0); ; e++ {
						select {
						case <-stop:
							return
						default:
						}
						if c.SendAdd(key, entry(ledger, e), 0) != nil || c.Flush() != nil {
							return
						}
						if e%16 == 15 {
							time.Sleep(time.Millisecond)
						}
					}
				}()
				for {
					resp, err := c.Recv()
					if err != nil {
						return
					}
					if resp.Add.RC == protocol.EOK {
						mu.Lock()
						acked[[2]int64{resp.Add.LedgerID, resp.Add.EntryID}] = true
						mu.Unlock()
					}
				}
			})
		}
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
		close(stop)
		wg.Wait()
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n == 0 {
			t.Fatalf("round %d: nothing was acknowledged before the kill", round)
		}
		// Restart in this process and read everything back.
		cfg := killConfig(t, uri, dir, port)
		b, err := Start(context.Background(), cfg)
		if err != nil {
			t.Fatalf("round %d: restart: %v", round, err)
		}
		c, err := servertest.Dial(b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		keys := slices.SortedFunc(maps.Keys(acked), func(a, b [2]int64) int {
			return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
		})
		for chunk := range slices.Chunk(keys, 512) { // pipelined reads
			for _, k := range chunk {
				c.SendRead(k[0], k[1], 0, nil)
			}
			c.Flush()
			// Reads served by the worker pool may be answered out of order.
			want := map[[2]int64]bool{}
			for _, k := range chunk {
				want[k] = true
			}
			for range chunk {
				resp, err := c.Recv()
				r := resp.Read
				k := [2]int64{r.LedgerID, r.EntryID}
				if err != nil || r.RC != protocol.EOK || !want[k] || !bytes.Equal(r.Entry, entry(k[0], k[1])) {
					t.Fatalf("round %d: reading acknowledged entries: %v rc %v err %v", round, k, r.RC, err)
				}
				delete(want, k)
			}
		}
		c.Close()
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d acknowledged entries verified", round, n)
	}
}

func killConfig(t testing.TB, uri, dir string, port int) Config {
	cfg := testConfig(t, uri, dir)
	cfg.BookiePort = port
	cfg.PrometheusStatsHTTPPort = 0
	cfg.RegistrationTTL = time.Second
	cfg.Engine.WriteCacheMaxSize = 16 << 20 // checkpoints run during the flood
	return cfg
}

func waitListening(t *testing.T, addr string) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("bookie did not listen on %s", addr)
}

// startMetadataForKill returns a metadata URI reachable from a child process.
func startMetadataForKill(t *testing.T) string { return metadataURIForChild(t) }

func runKillChild() {
	port, _ := strconv.Atoi(os.Getenv("RK_PORT"))
	cfg := killConfig(&testing.T{}, os.Getenv("RK_URI"), os.Getenv("RK_DIR"), port)
	b, err := Start(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		os.Exit(2)
	}
	_ = b
	select {}
}
