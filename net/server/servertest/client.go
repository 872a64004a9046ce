// Package servertest holds test helpers for the bookie's network server: a minimal blocking
// BookKeeper v2 client built on net.Conn and the net/protocol codec, MemStorage, an in-memory
// Storage, and CA, a throwaway certificate authority for TLS tests. Later packages reuse them
// for end-to-end tests against the real engine.
package servertest

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// DefaultTimeout bounds each round trip of a Client (Client.Timeout overrides it).
const DefaultTimeout = 10 * time.Second

// ErrUnexpected is returned by a round trip whose response does not answer its request.
var ErrUnexpected = errors.New("servertest: unexpected response")

// Client is a minimal blocking v2 client: Send* methods buffer requests (call Flush), Recv
// reads one response, and the round-trip methods (Add, Read, ...) do both and check that the
// response answers the request. It is not safe for concurrent use, except that one goroutine
// may send while another receives.
type Client struct {
	// Timeout bounds each round trip and each Recv; 0 means DefaultTimeout, negative none.
	Timeout time.Duration
	// MaxFrameSize bounds the responses Recv accepts; 0 means protocol.DefaultMaxFrameSize.
	MaxFrameSize int

	nc  net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
	buf []byte
}

// Dial connects to a server's plaintext address.
func Dial(addr string) (*Client, error) {
	nc, err := net.DialTimeout("tcp", addr, DefaultTimeout)
	if err != nil {
		return nil, err
	}
	return NewClient(nc), nil
}

// DialTLS connects to a server's TLS address and completes the handshake.
func DialTLS(addr string, cfg *tls.Config) (*Client, error) {
	d := &net.Dialer{Timeout: DefaultTimeout}
	nc, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	return NewClient(nc), nil
}

// NewClient wraps an established connection.
func NewClient(nc net.Conn) *Client {
	return &Client{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10)}
}

// Conn returns the underlying connection.
func (c *Client) Conn() net.Conn { return c.nc }

// Close closes the connection.
func (c *Client) Close() error { return c.nc.Close() }

func (c *Client) timeout() time.Duration {
	if c.Timeout == 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

func (c *Client) setDeadline() {
	if t := c.timeout(); t > 0 {
		_ = c.nc.SetDeadline(time.Now().Add(t))
	}
}

// SendAdd buffers an add request.
func (c *Client) SendAdd(key [protocol.MasterKeyLength]byte, entry []byte, flags protocol.Flags) error {
	b, err := protocol.AppendAddRequest(c.buf[:0], protocol.AddRequest{
		Header: protocol.Header{Version: protocol.CurrentVersion, Flags: flags}, MasterKey: key, Entry: entry})
	if err != nil {
		return err
	}
	c.buf = b
	_, err = c.bw.Write(b)
	return err
}

// SendRead buffers a read request; key is sent when non-nil (a fencing read needs it).
func (c *Client) SendRead(ledgerID, entryID int64, flags protocol.Flags, key *[protocol.MasterKeyLength]byte) error {
	r := protocol.ReadRequest{Header: protocol.Header{Version: protocol.CurrentVersion, Flags: flags},
		LedgerID: ledgerID, EntryID: entryID}
	if key != nil {
		r.MasterKey, r.HasMasterKey = *key, true
	}
	c.buf = protocol.AppendReadRequest(c.buf[:0], r)
	_, err := c.bw.Write(c.buf)
	return err
}

// SendBatchRead buffers a batch read request (its Header.Version defaults to the current one).
func (c *Client) SendBatchRead(r protocol.BatchReadRequest) error {
	if r.Header.Version == 0 {
		r.Header.Version = protocol.CurrentVersion
	}
	c.buf = protocol.AppendBatchReadRequest(c.buf[:0], r)
	_, err := c.bw.Write(c.buf)
	return err
}

// SendAuth buffers an AUTH request.
func (c *Client) SendAuth(plugin string, payload []byte) error {
	b, err := protocol.AppendAuthRequest(c.buf[:0], protocol.AuthRequest{
		Header:  protocol.Header{Version: protocol.CurrentVersion},
		Message: protocol.AuthMessage{PluginName: []byte(plugin), Payload: payload}})
	if err != nil {
		return err
	}
	c.buf = b
	_, err = c.bw.Write(b)
	return err
}

// SendRaw buffers arbitrary bytes (for malformed-input tests).
func (c *Client) SendRaw(b []byte) error {
	_, err := c.bw.Write(b)
	return err
}

// Flush writes the buffered requests.
func (c *Client) Flush() error {
	if t := c.timeout(); t > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(t))
	}
	return c.bw.Flush()
}

// Recv reads one response frame and decodes it. The returned slices belong to the caller (each
// frame is read into a fresh buffer).
func (c *Client) Recv() (protocol.Response, error) {
	var resp protocol.Response
	if t := c.timeout(); t > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(t))
	}
	var prefix [protocol.LengthPrefixSize]byte
	if _, err := io.ReadFull(c.br, prefix[:]); err != nil {
		return resp, err
	}
	size, _, err := protocol.SplitFrame(prefix[:], c.MaxFrameSize)
	if err != nil {
		return resp, err
	}
	frame := make([]byte, size-protocol.LengthPrefixSize)
	if _, err := io.ReadFull(c.br, frame); err != nil {
		return resp, err
	}
	err = protocol.DecodeResponse(frame, &resp)
	return resp, err
}

// RecvInto reads one response frame into buf (grown as needed) without decoding it and
// returns the frame (after the length prefix); it allocates only to grow buf. Benchmarks use
// it.
func (c *Client) RecvInto(buf []byte) ([]byte, error) {
	var prefix [protocol.LengthPrefixSize]byte
	if _, err := io.ReadFull(c.br, prefix[:]); err != nil {
		return buf, err
	}
	size, _, err := protocol.SplitFrame(prefix[:], c.MaxFrameSize)
	if err != nil {
		return buf, err
	}
	n := size - protocol.LengthPrefixSize
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err = io.ReadFull(c.br, buf)
	return buf, err
}

func (c *Client) roundTrip(op protocol.OpCode) (protocol.Response, error) {
	if err := c.Flush(); err != nil {
		return protocol.Response{}, err
	}
	c.setDeadline()
	resp, err := c.Recv()
	if err != nil {
		return resp, err
	}
	if resp.Header.Op != op {
		return resp, fmt.Errorf("%w: %v answers %v", ErrUnexpected, resp.Header.Op, op)
	}
	return resp, nil
}

// Add sends one add and waits for its response.
func (c *Client) Add(key [protocol.MasterKeyLength]byte, entry []byte, flags protocol.Flags) (protocol.ReturnCode, error) {
	if err := c.SendAdd(key, entry, flags); err != nil {
		return 0, err
	}
	resp, err := c.roundTrip(protocol.OpAddEntry)
	if err != nil {
		return 0, err
	}
	ledgerID, entryID := EntryIDs(entry)
	if resp.Add.LedgerID != ledgerID || resp.Add.EntryID != entryID {
		return resp.Add.RC, fmt.Errorf("%w: add response for %d/%d, sent %d/%d",
			ErrUnexpected, resp.Add.LedgerID, resp.Add.EntryID, ledgerID, entryID)
	}
	return resp.Add.RC, nil
}

// Read reads one entry (entryID -1: the last entry) and returns the rc and the stored entry.
func (c *Client) Read(ledgerID, entryID int64) (protocol.ReturnCode, []byte, error) {
	return c.read(ledgerID, entryID, protocol.FlagNone, nil)
}

// FencingRead fences the ledger and reads entryID (BookKeeper's recovery sends -1).
func (c *Client) FencingRead(ledgerID, entryID int64, key [protocol.MasterKeyLength]byte) (protocol.ReturnCode, []byte, error) {
	return c.read(ledgerID, entryID, protocol.FlagDoFencing, &key)
}

func (c *Client) read(ledgerID, entryID int64, flags protocol.Flags, key *[protocol.MasterKeyLength]byte) (protocol.ReturnCode, []byte, error) {
	if err := c.SendRead(ledgerID, entryID, flags, key); err != nil {
		return 0, nil, err
	}
	resp, err := c.roundTrip(protocol.OpReadEntry)
	if err != nil {
		return 0, nil, err
	}
	if resp.Read.LedgerID != ledgerID || resp.Read.EntryID != entryID {
		return resp.Read.RC, nil, fmt.Errorf("%w: read response for %d/%d, sent %d/%d",
			ErrUnexpected, resp.Read.LedgerID, resp.Read.EntryID, ledgerID, entryID)
	}
	return resp.Read.RC, resp.Read.Entry, nil
}

// BatchRead sends a batch read and returns its response; iterate the entries with
// resp.Entries().
func (c *Client) BatchRead(r protocol.BatchReadRequest) (protocol.BatchReadResponse, error) {
	if err := c.SendBatchRead(r); err != nil {
		return protocol.BatchReadResponse{}, err
	}
	resp, err := c.roundTrip(protocol.OpBatchReadEntry)
	if err != nil {
		return resp.BatchRead, err
	}
	if resp.BatchRead.RequestID != r.RequestID {
		return resp.BatchRead, fmt.Errorf("%w: batch read response for request %d, sent %d",
			ErrUnexpected, resp.BatchRead.RequestID, r.RequestID)
	}
	return resp.BatchRead, nil
}

// Auth sends one AUTH message and returns the server's answer payload.
func (c *Client) Auth(plugin string, payload []byte) ([]byte, error) {
	if err := c.SendAuth(plugin, payload); err != nil {
		return nil, err
	}
	resp, err := c.roundTrip(protocol.OpAuth)
	if err != nil {
		return nil, err
	}
	if string(resp.Auth.Message.PluginName) != plugin {
		return nil, fmt.Errorf("%w: auth answer from plugin %q, sent %q", ErrUnexpected, resp.Auth.Message.PluginName, plugin)
	}
	return resp.Auth.Message.Payload, nil
}

// ExpectClosed reads until the server closes the connection, discarding responses, and
// reports an error if that does not happen within d.
func (c *Client) ExpectClosed(d time.Duration) error {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	var buf [4096]byte
	for {
		_, err := c.nc.Read(buf[:])
		if err == nil {
			continue
		}
		if IsClosedErr(err) {
			return nil
		}
		return fmt.Errorf("servertest: connection not closed by the server: %w", err)
	}
}

// IsClosedErr reports whether err means the peer closed or reset the connection.
func IsClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// Entry builds a stored entry with the DUMMY digest (none): the 32-byte header, then the
// payload. The header's length field is len(payload).
func Entry(ledgerID, entryID, lac int64, payload []byte) []byte {
	b := protocol.AppendEntryHeader(make([]byte, 0, protocol.StoredEntryHeaderSize+len(payload)),
		protocol.EntryHeader{LedgerID: ledgerID, EntryID: entryID, LastAddConfirmed: lac, Length: int64(len(payload))})
	return append(b, payload...)
}

// EntryIDs returns the ledger and entry ids at the start of a stored entry (zero if it is
// shorter than 16 bytes).
func EntryIDs(entry []byte) (ledgerID, entryID int64) {
	if len(entry) < 16 {
		return 0, 0
	}
	return int64(binary.BigEndian.Uint64(entry)), int64(binary.BigEndian.Uint64(entry[8:]))
}
