package server

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// Socket-level fuzzing (reliability item 21): FuzzServerConn sends arbitrary bytes on a real
// connection to a running server and checks the connection against a model of what the
// server owes (wireModel), while well-behaved connections keep adding and reading. The seed
// corpus runs in the normal suite; explore further with
//
//	go test -run '^$' -fuzz FuzzServerConn -fuzzminimizetime 5s ./net/server/
//
// (each execution is a real connection, so minimizing a new input for the default 60 s stalls
// the search).
// The codec itself is fuzzed in net/protocol; this covers what lies around it: framing across
// reads, the partial-frame buffers of both transports, the oversize discard, dispatch, closes.

// fuzzMaxFrame is the fuzzed server's MaxFrameSize: small, so that inputs of a few KiB reach
// past it and past the discard bound (maxDiscardFrames × fuzzMaxFrame), and gnet's read buffer
// (ReadBufferCap defaults to it) splits the larger ones across reads.
const fuzzMaxFrame = 4 << 10

// hostileWait bounds every wait on a hostile connection: for a response owed, or for the
// server to close.
const hostileWait = 10 * time.Second

// A fuzz input's mode byte says how its bytes are sent.
const (
	modeTLS       = 1 << 0 // on the TLS port (stdlib path), else the plaintext one (gnet)
	modeHalfClose = 1 << 1 // half-close right after the bytes, even when they end between frames
	// Bits 2–5, k: write the bytes in chunks of 2^(k-1) bytes; k = 0, in one write.
	modeChunkShift = 2
)

// owed is a response the server owes: to a request, or the EBADREQ or EBADVERSION answer to a
// frame it could not decode. anyRC: the request was valid and storage decides its code.
type owed struct {
	op                           protocol.OpCode
	version                      uint8
	ledgerID, entryID, requestID int64 // requestID: batch reads only
	rc                           protocol.ReturnCode
	anyRC                        bool
	sentinel                     bool // the read exchangeHostile sends after the input
}

// wireModel is what the server must do with a byte stream, as doc.go documents it: every
// complete frame that decodes as an add, read or batch read is answered once (with the
// request's version and ids); one that does not decode but whose ids were parsed is answered
// EBADREQ or EBADVERSION (protocol.ActionRespond); an add over the frame limit whose ids have
// arrived is answered EBADREQ and its bytes skipped, unless it announces more than
// maxDiscardFrames × the limit; anything else (a bad or oversize length, ActionClose, an AUTH
// with no provider) closes the connection. It decodes with the codec the server uses, which
// net/protocol fuzzes on its own.
type wireModel struct {
	owed   []owed
	closes bool // the server must close the connection by itself
	inStep bool // the bytes end between frames: a request sent after them is served
}

func modelStream(data []byte, maxFrame int) wireModel {
	var m wireModel
	var req protocol.Request
	for pos := 0; ; {
		rest := data[pos:]
		if len(rest) == 0 {
			m.inStep = true
			return m
		}
		if len(rest) < protocol.LengthPrefixSize {
			return m
		}
		length := int32(binary.BigEndian.Uint32(rest))
		if length < protocol.MinFrameLength {
			m.closes = true
			return m
		}
		size := int64(length) + protocol.LengthPrefixSize
		if size > int64(maxFrame) {
			if size > int64(maxFrame)*maxDiscardFrames {
				m.closes = true
				return m
			}
			if len(rest) < protocol.LengthPrefixSize+protocol.HeaderSize {
				return m
			}
			if protocol.ParseHeader(binary.BigEndian.Uint32(rest[protocol.LengthPrefixSize:])).Op != protocol.OpAddEntry {
				m.closes = true
				return m
			}
			if len(rest) < oversizeAddHead {
				return m
			}
			if err := protocol.DecodeRequest(rest[protocol.LengthPrefixSize:oversizeAddHead], &req); err != nil {
				m.closes = true
				return m
			}
			m.owed = append(m.owed, owed{op: protocol.OpAddEntry, version: req.Header.Version,
				ledgerID: req.Add.LedgerID, entryID: req.Add.EntryID, rc: protocol.EBADREQ})
			if pos += int(size); pos > len(data) { // the stream ends inside the skipped bytes
				return m
			}
			continue
		}
		if int64(len(rest)) < size {
			return m
		}
		err := protocol.DecodeRequest(rest[protocol.LengthPrefixSize:size], &req)
		if err != nil {
			de, ok := protocol.AsDecodeError(err)
			if !ok || de.Action != protocol.ActionRespond {
				m.closes = true
				return m
			}
			o := owed{op: de.Header.Op, version: de.Header.Version, ledgerID: de.LedgerID, entryID: de.EntryID, rc: de.Code}
			if o.op == protocol.OpBatchReadEntry {
				o.requestID = de.RequestID
			}
			m.owed = append(m.owed, o)
		} else {
			o := owed{op: req.Header.Op, version: req.Header.Version, anyRC: true}
			switch req.Header.Op {
			case protocol.OpAddEntry:
				o.ledgerID, o.entryID = req.Add.LedgerID, req.Add.EntryID
			case protocol.OpReadEntry:
				o.ledgerID, o.entryID = req.Read.LedgerID, req.Read.EntryID
			case protocol.OpBatchReadEntry:
				o.ledgerID, o.entryID, o.requestID = req.BatchRead.LedgerID, req.BatchRead.StartEntryID, req.BatchRead.RequestID
			default: // AUTH, and no provider is configured
				m.closes = true
				return m
			}
			m.owed = append(m.owed, o)
		}
		pos += int(size)
	}
}

// take removes the owed response that resp answers, or reports why there is none.
func take(owing []owed, resp *protocol.Response) (rest []owed, took owed, err error) {
	var o owed
	switch o.op, o.version = resp.Header.Op, resp.Header.Version; o.op {
	case protocol.OpAddEntry:
		o.ledgerID, o.entryID, o.rc = resp.Add.LedgerID, resp.Add.EntryID, resp.Add.RC
	case protocol.OpReadEntry:
		o.ledgerID, o.entryID, o.rc = resp.Read.LedgerID, resp.Read.EntryID, resp.Read.RC
	case protocol.OpBatchReadEntry:
		b := &resp.BatchRead
		o.ledgerID, o.entryID, o.requestID, o.rc = b.LedgerID, b.StartEntryID, b.RequestID, b.RC
	default:
		return owing, o, fmt.Errorf("a %v response, for no request", o.op)
	}
	for i, w := range owing {
		if w.op == o.op && w.version == o.version && w.ledgerID == o.ledgerID && w.entryID == o.entryID && w.requestID == o.requestID {
			if !w.anyRC && w.rc != o.rc {
				return owing, o, fmt.Errorf("%+v, want rc %v", o, w.rc)
			}
			return append(owing[:i], owing[i+1:]...), w, nil
		}
	}
	return owing, o, fmt.Errorf("%+v answers no request sent (owed: %+v)", o, owing)
}

// hostileOutcome is what a hostile connection saw: the codes of the responses to its input,
// in arrival order, and whether the server closed it.
type hostileOutcome struct {
	codes  []protocol.ReturnCode
	closed bool
}

// sentinelLedger is the ledger of the read sent after an input that ends in step.
const sentinelLedger = 0x5e471e1

// exchangeHostile sends data on a new connection as mode says and checks every response
// against the model: it answers a request sent (or the sentinel), with the code the model
// requires if any, and arrives at most once. How the exchange ends depends on the model:
//   - closes: the server must close the connection by itself (responses owed before the
//     closing frame may be lost with it, as in-flight adds are);
//   - in step, unless modeHalfClose: a read sent after the bytes must be answered, with
//     everything owed before it, on a connection still open;
//   - ends inside a frame: everything owed must be answered while the server waits for the
//     rest; then the client half-closes and the server must close, answering nothing more;
//   - in step with modeHalfClose: the client half-closes at once and the server must close.
func exchangeHostile(t *testing.T, env *testEnv, data []byte, mode uint8) hostileOutcome {
	t.Helper()
	m := modelStream(data, env.srv.cfg.MaxFrameSize)
	var nc net.Conn
	var err error
	if mode&modeTLS != 0 {
		nc, err = tls.DialWithDialer(&net.Dialer{Timeout: hostileWait}, "tcp", env.srv.TLSAddr().String(), env.tlsCli)
	} else {
		nc, err = net.DialTimeout("tcp", env.srv.Addr().String(), hostileWait)
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(hostileWait))

	owing := append([]owed(nil), m.owed...)
	sentinel := m.inStep && !m.closes && mode&modeHalfClose == 0
	halfCloseAtOnce := !m.closes && m.inStep && mode&modeHalfClose != 0
	var tail []byte // written after data
	if sentinel {
		r := protocol.ReadRequest{Header: protocol.Header{Version: protocol.CurrentVersion}, LedgerID: sentinelLedger, EntryID: int64(len(data))}
		tail = protocol.AppendReadRequest(nil, r)
		owing = append(owing, owed{op: protocol.OpReadEntry, version: protocol.CurrentVersion,
			ledgerID: r.LedgerID, entryID: r.EntryID, anyRC: true, sentinel: true})
	}
	chunk := len(data)
	if k := mode >> modeChunkShift & 0xf; k > 0 {
		chunk = 1 << (k - 1)
	}
	written := make(chan struct{})
	go func() { // write errors are the server closing, which the reader sees
		defer close(written)
		for rest := data; len(rest) > 0; {
			n := min(chunk, len(rest))
			if _, err := nc.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
		if len(tail) > 0 {
			if _, err := nc.Write(tail); err != nil {
				return
			}
		}
		if halfCloseAtOnce {
			_ = closeWrite(nc)
		}
	}()
	defer func() { _ = nc.Close(); <-written }()

	var out hostileOutcome
	halfClosed := halfCloseAtOnce
	br := bufio.NewReader(nc)
	for {
		if !m.closes && !halfClosed && len(owing) == 0 {
			if sentinel {
				return out // in step, and still open
			}
			<-written // the bytes end inside a frame: the server is waiting for the rest
			if err := closeWrite(nc); err != nil {
				t.Fatalf("half-close: %v", err)
			}
			halfClosed = true
		}
		resp, err := readResponse(br, env.srv.cfg.MaxFrameSize)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("model %+v, mode %#x: neither answered nor closed in %v; got %v, still owing %+v",
					m, mode, hostileWait, out.codes, owing)
			}
			// A frame cut short by the close (io.ErrUnexpectedEOF) counts as closed: a reset
			// can drop what the server wrote last.
			if !servertest.IsClosedErr(err) {
				t.Fatalf("model %+v, mode %#x: %v after %v", m, mode, err, out.codes)
			}
			if !m.closes && !halfClosed {
				t.Fatalf("model %+v, mode %#x: closed by the server, still owing %+v", m, mode, owing)
			}
			out.closed = true
			return out
		}
		var took owed
		if owing, took, err = take(owing, &resp); err != nil {
			t.Fatalf("model %+v, mode %#x: response %v", m, mode, err)
		}
		if !took.sentinel {
			out.codes = append(out.codes, responseRC(&resp))
		}
	}
}

// readResponse reads one response frame; a frame over maxFrame, or one that does not
// decode, is an error.
func readResponse(br *bufio.Reader, maxFrame int) (protocol.Response, error) {
	var resp protocol.Response
	var prefix [protocol.LengthPrefixSize]byte
	if _, err := io.ReadFull(br, prefix[:]); err != nil {
		return resp, err
	}
	size, _, err := protocol.SplitFrame(prefix[:], maxFrame)
	if err != nil {
		return resp, fmt.Errorf("response frame: %w", err)
	}
	frame := make([]byte, size-protocol.LengthPrefixSize)
	if _, err := io.ReadFull(br, frame); err != nil {
		return resp, err
	}
	if err := protocol.DecodeResponse(frame, &resp); err != nil {
		return resp, fmt.Errorf("response: %w", err)
	}
	return resp, nil
}

func responseRC(resp *protocol.Response) protocol.ReturnCode {
	switch resp.Header.Op {
	case protocol.OpAddEntry:
		return resp.Add.RC
	case protocol.OpReadEntry:
		return resp.Read.RC
	case protocol.OpBatchReadEntry:
		return resp.BatchRead.RC
	}
	return -1
}

// closeWrite half-closes a connection: TCP FIN, or TLS close_notify (which ends the server's
// reads as a FIN does).
func closeWrite(nc net.Conn) error {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("connection cannot half-close")
}

// goodKey is the well-behaved clients' master key; no seed carries it.
var goodKey = protocol.MasterKey([]byte("fuzz: well-behaved client"))

// goodClient adds entries to its own ledger and reads them back, checking the bytes.
type goodClient struct {
	c      *servertest.Client
	ledger int64
	next   int64
}

func goodEntry(ledger, id int64) []byte {
	return servertest.Entry(ledger, id, id-1, []byte(strings.Repeat(fmt.Sprintf("good %d/%d ", ledger, id), int(id%7)+1)))
}

// goodEntries bounds a good client's entry ids: they wrap around (an add of an entry again
// replaces it with the same bytes), so that a long fuzzing run does not grow storage.
const goodEntries = 1024

// roundTrip adds the next entry, reads it back, and reads an earlier one back.
func (g *goodClient) roundTrip() error {
	id := g.next % goodEntries
	g.next++
	e := goodEntry(g.ledger, id)
	if rc, err := g.c.Add(goodKey, e, 0); err != nil || rc != protocol.EOK {
		return fmt.Errorf("good add %d/%d: rc %v, %v", g.ledger, id, rc, err)
	}
	for _, r := range []int64{id, id / 2} {
		rc, got, err := g.c.Read(g.ledger, r)
		if err != nil || rc != protocol.EOK || string(got) != string(goodEntry(g.ledger, r)) {
			return fmt.Errorf("good read %d/%d: rc %v, %v, %d bytes", g.ledger, r, rc, err, len(got))
		}
	}
	return nil
}

// goodTraffic runs round trips on the clients until stop is closed (at least one each) and
// returns the first failure.
func goodTraffic(clients []*goodClient, stop <-chan struct{}) <-chan error {
	res := make(chan error, 1)
	go func() {
		for {
			for _, g := range clients {
				if err := g.roundTrip(); err != nil {
					res <- err
					return
				}
			}
			select {
			case <-stop:
				res <- nil
				return
			default:
			}
		}
	}()
	return res
}

// checkSettled waits (bounded) for the server to have forgotten the hostile connection: its
// count of connections back to before it, nothing in flight, no read bytes held.
func checkSettled(t *testing.T, env *testEnv, conns int64) {
	t.Helper()
	deadline := time.Now().Add(hostileWait)
	for {
		st := env.srv.Stats()
		if st.Connections == conns && st.AddsInFlight == 0 && st.ReadsInFlight == 0 && st.UnwrittenReadBytes == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not settled after a hostile connection: %+v, want %d connections", st, conns)
		}
		time.Sleep(time.Millisecond)
	}
}

func startFuzzEnv(t testing.TB) (*testEnv, []*goodClient) {
	env := startEnv(t, withTLS(), withConfig(func(c *Config) { c.MaxFrameSize = fuzzMaxFrame }))
	good := []*goodClient{{c: env.dial(t), ledger: 1<<40 + 1}, {c: env.dialTLS(t), ledger: 1<<40 + 2}}
	for _, g := range good { // served, so counted in Stats.Connections from now on
		if err := g.roundTrip(); err != nil {
			t.Fatal(err)
		}
	}
	return env, good
}

// hostileRun is one hostile exchange with good traffic around and during it.
func hostileRun(t *testing.T, env *testEnv, good []*goodClient, data []byte, mode uint8) hostileOutcome {
	t.Helper()
	conns := env.srv.Stats().Connections
	var out hostileOutcome
	var during error
	func() {
		stop := make(chan struct{})
		res := goodTraffic(good, stop)
		defer func() { close(stop); during = <-res }() // also when the exchange fails
		out = exchangeHostile(t, env, data, mode)
	}()
	if during != nil {
		t.Fatalf("well-behaved connection during the hostile one: %v", during)
	}
	checkSettled(t, env, conns)
	for _, g := range good {
		if err := g.roundTrip(); err != nil {
			t.Fatalf("well-behaved connection after the hostile one: %v", err)
		}
	}
	if st := env.srv.Stats(); st.Panics != 0 {
		t.Fatalf("%d panics recovered", st.Panics)
	}
	return out
}

// Seed frames. Ledger 7 is the hostile connection's own; hostileKey is not goodKey.
var hostileKey = protocol.MasterKey([]byte("hostile"))

func seedAdd(tb testing.TB, entryID int64, payload string) []byte {
	b, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: 2},
		MasterKey: hostileKey, Entry: servertest.Entry(7, entryID, entryID-1, []byte(payload))})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func seedRead(ledgerID, entryID int64, flags protocol.Flags) []byte {
	r := protocol.ReadRequest{Header: protocol.Header{Version: 2, Flags: flags}, LedgerID: ledgerID, EntryID: entryID}
	if flags.Has(protocol.FlagDoFencing) {
		r.MasterKey, r.HasMasterKey = hostileKey, true
	}
	return protocol.AppendReadRequest(nil, r)
}

// withLength returns frame with its length prefix replaced.
func withLength(frame []byte, length uint32) []byte {
	b := append([]byte(nil), frame...)
	binary.BigEndian.PutUint32(b, length)
	return b
}

func cat(frames ...[]byte) []byte {
	var b []byte
	for _, f := range frames {
		b = append(b, f...)
	}
	return b
}

// hostileCase is a named input with the outcome the protocol requires, written out by hand
// (independently of wireModel): the codes of the responses, in order, when they are all
// certain; and whether the server closes the connection (by itself, or after the client's
// half-close).
type hostileCase struct {
	name   string
	data   []byte
	mode   uint8
	codes  []protocol.ReturnCode // nil: not checked
	closed bool
}

func hostileCases(tb testing.TB) []hostileCase {
	rng := rand.New(rand.NewPCG(21, 22))
	noise := make([]byte, 256)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	noise[0] |= 0x80 // a negative length, as half of all noise has: the server must close
	add := seedAdd(tb, 0, "seed entry")
	read := seedRead(7, 0, 0)
	const over = fuzzMaxFrame * maxDiscardFrames // the largest frame the server discards
	big := seedAdd(tb, 1, strings.Repeat("x", 2*fuzzMaxFrame))
	atBound := withLength(seedAdd(tb, 2, ""), over-protocol.LengthPrefixSize)
	badVersion := seedRead(7, 0, 0)
	badVersion[4] = 9
	unknownOp := []byte{0, 0, 0, 8, 2, 0x63, 0, 0, 1, 2, 3, 4}
	auth, err := protocol.AppendAuthRequest(nil, protocol.AuthRequest{Header: protocol.Header{Version: 2},
		Message: protocol.AuthMessage{PluginName: []byte("plugin"), Payload: []byte("x")}})
	if err != nil {
		tb.Fatal(err)
	}
	shortAdd := cat([]byte{0, 0, 0, 4 + 20 + 16, 2, byte(protocol.OpAddEntry), 0, 0}, hostileKey[:],
		servertest.Entry(7, 5, 4, nil)[:16]) // its stored entry is 16 bytes: ids only
	batch := protocol.AppendBatchReadRequest(nil, protocol.BatchReadRequest{Header: protocol.Header{Version: 2},
		LedgerID: 7, StartEntryID: 0, RequestID: 9, MaxCount: 10, MaxSize: 1 << 20})
	ok, noEntry, badReq, badVer := protocol.EOK, protocol.ENOENTRY, protocol.EBADREQ, protocol.EBADVERSION
	noResponse := []protocol.ReturnCode{}
	return []hostileCase{
		{name: "valid add, read, last, batch read", data: cat(add, read, seedRead(7, -1, 0), batch)},
		{name: "fencing read of a new ledger", data: seedRead(8, -1, protocol.FlagDoFencing), codes: []protocol.ReturnCode{noEntry}},
		{name: "valid add in 1-byte writes", data: add, mode: 1 << modeChunkShift, codes: []protocol.ReturnCode{ok}},
		{name: "random bytes", data: noise, closed: true},
		{name: "valid add, then random bytes", data: cat(add, noise), closed: true},
		{name: "negative length", data: []byte{0xff, 0xff, 0xff, 0xfc, 2, 1, 0, 0}, codes: noResponse, closed: true},
		{name: "length below the header", data: []byte{0, 0, 0, 2, 2, 1}, codes: noResponse, closed: true},
		{name: "zero length", data: []byte{0, 0, 0, 0}, codes: noResponse, closed: true},
		{name: "length 2^31-1, prefix only", data: []byte{0x7f, 0xff, 0xff, 0xff}, codes: noResponse, closed: true},
		{name: "add of length 2^31-1", data: withLength(add, math.MaxInt32), codes: noResponse, closed: true},
		{name: "add just over the discard bound", data: withLength(add, over-protocol.LengthPrefixSize+1), codes: noResponse, closed: true},
		{name: "read over the frame limit", data: withLength(read, fuzzMaxFrame-protocol.LengthPrefixSize+1), codes: noResponse, closed: true},
		{name: "oversize add, then a read", data: cat(big, read), codes: []protocol.ReturnCode{badReq, ok}},
		{name: "oversize add in 64-byte writes, then an add", data: cat(big, add), mode: 7 << modeChunkShift,
			codes: []protocol.ReturnCode{badReq, ok}},
		{name: "add at the discard bound, truncated, half-closed", data: atBound, codes: []protocol.ReturnCode{badReq}, closed: true},
		{name: "unknown opcode", data: unknownOp, codes: noResponse, closed: true},
		{name: "AUTH without a provider", data: auth, codes: noResponse, closed: true},
		{name: "bad version", data: cat(badVersion, read), codes: []protocol.ReturnCode{badVer, ok}},
		{name: "add with a short entry", data: cat(shortAdd, read), codes: []protocol.ReturnCode{badReq, ok}},
		{name: "read of negative ids", data: seedRead(-5, -7, 0), codes: []protocol.ReturnCode{badReq}},
		{name: "half-open: prefix cut", data: add[:2], codes: noResponse, closed: true},
		{name: "half-open: header cut", data: add[:6], codes: noResponse, closed: true},
		{name: "half-open: add cut mid-entry", data: cat(read, add[:len(add)-3]), codes: []protocol.ReturnCode{ok}, closed: true},
		{name: "half-closed between frames", data: cat(read, read), mode: modeHalfClose, closed: true},
	}
}

// TestHostileConnections runs the named hostile inputs over both transports and checks the
// outcome written out for each, besides wireModel's checks (exchangeHostile) and the
// well-behaved connections' (hostileRun).
func TestHostileConnections(t *testing.T) {
	env, good := startFuzzEnv(t)
	for _, tc := range hostileCases(t) {
		for _, transport := range []uint8{0, modeTLS} {
			mode := tc.mode | transport
			name := tc.name + map[uint8]string{0: "/gnet", modeTLS: "/tls"}[transport]
			t.Run(name, func(t *testing.T) {
				out := hostileRun(t, env, good, tc.data, mode)
				if out.closed != tc.closed {
					t.Errorf("closed %v, want %v", out.closed, tc.closed)
				}
				if tc.codes != nil && fmt.Sprint(out.codes) != fmt.Sprint(tc.codes) {
					t.Errorf("codes %v, want %v", out.codes, tc.codes)
				}
			})
		}
	}
}

func FuzzServerConn(f *testing.F) {
	for _, tc := range hostileCases(f) {
		f.Add(tc.data, tc.mode)
		f.Add(tc.data, tc.mode^modeTLS|3<<modeChunkShift) // the other transport, in 4-byte writes
	}
	env, good := startFuzzEnv(f)
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		hostileRun(t, env, good, data, mode)
	})
}

// TestHostileAllocationsBounded (reliability item 21): whatever a connection announces or
// sends, the process allocates for it at most one frame (MaxFrameSize) more than for a
// well-behaved connection that sends one frame of the maximum size (which costs the TLS
// record buffers and the one frame the server may buffer). Each hostile connection sends 8 to
// 16 times the frame limit: lengths of 2³¹−1 or over the limit (closed at the header), an add
// at the discard bound (answered and discarded as it arrives, never buffered), and a frame at
// the limit cut short and half-closed (buffered, at most one frame). A server that buffered
// what it was sent, or sized a buffer by the length announced, would pass the bound several
// times over.
func TestHostileAllocationsBounded(t *testing.T) {
	const limit = 64 << 10
	env := startEnv(t, withTLS(), withConfig(func(c *Config) { c.MaxFrameSize = limit }))
	g := &goodClient{c: env.dial(t), ledger: 1}
	if err := g.roundTrip(); err != nil { // ledger 1 now has goodKey
		t.Fatal(err)
	}
	payload := make([]byte, 16*limit)
	add := seedAdd(t, 0, "")
	hostile := [][]byte{
		cat(withLength(add, math.MaxInt32), payload),
		cat(withLength(seedRead(7, 0, 0), limit-protocol.LengthPrefixSize+1), payload),
		cat(withLength(add, limit*maxDiscardFrames-protocol.LengthPrefixSize), payload[:limit*maxDiscardFrames-len(add)]),
		cat(withLength(add, limit-protocol.LengthPrefixSize), payload[:limit/2]),
	}
	// A valid add of the maximum size, refused (EUA: ledger 1 is not hostileKey's), so that
	// storage does not copy it.
	maxAdd, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: 2}, MasterKey: hostileKey,
		Entry: servertest.Entry(1, 1000, 999, payload[:limit-len(add)])})
	if err != nil || len(maxAdd) != limit {
		t.Fatalf("a %d-byte add, %v", len(maxAdd), err)
	}
	const rounds = 4
	conns := uint64(rounds * len(hostile) * 2)
	// run sends each of n inputs on a connection of each transport, rounds times, with a
	// good round trip after each, and returns the bytes the process allocated meanwhile.
	run := func(n int, input func(i int) []byte) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for r := range rounds {
			for i := range n {
				for _, mode := range []uint8{0, modeTLS} {
					exchangeHostile(t, env, input(i), mode)
					if err := g.roundTrip(); err != nil {
						t.Fatalf("round %d, input %d, mode %#x: %v", r, i, mode, err)
					}
				}
			}
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	wellBehaved := run(len(hostile), func(int) []byte { return maxAdd })
	before := env.srv.Stats()
	allocated := run(len(hostile), func(i int) []byte { return hostile[i] })
	st := env.srv.Stats()
	if bound := wellBehaved + conns*limit; allocated > bound {
		t.Errorf("%d hostile connections allocated %d bytes; well-behaved ones %d, bound %d (one %d-byte frame each more)",
			conns, allocated, wellBehaved, bound, limit)
	}
	t.Logf("%d connections: hostile %d bytes allocated, well-behaved %d", conns, allocated, wellBehaved)
	// The server's counters: two of the inputs close, one is answered EBADREQ, the last is
	// closed after the client's half-close; nothing is left behind.
	if got, want := st.ProtocolCloses-before.ProtocolCloses, int64(conns/2); got != want {
		t.Errorf("protocol closes %d, want %d", got, want)
	}
	if got, want := st.BadRequests-before.BadRequests, int64(conns/4); got != want {
		t.Errorf("bad requests %d, want %d", got, want)
	}
	checkSettled(t, env, 1)
}
