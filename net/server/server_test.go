package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

func TestAddThenRead(t *testing.T) {
	for _, cached := range []bool{true, false} {
		t.Run(fmt.Sprintf("cache=%v", cached), func(t *testing.T) {
			opts := []envOption{withStorage(func(st *servertest.MemStorage) { st.DisableCache = !cached })}
			transports(t, opts, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
				c := dial()
				for i := range int64(5) {
					mustAdd(t, c, keyA, entry(1, i, fmt.Sprintf("payload %d", i)), 0, protocol.EOK)
				}
				for i := range int64(5) {
					got := mustRead(t, c, 1, i, protocol.EOK)
					if want := entry(1, i, fmt.Sprintf("payload %d", i)); !bytes.Equal(got, want) {
						t.Fatalf("read 1/%d: got %q, want %q", i, got, want)
					}
				}
				mustRead(t, c, 1, 99, protocol.ENOENTRY)
				st := env.srv.Stats()
				if cached && st.CachedReads < 5 {
					t.Errorf("CachedReads = %d, want ≥ 5", st.CachedReads)
				}
				if !cached && st.CachedReads != 0 {
					t.Errorf("CachedReads = %d with the cache disabled", st.CachedReads)
				}
			})
		})
	}
}

func TestReadLast(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		mustRead(t, c, 7, -1, protocol.ENOLEDGER)
		mustAdd(t, c, keyA, entry(7, 0, "zero"), 0, protocol.EOK)
		mustAdd(t, c, keyA, entry(7, 1, "one"), 0, protocol.EOK)
		got := mustRead(t, c, 7, -1, protocol.EOK)
		if !bytes.Equal(got, entry(7, 1, "one")) {
			t.Fatalf("read 7/-1 = %q, want the last entry", got)
		}
	})
}

func TestMissingLedger(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		mustRead(t, c, 12345, 0, protocol.ENOLEDGER)
		mustRead(t, c, 12345, -1, protocol.ENOLEDGER)
	})
}

func TestWrongMasterKey(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		mustAdd(t, c, keyA, entry(3, 0, "a"), 0, protocol.EOK)
		mustAdd(t, c, keyB, entry(3, 1, "b"), 0, protocol.EUA)
		// A fencing read with the wrong key must not fence.
		rc, _, err := c.FencingRead(3, -1, keyB)
		if err != nil || rc != protocol.EUA {
			t.Fatalf("fencing read with the wrong key: rc %v err %v, want EUA", rc, err)
		}
		if env.storage.IsFenced(3) {
			t.Fatal("ledger fenced by a wrong key")
		}
		mustAdd(t, c, keyA, entry(3, 1, "b"), 0, protocol.EOK)
	})
}

func TestFencing(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		writer, recoverer := dial(), dial()
		mustAdd(t, writer, keyA, entry(5, 0, "e0"), 0, protocol.EOK)
		mustAdd(t, writer, keyA, entry(5, 1, "e1"), 0, protocol.EOK)
		rc, last, err := recoverer.FencingRead(5, -1, keyA)
		if err != nil || rc != protocol.EOK {
			t.Fatalf("fencing read: rc %v err %v", rc, err)
		}
		if !bytes.Equal(last, entry(5, 1, "e1")) {
			t.Fatalf("fencing read returned %q, want the last entry", last)
		}
		mustAdd(t, writer, keyA, entry(5, 2, "late"), 0, protocol.EFENCED)
		mustAdd(t, recoverer, keyA, entry(5, 2, "recovered"), protocol.FlagRecoveryAdd, protocol.EOK)
		// Fencing is idempotent; fencing an unknown ledger creates it fenced, with no entry.
		if rc, _, _ := recoverer.FencingRead(5, -1, keyA); rc != protocol.EOK {
			t.Fatalf("second fencing read: %v", rc)
		}
		if rc, _, _ := recoverer.FencingRead(6, -1, keyA); rc != protocol.ENOENTRY {
			t.Fatalf("fencing read of an empty ledger: %v, want ENOENTRY", rc)
		}
		mustAdd(t, writer, keyA, entry(6, 0, "late"), 0, protocol.EFENCED)
	})
}

func TestFenceFailure(t *testing.T) {
	env := startEnv(t, withStorage(func(st *servertest.MemStorage) { st.FailFences(servertest.ErrIO) }))
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	if rc, _, err := c.FencingRead(1, -1, keyA); err != nil || rc != protocol.EIO {
		t.Fatalf("fencing read with a failing fence: rc %v err %v, want EIO", rc, err)
	}
}

func TestAddFailureMapped(t *testing.T) {
	env := startEnv(t)
	c := env.dial(t)
	env.storage.FailAdds(servertest.ErrIO)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EIO)
	env.storage.FailAdds(nil)
	mustAdd(t, c, keyA, entry(1, 1, "x"), 0, protocol.EOK)
}

func TestDefaultErrorCodeIsEIO(t *testing.T) {
	env := startEnv(t, withConfig(func(c *Config) { c.ErrorCode = nil }))
	c := env.dial(t)
	mustRead(t, c, 404, 0, protocol.EIO)
}

func TestReadOnly(t *testing.T) {
	env := startEnv(t)
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	env.storage.SetReadOnly(true)
	mustAdd(t, c, keyA, entry(1, 1, "x"), 0, protocol.EREADONLY)
	mustAdd(t, c, keyA, entry(1, 1, "x"), protocol.FlagRecoveryAdd, protocol.EREADONLY)
	mustAdd(t, c, keyA, entry(1, 1, "x"), protocol.FlagRecoveryAdd|protocol.FlagHighPriority, protocol.EOK)
	mustAdd(t, c, keyA, entry(1, 2, "x"), protocol.FlagHighPriority, protocol.EOK)
	mustRead(t, c, 1, 2, protocol.EOK)
	env.storage.SetReadOnly(false)
	mustAdd(t, c, keyA, entry(1, 3, "x"), 0, protocol.EOK)
}

func TestBatchRead(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		for i := range int64(10) {
			mustAdd(t, c, keyA, entry(9, i, fmt.Sprintf("entry-%02d", i)), 0, protocol.EOK)
		}
		entrySize := int64(len(entry(9, 0, "entry-00")))
		cases := []struct {
			name           string
			start          int64
			count          int32
			size           int64
			rc             protocol.ReturnCode
			first, entries int64
		}{
			{"count", 2, 5, 1 << 20, protocol.EOK, 2, 5},
			{"no count limit stops at the end", 6, 0, 1 << 20, protocol.EOK, 6, 4},
			{"size keeps the first entry", 3, 5, 1, protocol.EOK, 3, 1},
			{"size", 0, 10, 36 + 3*(entrySize+4), protocol.EOK, 0, 3},
			{"last entry", -1, 5, 1 << 20, protocol.EOK, 9, 1},
			{"missing start", 10, 5, 1 << 20, protocol.ENOENTRY, 0, 0},
		}
		for i, tc := range cases {
			resp, err := c.BatchRead(protocol.BatchReadRequest{LedgerID: 9, StartEntryID: tc.start,
				RequestID: int64(100 + i), MaxCount: tc.count, MaxSize: tc.size})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if resp.RC != tc.rc || int64(resp.Count) != tc.entries {
				t.Fatalf("%s: rc %v with %d entries, want %v with %d", tc.name, resp.RC, resp.Count, tc.rc, tc.entries)
			}
			n := tc.first
			for e := range resp.Entries() {
				if want := entry(9, n, fmt.Sprintf("entry-%02d", n)); !bytes.Equal(e, want) {
					t.Fatalf("%s: entry %q, want %q", tc.name, e, want)
				}
				n++
			}
		}
		resp, err := c.BatchRead(protocol.BatchReadRequest{LedgerID: 4242, StartEntryID: 0, RequestID: 7, MaxCount: 2, MaxSize: 1 << 20})
		if err != nil || resp.RC != protocol.ENOLEDGER {
			t.Fatalf("batch read of a missing ledger: rc %v err %v", resp.RC, err)
		}
	})
}

func TestOversizeFrameClosed(t *testing.T) {
	transports(t, []envOption{withConfig(func(c *Config) { c.MaxFrameSize = 64 << 10 })},
		func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
			good, bad := dial(), dial()
			mustAdd(t, good, keyA, entry(1, 0, "x"), 0, protocol.EOK)
			// Announce a frame one byte over the limit (the limit counts the prefix); send a little.
			if err := bad.SendRaw([]byte{0, 1, 0, 0x00, 0, 0, 0, 0}); err != nil {
				t.Fatal(err)
			}
			_ = bad.Flush()
			if err := bad.ExpectClosed(5 * time.Second); err != nil {
				t.Fatal(err)
			}
			// A frame just under the limit is served.
			big := entry(1, 1, string(make([]byte, 64<<10-4-4-20-32)))
			mustAdd(t, good, keyA, big, 0, protocol.EOK)
			if got := mustRead(t, good, 1, 1, protocol.EOK); !bytes.Equal(got, big) {
				t.Fatal("big entry read back differently")
			}
			if st := env.srv.Stats(); st.ProtocolCloses != 1 {
				t.Errorf("ProtocolCloses = %d, want 1", st.ProtocolCloses)
			}
		})
}

// TestOversizeAddAnswered (BookKeeper #2357): an add over MaxFrameSize, from a client whose
// own limit is larger, is answered EBADREQ and its bytes are skipped; the connection, and the
// adds pipelined on it around the oversize one, go on.
func TestOversizeAddAnswered(t *testing.T) {
	const limit = 64 << 10
	transports(t, []envOption{withConfig(func(c *Config) { c.MaxFrameSize = limit })},
		func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
			c := dial()
			var raw []byte
			for i, data := range []string{"before", string(make([]byte, 3*limit)), "after"} {
				b, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: 2},
					MasterKey: keyA, Entry: entry(1, int64(i), data)})
				if err != nil {
					t.Fatal(err)
				}
				raw = append(raw, b...)
			}
			sent := make(chan error, 1)
			go func() { // the server answers while the rest is being written
				err := c.SendRaw(raw)
				if err == nil {
					err = c.Flush()
				}
				sent <- err
			}()
			want := map[int64]protocol.ReturnCode{0: protocol.EOK, 1: protocol.EBADREQ, 2: protocol.EOK}
			for range len(want) {
				resp, err := c.Recv()
				if rc, ok := want[resp.Add.EntryID]; err != nil || !ok || resp.Header.Op != protocol.OpAddEntry || resp.Add.RC != rc {
					t.Fatalf("response %+v, %v; want %v", resp.Add, err, want)
				}
				delete(want, resp.Add.EntryID)
			}
			if err := <-sent; err != nil { // the client is not safe for concurrent writes
				t.Fatal(err)
			}
			mustAdd(t, c, keyA, entry(1, 3, "still served"), 0, protocol.EOK)
			mustRead(t, c, 1, 2, protocol.EOK)
			mustRead(t, c, 1, 1, protocol.ENOENTRY)
			if st := env.srv.Stats(); st.ProtocolCloses != 0 || st.BadRequests != 1 {
				t.Errorf("ProtocolCloses %d BadRequests %d, want 0 and 1", st.ProtocolCloses, st.BadRequests)
			}
		})
}

// TestOversizeClaimBeyondDiscardLimitClosed (reliability item 22): an add announcing more
// than maxDiscardFrames × MaxFrameSize, up to a length of 2³¹−1, closes its connection as
// soon as the length prefix has arrived, unanswered, instead of having its bytes waited out;
// one at the bound is still answered EBADREQ. Other connections go on.
func TestOversizeClaimBeyondDiscardLimitClosed(t *testing.T) {
	const limit = 64 << 10
	transports(t, []envOption{withConfig(func(c *Config) { c.MaxFrameSize = limit })},
		func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
			good := dial()
			mustAdd(t, good, keyA, entry(1, 0, "x"), 0, protocol.EOK)
			// head is the start of an add (its ids and key) whose length prefix says length.
			head := func(length uint32, entryID int64) []byte {
				b, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: 2},
					MasterKey: keyA, Entry: entry(1, entryID, "")})
				if err != nil {
					t.Fatal(err)
				}
				binary.BigEndian.PutUint32(b, length)
				return b
			}
			atBound := dial()
			_ = atBound.SendRaw(head(limit*maxDiscardFrames-protocol.LengthPrefixSize, 1))
			_ = atBound.Flush()
			if resp, err := atBound.Recv(); err != nil || resp.Add.RC != protocol.EBADREQ || resp.Add.EntryID != 1 {
				t.Fatalf("add at the discard bound: %+v, %v; want EBADREQ for entry 1", resp.Add, err)
			}
			// Just over the bound, with the add's ids sent; and 2³¹−1, with only the prefix sent.
			over := head(limit*maxDiscardFrames-protocol.LengthPrefixSize+1, 2)
			huge := head(math.MaxInt32, 3)[:protocol.LengthPrefixSize]
			for _, raw := range [][]byte{over, huge} {
				bad := dial()
				_ = bad.SendRaw(raw)
				_ = bad.Flush()
				if resp, err := bad.Recv(); !servertest.IsClosedErr(err) {
					t.Fatalf("add of length %d: %+v, %v; want the connection closed unanswered", binary.BigEndian.Uint32(raw), resp.Add, err)
				}
			}
			mustAdd(t, good, keyA, entry(1, 1, "still served"), 0, protocol.EOK)
			if st := env.srv.Stats(); st.ProtocolCloses != 2 || st.BadRequests != 1 {
				t.Errorf("ProtocolCloses %d BadRequests %d, want 2 and 1", st.ProtocolCloses, st.BadRequests)
			}
		})
}

func TestGarbage(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		good := dial()
		mustAdd(t, good, keyA, entry(1, 0, "x"), 0, protocol.EOK)

		// A malformed add whose ids were parsed is answered EBADREQ and the connection goes on.
		c := dial()
		short := []byte{0, 0, 0, 4 + 20 + 16, 0x02, byte(protocol.OpAddEntry), 0, 0} // stored entry of 16 bytes
		short = append(short, keyA[:]...)
		short = append(short, entry(1, 5, "")[:16]...)
		if err := c.SendRaw(short); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		resp, err := c.Recv()
		if err != nil || resp.Header.Op != protocol.OpAddEntry || resp.Add.RC != protocol.EBADREQ || resp.Add.EntryID != 5 {
			t.Fatalf("short add: %+v, %v; want EBADREQ for entry 5", resp.Add, err)
		}
		mustAdd(t, c, keyA, entry(1, 1, "after"), 0, protocol.EOK)

		// An unknown opcode closes.
		c2 := dial()
		_ = c2.SendRaw([]byte{0, 0, 0, 8, 0x02, 0x63, 0, 0, 1, 2, 3, 4})
		_ = c2.Flush()
		if err := c2.ExpectClosed(5 * time.Second); err != nil {
			t.Fatal(err)
		}

		// Pure noise (a negative length) closes.
		c3 := dial()
		_ = c3.SendRaw(bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 100))
		_ = c3.Flush()
		if err := c3.ExpectClosed(5 * time.Second); err != nil {
			t.Fatal(err)
		}

		// A frame shorter than its header closes.
		c4 := dial()
		_ = c4.SendRaw([]byte{0, 0, 0, 2, 1, 1})
		_ = c4.Flush()
		if err := c4.ExpectClosed(5 * time.Second); err != nil {
			t.Fatal(err)
		}

		mustAdd(t, good, keyA, entry(1, 2, "still fine"), 0, protocol.EOK)
		mustRead(t, good, 1, 1, protocol.EOK)
		st := env.srv.Stats()
		if st.BadRequests != 1 || st.ProtocolCloses != 3 {
			t.Errorf("BadRequests %d, ProtocolCloses %d; want 1 and 3", st.BadRequests, st.ProtocolCloses)
		}
	})
}

func TestBadVersionAnswered(t *testing.T) {
	env := startEnv(t)
	c := env.dial(t)
	frame := protocol.AppendReadRequest(nil, protocol.ReadRequest{Header: protocol.Header{Version: 2}, LedgerID: 1, EntryID: 2})
	frame[4] = 9 // version 9
	_ = c.SendRaw(frame)
	_ = c.Flush()
	resp, err := c.Recv()
	if err != nil || resp.Read.RC != protocol.EBADVERSION {
		t.Fatalf("bad version: %+v %v", resp.Read, err)
	}
}

func TestPanicContained(t *testing.T) {
	env := startEnv(t)
	good, bad := env.dial(t), env.dial(t)
	env.storage.PanicOnAdd(666)
	_ = bad.SendAdd(keyA, entry(666, 0, "boom"), 0)
	_ = bad.Flush()
	if err := bad.ExpectClosed(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, good, keyA, entry(1, 0, "fine"), 0, protocol.EOK)
	st := env.srv.Stats()
	if st.Panics != 1 || st.AddsInFlight != 0 {
		t.Fatalf("Panics %d AddsInFlight %d, want 1 and 0", st.Panics, st.AddsInFlight)
	}
}

func TestManyConnections(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		const conns, perConn = 32, 100
		clients := make([]*servertest.Client, conns)
		for i := range clients {
			clients[i] = dial()
		}
		var wg sync.WaitGroup
		errs := make(chan error, conns)
		for i, c := range clients {
			wg.Go(func() {
				ledger := int64(1000 + i)
				for e := range int64(perConn) {
					if err := c.SendAdd(keyA, entry(ledger, e, "data"), 0); err != nil {
						errs <- err
						return
					}
				}
				if err := c.Flush(); err != nil {
					errs <- err
					return
				}
				seen := make(map[int64]bool)
				for range perConn {
					resp, err := c.Recv()
					if err != nil {
						errs <- err
						return
					}
					if resp.Add.RC != protocol.EOK || resp.Add.LedgerID != ledger || seen[resp.Add.EntryID] {
						errs <- fmt.Errorf("conn %d: bad response %+v", i, resp.Add)
						return
					}
					seen[resp.Add.EntryID] = true
				}
				if rc, got, err := c.Read(ledger, -1); err != nil || rc != protocol.EOK || !bytes.Equal(got, entry(ledger, perConn-1, "data")) {
					errs <- fmt.Errorf("conn %d: read last: rc %v err %v", i, rc, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if n := env.srv.Stats().Connections; n != conns {
			t.Errorf("Connections = %d, want %d", n, conns)
		}
	})
}

func TestPipeliningBatchesResponses(t *testing.T) {
	transports(t, []envOption{withStorage(func(st *servertest.MemStorage) { st.Delay = 200 * time.Microsecond })},
		func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
			c := dial()
			const n = 5000
			go func() {
				for i := range int64(n) {
					if err := c.SendAdd(keyA, entry(1, i, "pipelined"), 0); err != nil {
						return
					}
				}
				_ = c.Flush()
			}()
			seen := make([]bool, n)
			for range n {
				resp, err := c.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if resp.Add.RC != protocol.EOK || seen[resp.Add.EntryID] {
					t.Fatalf("bad response %+v", resp.Add)
				}
				seen[resp.Add.EntryID] = true
			}
			st := env.srv.Stats()
			_, _, _, groups := env.storage.Counters()
			t.Logf("%d responses in %d flushes (%d storage groups)", st.ResponsesQueued, st.Flushes, groups)
			if st.ResponsesQueued != n || st.Flushes >= n/2 {
				t.Errorf("ResponsesQueued %d, Flushes %d: want %d responses in fewer than %d writes", st.ResponsesQueued, st.Flushes, n, n/2)
			}
		})
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	env := startEnv(t, withConfig(func(c *Config) { c.Metrics = m; c.MaxPendingAddRequestsPerThread = 1 }),
		withStorage(func(st *servertest.MemStorage) { st.DisableCache = true }))
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	mustRead(t, c, 1, 0, protocol.EOK)
	mustRead(t, c, 1, 5, protocol.ENOENTRY)
	env.storage.Hold()
	_ = c.SendAdd(keyA, entry(1, 1, "x"), 0)
	_ = c.SendAdd(keyA, entry(1, 2, "x"), 0)
	_ = c.Flush()
	if resp, err := c.Recv(); err != nil || resp.Add.RC != protocol.ETOOMANYREQUESTS {
		t.Fatalf("want ETOOMANYREQUESTS first, got %+v %v", resp.Add, err)
	}
	if got := metricValue(t, reg, "bookkeeper_server_ADD_ENTRY_IN_PROGRESS"); got != 1 {
		t.Errorf("ADD_ENTRY_IN_PROGRESS = %v, want 1", got)
	}
	env.storage.Release()
	if resp, err := c.Recv(); err != nil || resp.Add.RC != protocol.EOK {
		t.Fatalf("held add: %+v %v", resp.Add, err)
	}
	expect := map[string]float64{
		"bookkeeper_server_ADD_ENTRY_REJECTED":  1,
		"bookkeeper_server_READ_ENTRY_REJECTED": 0,
		"ringkeeper_server_connections":         1,
	}
	for name, want := range expect {
		if got := metricValue(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// The add refused ETOOMANYREQUESTS is observed too (success="false"), as in BookKeeper.
	for name, want := range map[string]uint64{"bookkeeper_server_ADD_ENTRY_REQUEST": 3, "bookkeeper_server_READ_ENTRY_REQUEST": 2} {
		if got := histogramCount(t, reg, name); got != want {
			t.Errorf("%s observations = %d, want %d", name, got, want)
		}
	}
	// A nil *Metrics is valid everywhere.
	var nilM *Metrics
	nilM.observeAdd(monotime.Now(), true)
	nilM.addRejected()
	nilM.connClosed(closePanic)
}

func gather(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// metricValue returns the value of a single-series gauge or counter.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mf := gather(t, reg, name)
	if len(mf.Metric) != 1 {
		t.Fatalf("%s has %d series", name, len(mf.Metric))
	}
	if g := mf.Metric[0].Gauge; g != nil {
		return g.GetValue()
	}
	return mf.Metric[0].Counter.GetValue()
}

// histogramCount sums the observations of every series of a histogram.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	var n uint64
	for _, m := range gather(t, reg, name).Metric {
		n += m.Histogram.GetSampleCount()
	}
	return n
}

func TestStopGraceful(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		env.storage.Hold()
		for i := range int64(10) {
			_ = c.SendAdd(keyA, entry(1, i, "x"), 0)
		}
		_ = c.Flush()
		eventually(t, 5*time.Second, "adds in flight", func() bool { return env.srv.Stats().AddsInFlight == 10 })
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			stopped <- env.srv.Stop(ctx)
		}()
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-stopped:
			t.Fatalf("Stop returned with adds in flight: %v", err)
		default:
		}
		env.storage.Release()
		for range 10 {
			resp, err := c.Recv()
			if err != nil || resp.Add.RC != protocol.EOK {
				t.Fatalf("in-flight add during Stop: %+v %v", resp.Add, err)
			}
		}
		if err := <-stopped; err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := c.ExpectClosed(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := servertest.Dial(env.srv.Addr().String()); err == nil && env.srv.TLSAddr() == nil {
			// gnet's listener is closed once Run returns; a dial may still race the close.
			t.Log("dial after Stop succeeded (listener close raced)")
		}
	})
}

func TestStopTimeout(t *testing.T) {
	env := startEnv(t)
	c := env.dial(t)
	env.storage.Hold()
	_ = c.SendAdd(keyA, entry(1, 0, "x"), 0)
	_ = c.Flush()
	eventually(t, 5*time.Second, "add in flight", func() bool { return env.srv.Stats().AddsInFlight == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := env.srv.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with a held add: %v, want DeadlineExceeded", err)
	}
	env.storage.Release() // the late completion finds its connection closed
	if err := env.srv.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestLifecycleErrors(t *testing.T) {
	st := servertest.NewMemStorage()
	defer st.Close()
	s, err := New(Config{Addr: "127.0.0.1:0", Logger: testLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(context.Background()); !errors.Is(err, ErrState) {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); !errors.Is(err, ErrState) {
		t.Fatalf("second Start: %v", err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}, nil); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("nil storage: %v", err)
	}
	// A taken port fails Start.
	s2, err := New(Config{Addr: "127.0.0.1:0", Logger: testLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s2.Stop(context.Background()) }()
	s3, err := New(Config{Addr: s2.Addr().String(), Logger: testLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Start(); err == nil {
		_ = s3.Stop(context.Background())
		t.Fatal("Start on a taken port succeeded")
	}
}

func TestReusePort(t *testing.T) {
	env := startEnv(t, withConfig(func(c *Config) { c.ReusePort = true; c.NumEventLoops = 3 }))
	for i := range 6 {
		c := env.dial(t)
		mustAdd(t, c, keyA, entry(int64(i+1), 0, "x"), 0, protocol.EOK)
	}
}

func TestConfigValidate(t *testing.T) {
	pki := newTestPKI(t)
	cases := []struct {
		name string
		mod  func(*Config)
	}{
		{"bad addr", func(c *Config) { c.Addr = "nope" }},
		{"bad tls addr", func(c *Config) { c.TLSAddr = "nope" }},
		{"tls without config", func(c *Config) { c.TLSAddr = ":0" }},
		{"tls without cert", func(c *Config) { c.TLSAddr = ":0"; c.TLSConfig = pki.clientConfig(false) }},
		{"loops", func(c *Config) { c.NumEventLoops = -1 }},
		{"frame", func(c *Config) { c.MaxFrameSize = 10 }},
		{"workers", func(c *Config) { c.NumReadWorkerThreads = -1 }},
		{"queue", func(c *Config) { c.ReadWorkerQueueSize = -1 }},
		{"pending adds", func(c *Config) { c.MaxPendingAddRequestsPerThread = -1 }},
		{"pending reads", func(c *Config) { c.MaxPendingReadRequestsPerThread = -1 }},
		{"adds in progress", func(c *Config) { c.MaxAddsInProgressLimit = -1 }},
		{"reads in progress", func(c *Config) { c.MaxReadsInProgressLimit = -1 }},
		{"outbound", func(c *Config) { c.MaxOutboundBytesPerConnection = -1 }},
		{"inbound under frame", func(c *Config) { c.MaxInboundBytesPerConnection = 1 << 20 }},
		{"handshake", func(c *Config) { c.TLSHandshakeTimeout = -1 }},
		{"resume", func(c *Config) { c.ResumeInterval = -1 }},
		{"read buffer", func(c *Config) { c.ReadBufferCap = -1 }},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: Validate = %v, want ErrBadConfig", tc.name, err)
		}
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.MaxFrameSize != 5<<20 || c.NumReadWorkerThreads != 8 || c.MaxPendingAddRequestsPerThread != 10000 ||
		c.MaxAddsInProgressLimit != 0 || c.Addr != ":3181" {
		t.Fatalf("unexpected defaults: %+v", c)
	}
}

// TestLargeReadsPipelined pipelines many reads of an 8 KiB entry: from the pool, responses over
// 4 KiB are queued as separate buffers (and a flush of more than 512 is split into several
// writev calls); from the cache, they collect on the loop past the immediate-flush threshold.
func TestLargeReadsPipelined(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("cache=%v", cached), func(t *testing.T) {
			env := startEnv(t, withStorage(func(st *servertest.MemStorage) { st.DisableCache = !cached }))
			c := env.dial(t)
			big := entry(1, 0, string(bytes.Repeat([]byte("0123456789abcdef"), 512)))
			mustAdd(t, c, keyA, big, 0, protocol.EOK)
			const n = 1500
			for range n {
				_ = c.SendRead(1, 0, 0, nil)
			}
			_ = c.Flush()
			for i := range n {
				resp, err := c.Recv()
				if err != nil {
					t.Fatalf("response %d: %v", i, err)
				}
				if resp.Read.RC != protocol.EOK || !bytes.Equal(resp.Read.Entry, big) {
					t.Fatalf("response %d: rc %v, %d bytes", i, resp.Read.RC, len(resp.Read.Entry))
				}
			}
		})
	}
}

func TestBigEntries(t *testing.T) {
	opts := []envOption{withStorage(func(st *servertest.MemStorage) { st.DisableCache = true })}
	transports(t, opts, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		// The largest add that fits the default 5 MiB frame, and a few 1 MiB ones pipelined.
		maxEntry := entry(1, 0, string(bytes.Repeat([]byte{'m'}, DefaultMaxFrameSize-4-4-20-32)))
		mustAdd(t, c, keyA, maxEntry, 0, protocol.EOK)
		for i := int64(1); i <= 4; i++ {
			_ = c.SendAdd(keyA, entry(1, i, string(bytes.Repeat([]byte{byte('a' + i)}, 1<<20))), 0)
		}
		_ = c.Flush()
		if got := recvCodes(t, c, 4); len(got[protocol.EOK]) != 4 {
			t.Fatalf("pipelined 1 MiB adds: %v", got)
		}
		if got := mustRead(t, c, 1, 0, protocol.EOK); !bytes.Equal(got, maxEntry) {
			t.Fatal("largest entry read back differently")
		}
		if got := mustRead(t, c, 1, 3, protocol.EOK); !bytes.Equal(got, entry(1, 3, string(bytes.Repeat([]byte{'d'}, 1<<20)))) {
			t.Fatal("1 MiB entry read back differently")
		}
	})
}

// TestKeylessFencingReadIsRefused: a fencing read without a master key (a version-1 request)
// is answered EUA, as BookKeeper does, and fences nothing: fencing under an empty key would
// also create the ledger with it and lock the writer out.
func TestKeylessFencingReadIsRefused(t *testing.T) {
	env := startEnv(t)
	c := env.dial(t)
	frame := make([]byte, 4+4+16)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	binary.BigEndian.PutUint32(frame[4:], protocol.Header{Version: 1, Op: protocol.OpReadEntry, Flags: protocol.FlagDoFencing}.Uint32())
	binary.BigEndian.PutUint64(frame[8:], 7)
	lac := protocol.LastAddConfirmedEntryID
	binary.BigEndian.PutUint64(frame[16:], uint64(lac))
	if err := c.SendRaw(frame); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Read.RC != protocol.EUA || env.storage.IsFenced(7) {
		t.Fatalf("key-less fencing read answered %v (want EUA); ledger fenced: %v", resp.Read.RC, env.storage.IsFenced(7))
	}
	if rc, err := c.Add(keyA, entry(7, 0, "x"), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("the writer's add after it: %v, %v", rc, err)
	}
}

// TestNegativeIDsAreBadRequests: adds with negative ids and reads below entry -1 are answered
// EBADREQ before they reach storage.
func TestNegativeIDsAreBadRequests(t *testing.T) {
	env := startEnv(t)
	c := env.dial(t)
	for _, ids := range [][2]int64{{1, -5}, {-7, 0}} {
		if rc, err := c.Add(keyA, entry(ids[0], ids[1], "x"), 0); err != nil || rc != protocol.EBADREQ {
			t.Errorf("add %d/%d: %v, %v; want EBADREQ", ids[0], ids[1], rc, err)
		}
	}
	if rc, _, err := c.Read(1, -5); err != nil || rc != protocol.EBADREQ {
		t.Errorf("read of entry -5: %v, %v; want EBADREQ", rc, err)
	}
}

// TestWakeCoalescingStrandsNothing: a completion wakes the loop only if the queue was empty, so
// one racing with the loop's take of the queue must still be written. Small windows keep
// completions, wakes and takes interleaving; a stranded response fails the read deadline.
func TestWakeCoalescingStrandsNothing(t *testing.T) {
	env := startEnv(t)
	n := 5000
	if testing.Short() {
		n = 1000
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i, window := range []int{1, 2, 3, 8} {
		nc, err := net.Dial("tcp", env.srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
		tokens := make(chan struct{}, window)
		for range window {
			tokens <- struct{}{}
		}
		wg.Add(2)
		go func() { defer wg.Done(); errs <- benchWriter(nc, int64(100+i), n, 16, tokens) }()
		go func() {
			defer wg.Done()
			errs <- benchReader(nc, n, tokens)
			_ = nc.Close()
			close(tokens) // a writer waiting for a response that never came stops
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
