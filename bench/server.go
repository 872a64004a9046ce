package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// ServerOptions configures the raw-codec workload: connections that speak the v2 protocol
// straight from net/protocol (no client library, no digest, no metadata) and pipeline adds to
// one bookie. It measures the bookie, with as little load-generator CPU per add as possible:
// each connection writes a batch of frames per write(2) and reads a batch of responses per
// read(2).
type ServerOptions struct {
	// Bookie is the address of a running bookie; with Standalone a one-bookie cluster is
	// started in this process instead.
	Bookie     string
	Standalone bool
	DataDir    string

	Connections int
	// InFlight is the number of adds each connection keeps outstanding.
	InFlight  int
	EntrySize int
	// Rate is the total adds per second (open loop); 0 means closed loop. Open-loop adds are
	// sent by one pacer every PaceInterval and their latency counts from their scheduled time,
	// so a bookie that falls behind is not hidden by adds that were never sent.
	Rate float64
	// PaceInterval is how often the open-loop pacer sends the adds that have come due. Latency
	// is measured from each add's own scheduled time, so the batching adds up to this much to
	// it; a longer interval means fewer, larger writes (less load-generator CPU per add).
	PaceInterval time.Duration
	Duration     time.Duration
	Warmup       time.Duration
	Progress     io.Writer
}

// DefaultServerOptions returns the defaults of `ringkeeper bench server`.
func DefaultServerOptions() ServerOptions {
	return ServerOptions{Connections: 64, InFlight: 64, EntrySize: 1024, PaceInterval: 500 * time.Microsecond, Duration: 10 * time.Second}
}

func (o ServerOptions) config() map[string]any {
	return map[string]any{
		"bookie": o.Bookie, "standalone": o.Standalone, "connections": o.Connections, "in_flight": o.InFlight,
		"entry_size": o.EntrySize, "rate": o.Rate, "pace_interval_us": o.PaceInterval.Microseconds(),
		"duration_s": o.Duration.Seconds(), "warmup_s": o.Warmup.Seconds(),
	}
}

// RunServer runs the raw-codec workload.
func RunServer(ctx context.Context, o ServerOptions) (*Result, error) {
	if o.Connections < 1 || o.InFlight < 1 || o.EntrySize < 0 || o.Duration <= 0 || !(o.Rate >= 0) || o.PaceInterval <= 0 {
		return nil, fmt.Errorf("bench: connections (%d), in-flight (%d), duration and pace interval must be positive, entry size and rate not negative",
			o.Connections, o.InFlight)
	}
	if (o.Bookie == "") == !o.Standalone {
		return nil, errors.New("bench: give exactly one of --bookie ADDR and --standalone")
	}
	addr := o.Bookie
	if o.Standalone {
		t := Target{Standalone: true, Bookies: 1, DataDir: o.DataDir}
		c, err := t.startCluster(ctx)
		if err != nil {
			return nil, err
		}
		defer c.cleanup()
		addr = c.cluster.BookieAddrs()[0]
	}
	rec := NewRecorder()
	// Ledger ids unique to this run, so that runs against the same bookie never overwrite.
	base := int64(rand.Uint32()) << 20
	conns := make([]*rawConn, o.Connections)
	for i := range conns {
		rc, err := dialRaw(ctx, addr, base+int64(i), o, rec)
		if err != nil {
			for _, c := range conns[:i] {
				c.nc.Close()
			}
			return nil, err
		}
		conns[i] = rc
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Go(func() { errs[i] = c.readLoop(runCtx) })
	}
	var sendErr error
	if o.Rate > 0 {
		wg.Go(func() { pace(runCtx, conns, o.Rate, o.PaceInterval) })
	} else {
		for _, c := range conns {
			if sendErr = c.send(o.InFlight, monotime.Now(), 0); sendErr != nil {
				cancel()
				break
			}
		}
	}
	rec.Measure(runCtx, o.Warmup, o.Duration, o.Progress)
	cancel()
	wg.Wait()
	if sendErr != nil {
		return nil, fmt.Errorf("bench: sending the first adds: %w", sendErr)
	}
	var sent, acked int64
	for i, c := range conns {
		sent += c.sent.Load()
		acked += c.acked.Load()
		if errs[i] != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("bench: connection %d: %w", i, errs[i])
		}
	}
	r := rec.Result("server", o.config())
	r.Extra = map[string]float64{"sent": float64(sent), "acked": float64(acked)}
	return r, nil
}

// rawConn is one connection of the raw workload: one ledger, entries 0, 1, 2, ... Send times
// are kept per in-flight slot (entry id mod InFlight), which is unique among the adds in flight.
type rawConn struct {
	nc  net.Conn
	o   ServerOptions
	rec *Recorder
	// frame is an add of entry 0; send patches the entry id into copies of it.
	frame  []byte
	wbuf   []byte
	sentAt []atomic.Int64
	// sent and acked count adds; sent-acked is what is in flight. sent is written only by the
	// sending goroutine (the reader in closed loop, the pacer in open loop).
	sent, acked atomic.Int64
}

// addEntryIDOffset is where the entry id sits in an add frame: length prefix, header, master
// key, then the stored entry's ledger id.
const addEntryIDOffset = protocol.LengthPrefixSize + protocol.HeaderSize + protocol.MasterKeyLength + 8

// addResponseSize is the size of a v2 add response, length prefix included.
const addResponseSize = protocol.LengthPrefixSize + protocol.ResponseHeaderSize

func dialRaw(ctx context.Context, addr string, ledgerID int64, o ServerOptions, rec *Recorder) (*rawConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	payload := make([]byte, o.EntrySize)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	entry := protocol.AppendEntryHeader(nil, protocol.EntryHeader{LedgerID: ledgerID, LastAddConfirmed: -1, Length: int64(o.EntrySize)})
	frame, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: protocol.CurrentVersion},
		MasterKey: protocol.MasterKey(benchPassword), Entry: append(entry, payload...)})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &rawConn{nc: nc, o: o, rec: rec, frame: frame,
		wbuf: make([]byte, 0, o.InFlight*len(frame)), sentAt: make([]atomic.Int64, o.InFlight)}, nil
}

// send writes n adds in one write; the i-th counts as sent at start+i*step.
func (c *rawConn) send(n int, start, step int64) error {
	b := c.wbuf[:0]
	first := c.sent.Load()
	for i := range int64(n) {
		entry := first + i
		at := len(b)
		b = append(b, c.frame...)
		binary.BigEndian.PutUint64(b[at+addEntryIDOffset:], uint64(entry))
		c.sentAt[entry%int64(len(c.sentAt))].Store(start + i*step)
	}
	c.sent.Store(first + int64(n))
	_, err := c.nc.Write(b)
	return err
}

// readLoop reads responses until ctx ends and every add sent has been answered (or the
// connection fails), recording each add's latency; in closed loop it sends one add for each
// response.
func (c *rawConn) readLoop(ctx context.Context) error {
	defer c.nc.Close()
	stop := context.AfterFunc(ctx, func() { c.nc.SetReadDeadline(time.Now().Add(5 * time.Second)) })
	defer stop()
	buf := make([]byte, 64<<10)
	lat := make([]int64, 0, len(buf)/addResponseSize)
	var resp protocol.Response
	have := 0
	for {
		if ctx.Err() != nil && c.acked.Load() == c.sent.Load() {
			return nil
		}
		n, err := c.nc.Read(buf[have:])
		if err != nil {
			if ctx.Err() != nil {
				return nil // the adds still in flight when the run ended are not counted
			}
			return err
		}
		have += n
		now := monotime.Now()
		lat = lat[:0]
		off := 0
		for {
			size, complete, err := protocol.SplitFrame(buf[off:have], addResponseSize)
			if err != nil {
				return err
			}
			if !complete {
				break
			}
			if err := protocol.DecodeResponse(buf[off+protocol.LengthPrefixSize:off+size], &resp); err != nil {
				return err
			}
			if resp.Header.Op != protocol.OpAddEntry {
				return fmt.Errorf("unexpected %v response", resp.Header.Op)
			}
			if resp.Add.RC != protocol.EOK {
				return fmt.Errorf("add answered %v", resp.Add.RC)
			}
			lat = append(lat, now-c.sentAt[resp.Add.EntryID%int64(len(c.sentAt))].Load())
			off += size
		}
		have = copy(buf, buf[off:have])
		c.rec.RecordBatch(lat, c.o.EntrySize)
		c.acked.Add(int64(len(lat)))
		if c.o.Rate == 0 && len(lat) > 0 && ctx.Err() == nil {
			if err := c.send(len(lat), now, 0); err != nil {
				return err
			}
		}
	}
}

// pace is the open loop: every interval it sends each connection the adds that have come
// due (its share of rate), as far as its in-flight limit allows; the others stay due.
func pace(ctx context.Context, conns []*rawConn, rate float64, interval time.Duration) {
	step := max(1, int64(float64(time.Second)*float64(len(conns))/rate)) // per connection, ns
	start := monotime.Now()
	for ctx.Err() == nil {
		now := monotime.Now()
		for i, c := range conns {
			// Connections are staggered by i*step/len so the whole load is evenly spread.
			offset := start + int64(i)*step/int64(len(conns))
			if now < offset {
				continue
			}
			due := (now-offset)/step + 1
			sent := c.sent.Load()
			n := min(due-sent, int64(c.o.InFlight)-(sent-c.acked.Load()))
			if n > 0 && c.send(int(n), offset+sent*step, step) != nil {
				return // the reader reports the connection's error
			}
		}
		time.Sleep(interval - time.Duration(monotime.Now()-now)%interval)
	}
}
