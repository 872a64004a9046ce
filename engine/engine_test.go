package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

var testKey = []byte("master-key-0123456789")

// storedEntry builds a BookKeeper stored entry whose payload is a function of its ids.
func storedEntry(ledger, entry int64) []byte {
	n := int((uint64(ledger)*31+uint64(entry)*17)%2000) + 1
	b := make([]byte, storedEntryHeader+n)
	binary.BigEndian.PutUint64(b[0:], uint64(ledger))
	binary.BigEndian.PutUint64(b[8:], uint64(entry))
	binary.BigEndian.PutUint64(b[16:], uint64(entry-1)) // LAC
	binary.BigEndian.PutUint64(b[24:], uint64(entry*100))
	for i := storedEntryHeader; i < len(b); i++ {
		b[i] = byte(int64(i) ^ ledger ^ entry*7)
	}
	return b
}

// testEngine is an engine on an in-memory FS for journals and entry logs; the index uses
// indexDir on disk.
type testEngine struct {
	*Engine
	fs  *diskio.Mem
	cfg Config
}

func testConfig(t testing.TB, fs diskio.FS, ledgerDirs int) Config {
	t.Helper()
	var lds []string
	for i := range ledgerDirs {
		lds = append(lds, fmt.Sprintf("/ledgers%d", i))
	}
	cfg := DefaultConfig([]string{"/journal"}, lds)
	cfg.FS = fs
	cfg.IndexDir = t.TempDir()
	cfg.WriteCacheMaxSize = 8 << 20
	cfg.ReadAheadCacheMaxSize = 1 << 20
	cfg.EntryLogSizeLimit = 4 << 20
	cfg.Journal.MaxRecordSize = 64 << 10
	cfg.Journal.BufferedWritesThreshold = 64 << 10
	cfg.Journal.MaxFileSize = 4 << 20
	cfg.FlushInterval = time.Hour
	cfg.BookieID = "127.0.0.1:3181"
	cfg.InstanceID = "test-instance"
	return cfg
}

func openTest(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// addSync adds one entry and waits until it is durable.
func addSync(e *Engine, key []byte, stored []byte, recovery bool) error {
	done := make(chan error, 1)
	if err := e.Add(key, stored, recovery, func(_ any, err error) { done <- err }, nil); err != nil {
		return err
	}
	return <-done
}

func fenceSync(e *Engine, ledger int64, key []byte) error {
	done := make(chan error, 1)
	if err := e.Fence(ledger, key, func(_ any, err error) { done <- err }, nil); err != nil {
		return err
	}
	return <-done
}

func mustRead(t testing.TB, e *Engine, ledger, entry int64) {
	t.Helper()
	got, err := e.Read(ledger, entry, nil)
	if err != nil {
		t.Fatalf("read %d/%d: %v", ledger, entry, err)
	}
	if want := storedEntry(ledger, entry); !bytes.Equal(got, want) {
		t.Fatalf("read %d/%d: %d bytes differ from the %d written", ledger, entry, len(got), len(want))
	}
}

func TestAddReadAcrossCheckpointsAndRestart(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 2)
	e := openTest(t, cfg)
	for l := int64(1); l <= 6; l++ {
		for en := int64(0); en < 50; en++ {
			if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
				t.Fatal(err)
			}
		}
	}
	// From the write cache.
	mustRead(t, e, 3, 10)
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// From entry logs through the index (the write cache was recycled).
	for l := int64(1); l <= 6; l++ {
		for en := int64(0); en < 50; en++ {
			mustRead(t, e, l, en)
		}
	}
	if last, err := e.Read(4, -1, nil); err != nil || !bytes.Equal(last, storedEntry(4, 49)) {
		t.Fatalf("read -1: %v", err)
	}
	if lac, err := e.LastAddConfirmed(4); err != nil || lac != 48 {
		t.Fatalf("LAC %d, %v", lac, err)
	}
	if _, err := e.Read(99, 0, nil); !errors.Is(err, ErrNoLedger) {
		t.Fatalf("missing ledger: %v", err)
	}
	if _, err := e.Read(1, 50, nil); !errors.Is(err, ErrNoEntry) {
		t.Fatalf("missing entry: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openTest(t, cfg)
	defer e.Close()
	for l := int64(1); l <= 6; l++ {
		mustRead(t, e, l, 0)
		mustRead(t, e, l, 49)
	}
}

func TestMasterKeyAndFencing(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	if err := addSync(e, testKey, storedEntry(7, 0), false); err != nil {
		t.Fatal(err)
	}
	if err := addSync(e, []byte("wrong"), storedEntry(7, 1), false); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("wrong key: %v", err)
	}
	if err := fenceSync(e, 7, []byte("wrong")); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("fence with wrong key: %v", err)
	}
	if f, _ := e.IsFenced(7); f {
		t.Fatal("a fence with the wrong key fenced the ledger")
	}
	if err := fenceSync(e, 7, testKey); err != nil {
		t.Fatal(err)
	}
	if err := addSync(e, testKey, storedEntry(7, 1), false); !errors.Is(err, ErrFenced) {
		t.Fatalf("add after fence: %v", err)
	}
	if err := addSync(e, testKey, storedEntry(7, 1), true); err != nil {
		t.Fatalf("recovery add after fence: %v", err)
	}
	// Fencing a ledger this bookie never saw creates it fenced.
	if err := fenceSync(e, 8, testKey); err != nil {
		t.Fatal(err)
	}
	if err := addSync(e, testKey, storedEntry(8, 0), false); !errors.Is(err, ErrFenced) {
		t.Fatalf("add to a ledger fenced before its first entry: %v", err)
	}
	// Crash without a checkpoint: fence and key come back from the journal.
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.Close()
	cfg.FS = crashed
	e = openTest(t, cfg)
	if err := addSync(e, testKey, storedEntry(7, 2), false); !errors.Is(err, ErrFenced) {
		t.Fatalf("add after restart: %v", err)
	}
	if err := addSync(e, []byte("wrong"), storedEntry(7, 2), true); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("wrong key after restart: %v", err)
	}
	// And after a checkpoint they come from the index.
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e = openTest(t, cfg)
	defer e.Close()
	if err := addSync(e, testKey, storedEntry(8, 1), false); !errors.Is(err, ErrFenced) {
		t.Fatalf("add after checkpoint and restart: %v", err)
	}
	mustRead(t, e, 7, 1)
}

func TestCookies(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 2)
	e := openTest(t, cfg)
	e.Close()
	// Another bookie id.
	other := cfg
	other.BookieID = "10.0.0.9:3181"
	if _, err := Open(other); !errors.Is(err, ErrCookie) {
		t.Fatalf("other bookie id: %v", err)
	}
	// A wiped ledger dir.
	if err := fs.Remove(filepath.Join(cfg.LedgerDirs[1], currentDir, cookieFile)); err != nil {
		t.Fatal(err)
	}
	_, err := Open(cfg)
	if !errors.Is(err, ErrCookie) {
		t.Fatalf("wiped dir: %v", err)
	}
	t.Log(err)
}

func TestConcurrentAddsReadsAndCheckpoints(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 2)
	cfg.WriteCacheMaxSize = 4 << 20 // small: halves fill and trigger checkpoints
	e := openTest(t, cfg)
	defer e.Close()
	const writers, perWriter = 8, 400
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			ledger := int64(100 + w)
			var inner sync.WaitGroup
			for en := int64(0); en < perWriter; en++ {
				inner.Add(1)
				err := e.Add(testKey, storedEntry(ledger, en), false, func(_ any, err error) {
					if err != nil {
						t.Errorf("add: %v", err)
					}
					inner.Done()
				}, nil)
				if err != nil {
					t.Errorf("add: %v", err)
					inner.Done()
				}
			}
			inner.Wait()
		})
	}
	var readers sync.WaitGroup
	for r := range 3 {
		readers.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ledger := int64(100 + (i+r)%writers)
				last, err := e.LastEntry(ledger)
				if errors.Is(err, ErrNoLedger) || last < 0 {
					continue
				}
				if err != nil {
					t.Errorf("last entry: %v", err)
					return
				}
				en := int64(i) % (last + 1)
				got, err := e.Read(ledger, en, nil)
				if err != nil {
					t.Errorf("read %d/%d (last %d): %v", ledger, en, last, err)
					return
				}
				if !bytes.Equal(got, storedEntry(ledger, en)) {
					t.Errorf("read %d/%d: wrong bytes", ledger, en)
					return
				}
			}
		})
	}
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				if err := e.Checkpoint(); err != nil {
					t.Errorf("checkpoint: %v", err)
				}
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	for w := range writers {
		for en := int64(0); en < perWriter; en += 37 {
			mustRead(t, e, int64(100+w), en)
		}
	}
}

func (e *Engine) setCheckpointHook(f func(step checkpointStep) error) { e.checkpointHook.Store(&f) }

func (e *Engine) setReadHook(f func(ledger, entry int64, loc uint64)) { e.readHook.Store(&f) }

// TestFenceAfterAFailedFenceRecord: when the journal fails the fence record, the fencing
// request fails, and a later one for the same ledger fails too instead of waiting for a
// record nobody will write (it used to wait forever, holding a read worker).
func TestFenceAfterAFailedFenceRecord(t *testing.T) {
	fs := diskio.NewMem(4096)
	e := openTest(t, testConfig(t, fs, 1))
	defer e.Close()
	if err := addSync(e, testKey, storedEntry(1, 0), false); err != nil {
		t.Fatal(err)
	}
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpWrite && strings.HasPrefix(op.Name, "/journal") {
			return errors.New("injected journal write error")
		}
		return nil
	})
	for i := range 2 {
		done := make(chan error, 1)
		go func() { done <- fenceSync(e, 1, testKey) }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("fence %d succeeded with the journal failing", i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("fence %d never completed", i)
		}
	}
}

// TestNegativeIDsAreRefused: adds, fences and reads with negative ids are bad requests. Stored,
// such an entry used to fail every later checkpoint (the index cannot hold it), so every add
// of every client failed with EIO, and the bookie could not restart.
func TestNegativeIDsAreRefused(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	if err := addSync(e, testKey, storedEntry(1, 0), false); err != nil {
		t.Fatal(err)
	}
	for _, ids := range [][2]int64{{2, -5}, {-7, 0}} {
		if err := addSync(e, testKey, storedEntry(ids[0], ids[1]), false); !errors.Is(err, ErrBadEntry) {
			t.Errorf("add %d/%d: %v, want ErrBadEntry", ids[0], ids[1], err)
		}
	}
	if err := fenceSync(e, -3, testKey); !errors.Is(err, ErrBadEntry) {
		t.Errorf("fence of ledger -3: %v, want ErrBadEntry", err)
	}
	if _, err := e.Read(1, -5, nil); !errors.Is(err, ErrBadEntry) {
		t.Errorf("read of entry -5: %v, want ErrBadEntry", err)
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := addSync(e, testKey, storedEntry(1, 1), false); err != nil {
		t.Fatalf("an add after the refused ones: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openTest(t, cfg)
	defer e.Close()
	mustRead(t, e, 1, 1)
}

// TestNoAddIsAcknowledgedAfterTheFence: adds racing a fence are either refused or journaled
// before the fence record, so none that is not a recovery add is acknowledged after the fence
// is durable (the fenced check and the journal append were not atomic with Fence).
func TestNoAddIsAcknowledgedAfterTheFence(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.WriteCacheMaxSize = 64 << 20
	e := openTest(t, cfg)
	defer e.Close()
	rounds := int64(100)
	if testing.Short() {
		rounds = 20
	}
	var seq, late atomic.Int64 // callbacks run in journal order, on one goroutine
	for ledger := int64(1); ledger <= rounds && late.Load() == 0; ledger++ {
		if err := addSync(e, testKey, storedEntry(ledger, 0), false); err != nil {
			t.Fatal(err)
		}
		var fencedAt, next atomic.Int64
		fencedAt.Store(math.MaxInt64)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = e.Add(testKey, storedEntry(ledger, next.Add(1)), false, func(_ any, err error) {
						if s := seq.Add(1); err == nil && s > fencedAt.Load() {
							late.Add(1)
						}
					}, nil)
				}
			})
		}
		for next.Load() < 50 {
			runtime.Gosched()
		}
		done := make(chan struct{})
		if err := e.Fence(ledger, testKey, func(_ any, err error) { fencedAt.Store(seq.Add(1)); close(done) }, nil); err != nil {
			t.Fatal(err)
		}
		<-done
		close(stop)
		wg.Wait()
	}
	if n := late.Load(); n > 0 {
		t.Fatalf("%d adds acknowledged after the ledger's fence was durable", n)
	}
}
