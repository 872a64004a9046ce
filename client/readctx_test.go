package client

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// silentBookie accepts connections and never answers anything: with an AuthPlugin set, a
// client's connection to it stays in its AUTH exchange and its requests stay queued.
func silentBookie(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range conns {
			_ = nc.Close()
		}
	})
	return ln.Addr().String()
}

// offlineLedger is a read handle on a (1,1,1) ledger stored on bookie, with metadata md
// (nil: closed at entry 9) and a client that has a real transport but no metadata service:
// enough for reads that never refresh the metadata.
func offlineLedger(t *testing.T, tc transport.Config, bookie string, md *metadata.LedgerMetadata) (*Ledger, *transport.Pool) {
	t.Helper()
	tc.Logger = slog.New(slog.DiscardHandler)
	pool, err := transport.NewPool(tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	cfg := DefaultConfig("")
	cfg.Transport = tc
	cfg.dial = func(addr string) bookieConn { return transportConn{pool.Conn(addr)} }
	cl := &Client{cfg: cfg, log: tc.Logger}
	if md == nil {
		md = &metadata.LedgerMetadata{
			EnsembleSize: 1, WriteQuorumSize: 1, AckQuorumSize: 1, State: metadata.StateClosed, LastEntryID: 9,
			Ensembles: []metadata.Ensemble{{FirstEntryID: 0, Bookies: []string{bookie}}}, DigestType: DigestCRC32C,
			Password: password,
		}
	}
	lh, err := newLedger(cl, 1, md, 1, password, true)
	if err != nil {
		t.Fatal(err)
	}
	return lh, pool
}

// fillSendQueue queues one add on the connection to bookie that takes its whole
// MaxQueuedBytesPerConn (frameSize), so that the next request blocks its caller.
func fillSendQueue(pool *transport.Pool, bookie string, frameSize int) {
	entry := make([]byte, frameSize-protocol.LengthPrefixSize-protocol.HeaderSize-protocol.MasterKeyLength)
	binary.BigEndian.PutUint64(entry[0:], 1)
	binary.BigEndian.PutUint64(entry[8:], 1000)
	key := MasterKey(password)
	pool.Conn(bookie).Add(1, 1000, &key, 0, [][]byte{entry}, func(any, protocol.ReturnCode, error) {}, nil)
}

// TestReadBlockedOnAFullSendQueueHonoursItsContext: the connection to the only replica waits
// for its AUTH response with a full send queue, so the transport blocks the read's send until
// the read timeout. Read and ReadLastAddConfirmed must still return when their context ends,
// not a read timeout later.
func TestReadBlockedOnAFullSendQueueHonoursItsContext(t *testing.T) {
	bookie := silentBookie(t)
	tc := transport.Config{AuthPlugin: "plug", MaxFrameSize: 4096, MaxQueuedBytesPerConn: 4096,
		ReadTimeout: 5 * time.Second, AddTimeout: 30 * time.Second, DialTimeout: 30 * time.Second}
	closed, pool := offlineLedger(t, tc, bookie, nil)
	fillSendQueue(pool, bookie, 4096)

	open := closed.Metadata()
	open.State, open.LastEntryID = metadata.StateOpen, metadata.NoEntry
	tailing, err := newLedger(closed.c, 1, open, 1, password, false)
	if err != nil {
		t.Fatal(err)
	}
	for name, read := range map[string]func(context.Context) error{
		"Read":                 func(ctx context.Context) error { _, err := closed.Read(ctx, 0, 0); return err },
		"ReadLastAddConfirmed": func(ctx context.Context) error { _, err := tailing.ReadLastAddConfirmed(ctx); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err := read(ctx)
		took := time.Since(start)
		cancel()
		if took > 2*time.Second || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with a 200ms context, its send blocked on a full queue: returned after %v with %v",
				name, took.Round(time.Millisecond), err)
		}
	}
}

// TestReadsAfterClientCloseFailWithErrClosed: once the client is closed its reads fail with
// ErrClosed, as its adds do: no bookie failed, and a caller that takes ErrBookieUnavailable
// or ErrNotEnoughBookies for an outage would retry a client that can never answer.
func TestReadsAfterClientCloseFailWithErrClosed(t *testing.T) {
	c := clustertest.Start(t, 1)
	cl := newClient(t, c, nil)
	lh := createLedger(t, cl, 1, 1, 1)
	appendN(t, lh, 2)
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := lh.Read(ctx, 0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close: %v, want ErrClosed", err)
	}
	if _, err := lh.ReadLastAddConfirmed(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadLastAddConfirmed after Close: %v, want ErrClosed", err)
	}
}

// stallingLedgers is a metadata service whose ledger reads hang until their context ends.
type stallingLedgers struct {
	metadata.Driver
	metadata.LedgerStore
	reads chan struct{} // one value per read begun
}

func (s *stallingLedgers) Ledgers() metadata.LedgerStore { return s }

func (s *stallingLedgers) Read(ctx context.Context, id int64) (*metadata.LedgerMetadata, metadata.Version, error) {
	s.reads <- struct{}{}
	<-ctx.Done()
	return nil, 0, ctx.Err()
}

// TestReadWaitingForAnotherCallersMetadataRefreshHonoursItsContext: two reads of an open
// ledger fail on its only bookie (down), so each re-reads the metadata, which hangs (the
// metadata service is unreachable). The first read's context has no deadline; the second
// one's has, and it must return (with the bookie's error) at it, not wait for the first
// read's refresh to end.
func TestReadWaitingForAnotherCallersMetadataRefreshHonoursItsContext(t *testing.T) {
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bookie := down.Addr().String()
	_ = down.Close()
	md := &metadata.LedgerMetadata{
		EnsembleSize: 1, WriteQuorumSize: 1, AckQuorumSize: 1, State: metadata.StateOpen, LastEntryID: metadata.NoEntry,
		Ensembles: []metadata.Ensemble{{FirstEntryID: 0, Bookies: []string{bookie}}}, DigestType: DigestCRC32C,
		Password: password,
	}
	rh, _ := offlineLedger(t, transport.Config{}, bookie, md)
	stalling := &stallingLedgers{reads: make(chan struct{}, 2)}
	rh.c.md = stalling
	rh.lac = 5 // as a LAC read would have learned

	first, cancelFirst := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() { _, err := rh.Read(first, 0, 0); firstDone <- err }()
	defer func() { cancelFirst(); <-firstDone }()
	<-stalling.reads // the first read's refresh hangs

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	start := time.Now()
	go func() { _, err := rh.Read(ctx, 0, 0); second <- err }()
	select {
	case err := <-second:
		if err == nil {
			t.Fatal("second read of an entry on a bookie that is down succeeded")
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("second read, with a 200ms context, still blocked after %v behind the first read's refresh", time.Since(start).Round(time.Millisecond))
	}
}

// cutShort is a bookie connection on which every read blocks on a full send queue until its
// context ends, then fails with the context's error (as transport.Conn.ReadContext does).
type cutShort struct{ bookieConn }

func (cutShort) Read(ctx context.Context, _, _ int64, _ protocol.Flags, _ *[20]byte, cb transport.ReadCallback, cbCtx any) {
	<-ctx.Done()
	cb(cbCtx, 0, nil, ctx.Err())
}

// TestReadCutShortByItsContextFailsWithTheContextsError: a read whose sends its context cut
// short fails with the context's error, not with ErrBookieUnavailable: no bookie failed. The
// failed send's answer and the end of the context reach the read together; whichever it sees
// first, the error is the same.
func TestReadCutShortByItsContextFailsWithTheContextsError(t *testing.T) {
	md := &metadata.LedgerMetadata{
		EnsembleSize: 3, WriteQuorumSize: 3, AckQuorumSize: 2, State: metadata.StateClosed, LastEntryID: 9,
		Ensembles:  []metadata.Ensemble{{FirstEntryID: 0, Bookies: []string{"b0:1", "b1:1", "b2:1"}}},
		DigestType: DigestCRC32C, Password: password,
	}
	lh, _ := offlineLedger(t, transport.Config{}, "", md)
	lh.c.cfg.dial = func(string) bookieConn { return cutShort{} }
	for range 32 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, err := lh.Read(ctx, 0, 0)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("read cut short by its context: %v, want context.DeadlineExceeded", err)
		}
	}
}

// TestReadThatTimesOutIsErrTimeout: a read whose only replica never answers fails, after the
// transport's ReadTimeout, with ErrTimeout (and ErrBookieUnavailable: the bookie is the cause).
func TestReadThatTimesOutIsErrTimeout(t *testing.T) {
	bookie := silentBookie(t)
	lh, _ := offlineLedger(t, transport.Config{ReadTimeout: 200 * time.Millisecond}, bookie, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := lh.Read(ctx, 0, 0)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrBookieUnavailable) {
		t.Fatalf("Read from a bookie that never answers: %v, want ErrTimeout and ErrBookieUnavailable", err)
	}
}
