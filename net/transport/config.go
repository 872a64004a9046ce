package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// Sentinel errors. A request's callback gets one of them (possibly wrapped with the bookie's
// address and the cause); callers branch with errors.Is.
var (
	// ErrTimeout: no response within AddTimeout or ReadTimeout. A response that arrives later
	// is dropped.
	ErrTimeout = errors.New("transport: request timed out")
	// ErrConnection: the request could not be sent or answered because the connection failed:
	// dial, TLS handshake, write or read error, the bookie closed the connection, or the
	// connection is in reconnect backoff after such a failure.
	ErrConnection = errors.New("transport: connection error")
	// errUnresponsive is the cause of an ErrConnection for a connection that received nothing
	// since the oldest request that timed out on it was sent.
	errUnresponsive = errors.New("no response for a whole request timeout: closing the connection")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("transport: closed")
	// ErrTooManyPending: the connection already has MaxPendingPerConn requests in flight.
	ErrTooManyPending = errors.New("transport: too many pending requests")
	// ErrEntryTooLarge: the add request would exceed MaxFrameSize. Nothing was sent; this is
	// the caller's problem, not a bookie failure.
	ErrEntryTooLarge = errors.New("transport: entry too large")
	// ErrAuth: the AUTH exchange failed (the bookie refused or closed the connection, or did
	// not answer within DialTimeout).
	ErrAuth = errors.New("transport: authentication failed")
	// ErrBadRequest: the request is malformed and was not sent (a stored entry shorter than
	// its 32-byte header or whose ids differ from the arguments, a missing master key).
	ErrBadRequest = errors.New("transport: bad request")
	// ErrBadConfig: Config.Validate failed.
	ErrBadConfig = errors.New("transport: bad config")
)

// Defaults. Names in parentheses are BookKeeper's client configuration keys.
const (
	// DefaultDialTimeout is connectTimeout: TCP connect, TLS handshake and AUTH together.
	DefaultDialTimeout = 10 * time.Second
	// DefaultAddTimeout is addEntryTimeout.
	DefaultAddTimeout = 5 * time.Second
	// DefaultReadTimeout is readTimeout.
	DefaultReadTimeout = 5 * time.Second
	// DefaultIdleConnectionTTL is how long a pool keeps a connection that is down and unused.
	DefaultIdleConnectionTTL = 10 * time.Minute
	// DefaultReconnectMin and DefaultReconnectMax bound the reconnect backoff.
	DefaultReconnectMin = 100 * time.Millisecond
	DefaultReconnectMax = 5 * time.Second
	// stableConnectionAge is how long a connection must have been up for its loss to reset
	// the reconnect backoff. A shorter-lived one counts as a failed attempt (after the first).
	stableConnectionAge = time.Second
	// DefaultMaxPendingPerConn bounds the requests in flight on one connection.
	DefaultMaxPendingPerConn = 100000
	// DefaultMaxQueuedBytesPerConn bounds the encoded requests waiting for the writer.
	DefaultMaxQueuedBytesPerConn = 16 << 20

	// minMaxFrameSize is the smallest MaxFrameSize Validate accepts: an add of an empty
	// entry with a 20-byte digest, and room for a read response of the same.
	minMaxFrameSize = 256
)

// Config configures a Pool. The zero value is usable: NewPool fills in the defaults.
type Config struct {
	// DialTimeout bounds connecting: the TCP connect, the TLS handshake and the AUTH
	// exchange (connectTimeout). Default DefaultDialTimeout.
	DialTimeout time.Duration
	// AddTimeout is the time an add may wait for its response (addEntryTimeout), counted
	// from the call to Add. Default DefaultAddTimeout.
	AddTimeout time.Duration
	// ReadTimeout is the time a read may wait for its response (readTimeout). Default
	// DefaultReadTimeout.
	ReadTimeout time.Duration
	// MaxFrameSize is nettyMaxFrameSizeBytes, length prefix included: an add whose frame would
	// be larger fails locally with ErrEntryTooLarge, and a response frame announcing more
	// closes the connection. Default protocol.DefaultMaxFrameSize.
	MaxFrameSize int
	// TLS, when set, makes every connection a TLS client with this configuration (cloned by
	// NewPool); nil = plaintext. The bookie's certificate must chain to RootCAs (nil: the
	// system's roots), be valid now (or at Time()), and, unless TLSHostnameVerificationDisabled,
	// be for the bookie: for ServerName if set, else for the host of the address dialled (a
	// DNS name, or an IP address that must be an IP SAN). Certificates or GetClientCertificate
	// give the client certificate that a bookie may require. A bookie certificate the client
	// refuses fails the connection attempt with ErrConnection wrapping a
	// *tls.CertificateVerificationError (errors.As finds the x509 error: CertificateInvalidError
	// with Reason Expired for an expired or not yet valid one, UnknownAuthorityError,
	// HostnameError). A bookie that refuses the client's certificate sends a TLS alert:
	// ErrConnection with "remote error: tls: ...", at the handshake over TLS 1.2, on the first
	// request over TLS 1.3, whose client handshake ends before the bookie has checked the
	// certificate (the request is not processed). InsecureSkipVerify turns every check off.
	TLS *tls.Config
	// TLSHostnameVerificationDisabled keeps every check of the bookie's certificate (chain to
	// RootCAs, validity period, server key usage) except the name it is for: set it for
	// bookies whose certificates do not name the address they are dialled at (bookie ids are
	// usually IP addresses; certificates often name hosts only). It is the inverse of
	// BookKeeper's tlsHostnameVerificationEnabled, whose default, false, skips the check;
	// ringkeeper checks by default, as crypto/tls does. It replaces crypto/tls's verification
	// with the transport's (InsecureSkipVerify plus a VerifyConnection that then calls
	// TLS.VerifyConnection, if set), so TLS.VerifyPeerCertificate gets no verified chains.
	// It requires TLS.
	TLSHostnameVerificationDisabled bool
	// AuthPlugin, when set, makes every connection send an AUTH request with this plugin name
	// and AuthPayload right after connecting, and wait for the bookie's AUTH response before
	// any add or read goes out. "" = no AUTH exchange.
	AuthPlugin  string
	AuthPayload []byte
	// ReconnectMin and ReconnectMax bound the backoff after a failed connection attempt: the
	// first failure waits ReconnectMin, each further consecutive failure twice as long, up to
	// ReconnectMax. Requests made during the backoff fail at once with ErrConnection.
	// Defaults DefaultReconnectMin and DefaultReconnectMax.
	ReconnectMin, ReconnectMax time.Duration
	// IdleConnectionTTL: a connection that is down (lost, or never made) and has had no
	// request for this long is forgotten, so that a long-running client whose bookies come
	// and go under new addresses does not keep one per address it ever used. A later request
	// on it makes it anew. Default DefaultIdleConnectionTTL.
	IdleConnectionTTL time.Duration
	// MaxPendingPerConn bounds the requests in flight (sent or queued, not yet answered) on
	// one connection; over it a request fails at once with ErrTooManyPending. Default
	// DefaultMaxPendingPerConn.
	MaxPendingPerConn int
	// MaxQueuedBytesPerConn bounds the bytes of encoded requests waiting for a connection's
	// writer (while connecting, or while the socket is slower than the callers). A request
	// that does not fit blocks the caller until the writer has taken the queue, the
	// connection fails, or the request's own timeout passes (then ErrTimeout), or, for
	// ReadContext, its context ends. It must be at least MaxFrameSize. Default DefaultMaxQueuedBytesPerConn.
	MaxQueuedBytesPerConn int
	// Logger receives the transport's logs. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills in the zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.AddTimeout == 0 {
		c.AddTimeout = DefaultAddTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = protocol.DefaultMaxFrameSize
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = max(DefaultReconnectMax, c.ReconnectMin)
	}
	if c.IdleConnectionTTL == 0 {
		c.IdleConnectionTTL = DefaultIdleConnectionTTL
	}
	if c.MaxPendingPerConn == 0 {
		c.MaxPendingPerConn = DefaultMaxPendingPerConn
	}
	if c.MaxQueuedBytesPerConn == 0 {
		c.MaxQueuedBytesPerConn = max(DefaultMaxQueuedBytesPerConn, c.MaxFrameSize)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks the configuration (after EnsureDefaults: zero values are errors here).
func (c *Config) Validate() error {
	switch {
	case c.DialTimeout <= 0:
		return fmt.Errorf("%w: DialTimeout %v must be positive", ErrBadConfig, c.DialTimeout)
	case c.AddTimeout <= 0:
		return fmt.Errorf("%w: AddTimeout %v must be positive", ErrBadConfig, c.AddTimeout)
	case c.ReadTimeout <= 0:
		return fmt.Errorf("%w: ReadTimeout %v must be positive", ErrBadConfig, c.ReadTimeout)
	case c.MaxFrameSize < minMaxFrameSize:
		return fmt.Errorf("%w: MaxFrameSize %d is below %d", ErrBadConfig, c.MaxFrameSize, minMaxFrameSize)
	case c.ReconnectMin <= 0:
		return fmt.Errorf("%w: ReconnectMin %v must be positive", ErrBadConfig, c.ReconnectMin)
	case c.ReconnectMax < c.ReconnectMin:
		return fmt.Errorf("%w: ReconnectMax %v is below ReconnectMin %v", ErrBadConfig, c.ReconnectMax, c.ReconnectMin)
	case c.IdleConnectionTTL <= 0:
		return fmt.Errorf("%w: IdleConnectionTTL %v must be positive", ErrBadConfig, c.IdleConnectionTTL)
	case c.MaxPendingPerConn <= 0:
		return fmt.Errorf("%w: MaxPendingPerConn %d must be positive", ErrBadConfig, c.MaxPendingPerConn)
	case c.MaxQueuedBytesPerConn < c.MaxFrameSize:
		return fmt.Errorf("%w: MaxQueuedBytesPerConn %d is below MaxFrameSize %d", ErrBadConfig,
			c.MaxQueuedBytesPerConn, c.MaxFrameSize)
	case c.TLSHostnameVerificationDisabled && c.TLS == nil:
		return fmt.Errorf("%w: TLSHostnameVerificationDisabled without TLS", ErrBadConfig)
	case c.AuthPlugin == "" && len(c.AuthPayload) > 0:
		return fmt.Errorf("%w: AuthPayload without AuthPlugin", ErrBadConfig)
	case c.Logger == nil:
		return fmt.Errorf("%w: nil Logger", ErrBadConfig)
	}
	return nil
}

// tickInterval is how often the pool scans for timed-out requests: a tenth of the shorter
// timeout, between 1 ms and 100 ms. A request therefore fails between its timeout and its
// timeout plus one tick.
func (c *Config) tickInterval() time.Duration {
	return min(max(min(c.AddTimeout, c.ReadTimeout)/10, time.Millisecond), 100*time.Millisecond)
}
