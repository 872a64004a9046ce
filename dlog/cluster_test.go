package dlog

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster"
)

func TestMain(m *testing.M) {
	if os.Getenv("DLOG_DEBUG") != "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	} else {
		slog.SetDefault(slog.New(slog.DiscardHandler))
	}
	os.Exit(m.Run())
}

// newClient opens a ledger client on the cluster with short timeouts.
func newClient(t testing.TB, c *cluster.Cluster) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig(c.MetadataURI())
	cfg.Transport.AddTimeout = 2 * time.Second
	cfg.Transport.ReadTimeout = 2 * time.Second
	cfg.Transport.ReconnectMax = 200 * time.Millisecond
	cfg.SpeculativeReadTimeout = 200 * time.Millisecond
	cl, err := client.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// testConfig is a namespace config for tests: quick lock expiry and polling.
func testConfig() Config {
	return Config{LockTTL: 2 * time.Second, TailPollInterval: 5 * time.Millisecond}
}

func newNamespace(t testing.TB, cl *client.Client, cfg Config) *Namespace {
	t.Helper()
	ns, err := NewNamespace(cl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// payloadFor is record txid's payload: the txid, then filler up to size bytes.
func payloadFor(txID int64, size int) []byte {
	b := make([]byte, max(size, 8))
	binary.BigEndian.PutUint64(b, uint64(txID))
	for i := 8; i < len(b); i++ {
		b[i] = byte(txID) + byte(i)
	}
	return b
}

func checkPayload(r Record, size int) error {
	want := payloadFor(r.TxID, size)
	if string(r.Payload) != string(want) {
		return fmt.Errorf("record %d at %s: payload of %d bytes does not match", r.TxID, r.DLSN.Text(), len(r.Payload))
	}
	return nil
}

// acks collects asynchronous write results.
type acks struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	byTx   map[int64]DLSN
	failed map[int64]error
}

func newAcks() *acks { return &acks{byTx: map[int64]DLSN{}, failed: map[int64]error{}} }

func (a *acks) callback(txID int64) func(DLSN, error) {
	a.wg.Add(1)
	return func(d DLSN, err error) {
		defer a.wg.Done()
		a.mu.Lock()
		defer a.mu.Unlock()
		if err != nil {
			a.failed[txID] = err
		} else {
			a.byTx[txID] = d
		}
	}
}

// readN reads n records from r and checks their order, payloads and (if want is set) DLSNs.
func readN(t *testing.T, ctx context.Context, r *Reader, n int, size int, want map[int64]DLSN) []Record {
	t.Helper()
	out := make([]Record, 0, n)
	var prev Record
	for i := range n {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("record %d of %d: %v", i, n, err)
		}
		if i > 0 && (rec.TxID <= prev.TxID || !prev.DLSN.Less(rec.DLSN)) {
			t.Fatalf("record %d (tx %d at %s) after tx %d at %s", i, rec.TxID, rec.DLSN.Text(), prev.TxID, prev.DLSN.Text())
		}
		if err := checkPayload(rec, size); err != nil {
			t.Fatal(err)
		}
		if want != nil {
			if d, ok := want[rec.TxID]; ok && d != rec.DLSN {
				t.Fatalf("record %d read at %s, acknowledged at %s", rec.TxID, rec.DLSN.Text(), d.Text())
			}
		}
		prev = rec
		out = append(out, rec)
	}
	return out
}

// createWriting creates log name in ns and opens its writer.
func createWriting(t testing.TB, ctx context.Context, ns *Namespace, name string) (*Log, *Writer) {
	t.Helper()
	l, err := ns.CreateLog(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return l, w
}
