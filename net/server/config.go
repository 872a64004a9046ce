package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// Errors of the server package.
var (
	// ErrBadConfig: Config.Validate failed.
	ErrBadConfig = errors.New("server: bad config")
	// ErrState: Start or Stop called in the wrong state (Start twice, Start after Stop).
	ErrState = errors.New("server: wrong state")
)

// Defaults. Names in parentheses are BookKeeper's configuration keys.
const (
	// DefaultAddr is the plaintext listen address (bookiePort 3181).
	DefaultAddr = ":3181"
	// DefaultMaxFrameSize is nettyMaxFrameSizeBytes: 5 MiB, length prefix included.
	DefaultMaxFrameSize = protocol.DefaultMaxFrameSize
	// DefaultNumReadWorkerThreads is numReadWorkerThreads.
	DefaultNumReadWorkerThreads = 8
	// DefaultReadWorkerQueueSize bounds the read worker pool's queue.
	DefaultReadWorkerQueueSize = 10000
	// DefaultMaxPendingRequestsPerConnection is maxPendingAddRequestsPerThread and
	// maxPendingReadRequestsPerThread (applied per connection here).
	DefaultMaxPendingRequestsPerConnection = 10000
	// DefaultMaxOutboundBytesPerConnection is the queued response bytes above which a
	// connection's requests are no longer decoded.
	DefaultMaxOutboundBytesPerConnection = 16 << 20
	// DefaultMaxUnwrittenReadBytes bounds the read response bytes the server holds, not yet
	// taken by a socket, over all connections (maxUnwrittenReadBytes, a ringkeeper key).
	DefaultMaxUnwrittenReadBytes = 128 << 20
	// DefaultMaxInboundBytesPerConnection is the unprocessed request bytes above which a
	// connection whose decoding is paused is closed.
	DefaultMaxInboundBytesPerConnection = 16 << 20
	// DefaultTLSHandshakeTimeout bounds a TLS handshake.
	DefaultTLSHandshakeTimeout = 10 * time.Second
	// DefaultResumeInterval is how often paused connections are re-examined.
	DefaultResumeInterval = 5 * time.Millisecond
	// MinMaxFrameSize is the smallest MaxFrameSize Validate takes: room for an add.
	MinMaxFrameSize = protocol.LengthPrefixSize + protocol.ResponseHeaderSize + protocol.StoredEntryHeaderSize + protocol.MasterKeyLength
)

// Config configures a Server. The zero value of every field means its default (EnsureDefaults);
// limits documented as "0 = unlimited" have no other default.
type Config struct {
	// Addr is the plaintext (gnet) listen address, host:port (bookiePort). Port 0 picks a free
	// port; Server.Addr reports it. Default DefaultAddr.
	Addr string
	// TLSAddr is the TLS listen address (tlsPort), served by crypto/tls on the stdlib net path
	// with the same protocol handling. Empty disables TLS. Port 0 picks a free port.
	TLSAddr string
	// TLSConfig is the server's TLS configuration (certificate, and ClientAuth/ClientCAs for
	// client certificates); required when TLSAddr is set. LoadTLSConfig builds one from files.
	// A client whose certificate it refuses (expired or not yet valid, not chaining to
	// ClientCAs, missing where required) fails the handshake: the connection is closed with a
	// TLS alert naming the cause before any request on it is read (over TLS 1.3 the client
	// may already have sent some), and the failure is logged at Info level with its cause.
	TLSConfig *tls.Config
	// TLSHandshakeTimeout bounds each TLS handshake. Default DefaultTLSHandshakeTimeout.
	TLSHandshakeTimeout time.Duration

	// NumEventLoops is the number of gnet event loops (serverNumIOThreads). Default
	// runtime.NumCPU().
	NumEventLoops int
	// ReusePort gives each event loop its own SO_REUSEPORT listener (Linux balances accepted
	// connections across them) instead of one acceptor loop.
	ReusePort bool
	// ReadBufferCap is gnet's per-event-loop read buffer (one read syscall takes at most this
	// much); gnet rounds it up to a power of two. Default MaxFrameSize, so that a whole
	// maximum-size frame is read in one call and decoded in place.
	ReadBufferCap int
	// SocketSendBufferBytes and SocketRecvBufferBytes set SO_SNDBUF and SO_RCVBUF on accepted
	// connections (0 = the kernel's default, which autotunes).
	SocketSendBufferBytes int
	SocketRecvBufferBytes int
	// MaxFrameSize is nettyMaxFrameSizeBytes: a frame whose size (length prefix included) is
	// larger is never buffered: an add of at most 8 × MaxFrameSize is answered EBADREQ and its
	// bytes discarded, anything else closes the connection. Default DefaultMaxFrameSize.
	MaxFrameSize int

	// NumReadWorkerThreads is the number of read worker goroutines (numReadWorkerThreads).
	NumReadWorkerThreads int
	// ReadWorkerQueueSize bounds the read workers' queue; a read or batch read that finds it
	// full is answered ETOOMANYREQUESTS. Default DefaultReadWorkerQueueSize.
	ReadWorkerQueueSize int
	// MaxPendingAddRequestsPerThread limits one connection's adds in flight
	// (maxPendingAddRequestsPerThread; BookKeeper applies it per worker thread, an event-loop
	// server per connection). Over it an add is answered ETOOMANYREQUESTS at once.
	MaxPendingAddRequestsPerThread int
	// MaxPendingReadRequestsPerThread limits one connection's reads in the worker pool
	// (maxPendingReadRequestsPerThread), likewise.
	MaxPendingReadRequestsPerThread int
	// MaxAddsInProgressLimit limits adds in flight over all connections
	// (maxAddsInProgressLimit); 0 = unlimited. Over it an add gets ETOOMANYREQUESTS.
	MaxAddsInProgressLimit int
	// MaxReadsInProgressLimit limits reads in the worker pool over all connections
	// (maxReadsInProgressLimit); 0 = unlimited. A read counts until its response is queued
	// (BookKeeper's until it is written): the memory of responses queued and not yet sent is
	// bounded by MaxUnwrittenReadBytes instead.
	MaxReadsInProgressLimit int
	// MaxOutboundBytesPerConnection: while a connection has more response bytes queued than
	// this (ours plus gnet's outbound buffer), its requests are not decoded, and a pool read
	// for it is answered ETOOMANYREQUESTS instead of being read; so is a pool read whose
	// response would take the connection past it (unless the connection has nothing queued).
	MaxOutboundBytesPerConnection int
	// MaxUnwrittenReadBytes bounds the memory of read responses over all connections: the
	// bytes of responses read (by the workers, or from the cache on the reader) and not yet
	// taken by a socket, whether queued or in gnet's outbound buffer. A read that finds no room
	// is answered ETOOMANYREQUESTS, as over MaxReadsInProgressLimit. A connection whose
	// transport holds read bytes its socket has not taken (a slow reader) gets only half of it,
	// so that slow readers cannot take it all from clients that keep up. Its key is
	// maxUnwrittenReadBytes (ringkeeper's; BookKeeper has none). A response larger than the
	// allowance still goes out when no other read bytes are held. Default
	// DefaultMaxUnwrittenReadBytes, or MaxFrameSize if larger.
	MaxUnwrittenReadBytes int
	// MaxInboundBytesPerConnection: a plaintext connection whose unprocessed request bytes
	// exceed this (which happens only while its decoding is paused, gnet having no read-side
	// backpressure) is closed. It must be at least MaxFrameSize.
	MaxInboundBytesPerConnection int
	// ResumeInterval is how often connections paused by MaxOutboundBytesPerConnection are
	// woken to re-examine their outbound buffer. Default DefaultResumeInterval.
	ResumeInterval time.Duration

	// Auth, when set, requires every connection to authenticate with this provider before
	// adds and reads (BookKeeper's bookieAuthProviderFactoryClass).
	Auth AuthProvider
	// AuthorizeCertificate, if set, decides after each TLS handshake whether the client's
	// certificate (nil without one) may use the bookie: an error makes the connection answer
	// every add and read EUA (and close on AUTH), as BookKeeper's BookieAuthZFactory does; the
	// error is logged. AuthorizeRoles makes one from authorizedRoles.
	AuthorizeCertificate func(cert *x509.Certificate) error
	// PlaintextRefused serves TLS connections only (it needs TLSAddr): on the plaintext port
	// (Addr) every add and read is answered EUA, as on a connection that has not
	// authenticated, and an AUTH closes the connection. A bookie whose TLS port requires
	// client certificates sets it, so that a client without one cannot go around the check
	// by the plaintext port (BookKeeper serves both on one port and refuses such a client).
	PlaintextRefused bool
	// ErrorCode maps a Storage error to the return code sent to the client. Default: every
	// error is EIO.
	ErrorCode func(error) protocol.ReturnCode
	// Metrics receives the server's metrics; nil disables them.
	Metrics *Metrics
	// Logger is the server's logger. Default slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	var c Config
	c.EnsureDefaults()
	return c
}

// EnsureDefaults replaces zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.TLSHandshakeTimeout == 0 {
		c.TLSHandshakeTimeout = DefaultTLSHandshakeTimeout
	}
	if c.NumEventLoops == 0 {
		c.NumEventLoops = runtime.NumCPU()
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = DefaultMaxFrameSize
	}
	if c.ReadBufferCap == 0 {
		c.ReadBufferCap = c.MaxFrameSize
	}
	if c.NumReadWorkerThreads == 0 {
		c.NumReadWorkerThreads = DefaultNumReadWorkerThreads
	}
	if c.ReadWorkerQueueSize == 0 {
		c.ReadWorkerQueueSize = DefaultReadWorkerQueueSize
	}
	if c.MaxPendingAddRequestsPerThread == 0 {
		c.MaxPendingAddRequestsPerThread = DefaultMaxPendingRequestsPerConnection
	}
	if c.MaxPendingReadRequestsPerThread == 0 {
		c.MaxPendingReadRequestsPerThread = DefaultMaxPendingRequestsPerConnection
	}
	if c.MaxOutboundBytesPerConnection == 0 {
		c.MaxOutboundBytesPerConnection = DefaultMaxOutboundBytesPerConnection
	}
	if c.MaxUnwrittenReadBytes == 0 {
		c.MaxUnwrittenReadBytes = max(DefaultMaxUnwrittenReadBytes, c.MaxFrameSize)
	}
	if c.MaxInboundBytesPerConnection == 0 {
		c.MaxInboundBytesPerConnection = max(DefaultMaxInboundBytesPerConnection, c.MaxFrameSize)
	}
	if c.ResumeInterval == 0 {
		c.ResumeInterval = DefaultResumeInterval
	}
	if c.ErrorCode == nil {
		c.ErrorCode = allEIO
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func allEIO(error) protocol.ReturnCode { return protocol.EIO }

// Validate reports the first invalid field, wrapped in ErrBadConfig. Call it after
// EnsureDefaults (New does both).
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return bad("Addr %q: %v", c.Addr, err)
	}
	if c.PlaintextRefused && c.TLSAddr == "" {
		return bad("PlaintextRefused without TLSAddr would serve no client")
	}
	if c.TLSAddr != "" {
		if _, _, err := net.SplitHostPort(c.TLSAddr); err != nil {
			return bad("TLSAddr %q: %v", c.TLSAddr, err)
		}
		if c.TLSConfig == nil {
			return bad("TLSAddr is set but TLSConfig is nil")
		}
		if len(c.TLSConfig.Certificates) == 0 && c.TLSConfig.GetCertificate == nil && c.TLSConfig.GetConfigForClient == nil {
			return bad("TLSConfig has no server certificate")
		}
	}
	switch {
	case c.TLSHandshakeTimeout < 0:
		return bad("TLSHandshakeTimeout %v < 0", c.TLSHandshakeTimeout)
	case c.NumEventLoops < 1:
		return bad("NumEventLoops %d < 1", c.NumEventLoops)
	case c.SocketSendBufferBytes < 0 || c.SocketRecvBufferBytes < 0:
		return bad("negative socket buffer size")
	case c.MaxFrameSize < MinMaxFrameSize:
		return bad("MaxFrameSize %d is too small to carry an add", c.MaxFrameSize)
	case c.ReadBufferCap < 1 || c.ReadBufferCap > 1<<30:
		return bad("ReadBufferCap %d not in [1, 1 GiB]", c.ReadBufferCap)
	case c.NumReadWorkerThreads < 1:
		return bad("NumReadWorkerThreads %d < 1", c.NumReadWorkerThreads)
	case c.ReadWorkerQueueSize < 1:
		return bad("ReadWorkerQueueSize %d < 1", c.ReadWorkerQueueSize)
	case c.MaxPendingAddRequestsPerThread < 1:
		return bad("MaxPendingAddRequestsPerThread %d < 1", c.MaxPendingAddRequestsPerThread)
	case c.MaxPendingReadRequestsPerThread < 1:
		return bad("MaxPendingReadRequestsPerThread %d < 1", c.MaxPendingReadRequestsPerThread)
	case c.MaxAddsInProgressLimit < 0:
		return bad("MaxAddsInProgressLimit %d < 0", c.MaxAddsInProgressLimit)
	case c.MaxReadsInProgressLimit < 0:
		return bad("MaxReadsInProgressLimit %d < 0", c.MaxReadsInProgressLimit)
	case c.MaxOutboundBytesPerConnection < 1:
		return bad("MaxOutboundBytesPerConnection %d < 1", c.MaxOutboundBytesPerConnection)
	case c.MaxUnwrittenReadBytes < 1:
		return bad("MaxUnwrittenReadBytes %d < 1", c.MaxUnwrittenReadBytes)
	case c.MaxInboundBytesPerConnection < c.MaxFrameSize:
		return bad("MaxInboundBytesPerConnection %d < MaxFrameSize %d", c.MaxInboundBytesPerConnection, c.MaxFrameSize)
	case c.ResumeInterval <= 0:
		return bad("ResumeInterval %v <= 0", c.ResumeInterval)
	case c.ErrorCode == nil:
		return bad("ErrorCode is nil")
	case c.Logger == nil:
		return bad("Logger is nil")
	}
	return nil
}

// LoadTLSConfig builds a server TLS configuration from PEM files: the certificate chain and
// key, and optionally a CA bundle that client certificates must chain to. With caFile set,
// requireClientCert demands a verified client certificate; without it a client certificate is
// verified only if presented (an expired or foreign one is refused all the same, a client
// without one is served). Verification checks the chain to the bundle, the validity period
// and the client-authentication key usage, not the names in the certificate. The minimum
// version is TLS 1.2.
func LoadTLSConfig(certFile, keyFile, caFile string, requireClientCert bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: TLS key pair: %w", ErrBadConfig, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if caFile == "" {
		if requireClientCert {
			return nil, fmt.Errorf("%w: client certificates required but no CA file given", ErrBadConfig)
		}
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: TLS CA file: %w", ErrBadConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: TLS CA file %s holds no PEM certificate", ErrBadConfig, caFile)
	}
	cfg.ClientCAs = pool
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
	if requireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
