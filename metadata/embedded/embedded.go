// Package embedded runs a real, single-member etcd server inside the current
// process, for the single-command ("standalone") default and for tests.
//
// It is the same etcd that an external cluster runs (go.etcd.io/etcd/server/v3/embed),
// listening on 127.0.0.1 with its own data directory; drivers reach it over
// gRPC exactly as they reach an external cluster, through the URI that
// [Server.URI] returns. Nothing here is a mock.
//
// Ports: a zero port in [Config] binds port 0, so the kernel picks a free port
// at listen time (no probe-then-bind race); [Server.Endpoints] and
// [Server.URI] report the port actually bound. Tests therefore never need a
// fixed port.
//
// One data dir, one server: Start takes an exclusive flock on Dir/LOCK before
// etcd touches the dir and holds it until [Server.Close], so a second server
// on the same dir, started at the same moment or later, in this process or
// another, fails at once with [ErrDirInUse].
package embedded

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// Sentinel errors.
var (
	// ErrInvalidConfig is returned (wrapped) by Start for a bad Config.
	ErrInvalidConfig = errors.New("metadata/embedded: invalid config")
	// ErrStart is returned (wrapped) when the server fails to start or to
	// become ready in time.
	ErrStart = errors.New("metadata/embedded: etcd server did not start")
	// ErrDirInUse is returned (wrapped) when another server, in this
	// process or another, uses the data dir. It wraps ErrStart.
	ErrDirInUse = fmt.Errorf("%w: data dir in use by another server", ErrStart)
)

// DefaultRoot is the root path used in URI when Config.Root is empty.
const DefaultRoot = "/ledgers"

// DefaultStartTimeout bounds Start when the context has no deadline.
const DefaultStartTimeout = 30 * time.Second

// Config describes one embedded etcd server. The zero value is not usable:
// Dir is required.
type Config struct {
	// Dir is the etcd data directory (WAL and snapshot/backend). Required.
	// Starting again on the same Dir restarts the same member with its data.
	Dir string
	// ClientPort is the client (gRPC) port on 127.0.0.1; 0 picks a free one.
	ClientPort int
	// PeerPort is the raft peer port on 127.0.0.1; 0 picks a free one.
	PeerPort int
	// Root is the path part of URI (the metadata root); default DefaultRoot.
	Root string
	// Logger receives etcd's own logs; nil discards them (etcd is chatty at
	// info level and logs harmless errors on shutdown).
	Logger *zap.Logger
	// UnsafeNoFsync turns off etcd's fsyncs. Only for tests: a crash of the
	// machine (not of the process) may then lose metadata.
	UnsafeNoFsync bool
	// AutoCompactionRetention, if non-zero, compacts the key-value history
	// older than this period (etcd "periodic" mode). Zero keeps etcd's
	// default (no automatic compaction).
	AutoCompactionRetention time.Duration
}

// Validate reports whether c can be used to start a server.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	for _, p := range []struct {
		name string
		port int
	}{{"ClientPort", c.ClientPort}, {"PeerPort", c.PeerPort}} {
		if p.port < 0 || p.port > 65535 {
			return fmt.Errorf("%w: %s %d out of range", ErrInvalidConfig, p.name, p.port)
		}
	}
	if c.ClientPort != 0 && c.ClientPort == c.PeerPort {
		return fmt.Errorf("%w: ClientPort and PeerPort are both %d", ErrInvalidConfig, c.ClientPort)
	}
	if c.Root != "" {
		if err := metadata.ValidateRoot(c.Root); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.AutoCompactionRetention < 0 {
		return fmt.Errorf("%w: negative AutoCompactionRetention", ErrInvalidConfig)
	}
	return nil
}

// Server is a running embedded etcd server.
type Server struct {
	etcd      *embed.Etcd
	clientURL string // http://127.0.0.1:<port>, the port actually bound
	root      string
	dir       string
	lock      *os.File // holds the flock on dir/LOCK until Close
}

// Start starts an etcd server as described by cfg and waits until it serves
// requests, or until ctx is done (DefaultStartTimeout if ctx has no deadline).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
		defer cancel()
	}
	root := cfg.Root
	if root == "" {
		root = DefaultRoot
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			lock.Close() // after e.Close: etcd has let go of the dir
		}
	}()
	if err := checkDirFree(cfg.Dir); err != nil {
		return nil, err
	}
	e, err := embed.StartEtcd(etcdConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("%w: dir %s: %w", ErrStart, cfg.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("%w: dir %s: %w", ErrStart, cfg.Dir, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("%w: dir %s: not ready: %w", ErrStart, cfg.Dir, ctx.Err())
	}
	if len(e.Clients) == 0 {
		e.Close()
		return nil, fmt.Errorf("%w: no client listener", ErrStart)
	}
	addr, ok := e.Clients[0].Addr().(*net.TCPAddr)
	if !ok {
		e.Close()
		return nil, fmt.Errorf("%w: unexpected client listener address %v", ErrStart, e.Clients[0].Addr())
	}
	started = true
	return &Server{
		etcd:      e,
		clientURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(addr.Port)),
		root:      root,
		dir:       cfg.Dir,
		lock:      lock,
	}, nil
}

// lockFileName is the file in the data dir that a running server holds an
// flock on.
const lockFileName = "LOCK"

// lockDir takes an exclusive flock on dir/LOCK, creating dir if needed, before
// etcd creates anything there. checkDirFree alone cannot see a server that has
// not created its db yet: two starts at once on a new dir both passed it, and
// the second then waited for the first's db lock forever. The kernel drops the
// lock when the process dies, so a crash never leaves the dir locked.
func lockDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil { // etcd's own mode for its dir
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: dir %s: %w", ErrStart, dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (another standalone running on it?)", ErrDirInUse, dir)
		}
		return nil, fmt.Errorf("%w: dir %s: lock: %w", ErrStart, dir, err)
	}
	return f, nil
}

// checkDirFree fails if another etcd server holds dir's backend database. etcd waits for
// that file's lock forever, deaf to any context, so Start asks first (without waiting).
// Another Start is kept out by lockDir; this catches a server that takes no LOCK (a plain
// etcd, or an older ringkeeper).
func checkDirFree(dir string) error {
	f, err := os.Open(filepath.Join(dir, "member", "snap", "db"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a new member: nothing to wait for
	}
	if err != nil {
		return fmt.Errorf("%w: dir %s: %w", ErrStart, dir, err)
	}
	defer f.Close() // releases the probe's lock
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s: its etcd db is locked (another etcd server running on it?)", ErrDirInUse, dir)
		}
		return fmt.Errorf("%w: dir %s: lock: %w", ErrStart, dir, err)
	}
	return nil
}

// etcdConfig translates cfg into etcd's own configuration.
func etcdConfig(cfg Config) *embed.Config {
	ecfg := embed.NewConfig()
	ecfg.Name = "ringkeeper"
	ecfg.Dir = cfg.Dir
	clientURL := localURL(cfg.ClientPort)
	peerURL := localURL(cfg.PeerPort)
	ecfg.ListenClientUrls = []url.URL{clientURL}
	ecfg.AdvertiseClientUrls = []url.URL{clientURL}
	ecfg.ListenPeerUrls = []url.URL{peerURL}
	// A single member never dials its own peer URL, so advertising port 0
	// (when the port is picked at listen time) is harmless. Restarts read
	// the membership from Dir and ignore InitialCluster.
	ecfg.AdvertisePeerUrls = []url.URL{peerURL}
	ecfg.InitialCluster = ecfg.InitialClusterFromName(ecfg.Name)
	// One member has no one to hold an election against, so short raft
	// timers cost nothing and make start and restart take ~100 ms instead
	// of ~1 s. They also lower etcd's minimum lease TTL to 1 s.
	ecfg.TickMs = 10
	ecfg.ElectionMs = 100
	ecfg.EnableGRPCGateway = false
	ecfg.UnsafeNoFsync = cfg.UnsafeNoFsync
	if cfg.AutoCompactionRetention > 0 {
		ecfg.AutoCompactionMode = embed.CompactorModePeriodic
		ecfg.AutoCompactionRetention = cfg.AutoCompactionRetention.String()
	}
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	ecfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	return ecfg
}

func localURL(port int) url.URL {
	return url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}

// Endpoints returns the client endpoints as host:port strings.
func (s *Server) Endpoints() []string {
	u, _ := url.Parse(s.clientURL)
	return []string{u.Host}
}

// ClientURL returns the client URL, http://127.0.0.1:<port>, for tools that
// speak to etcd directly (etcdctl, the etcd client).
func (s *Server) ClientURL() string { return s.clientURL }

// URI returns the metadata service URI for this server,
// etcd://127.0.0.1:<port><root>.
func (s *Server) URI() string { return s.URIWithRoot(s.root) }

// URIWithRoot returns the metadata service URI for this server with another
// root path (for example one root per test on a shared server). root must
// start with '/'.
func (s *Server) URIWithRoot(root string) string {
	return "etcd://" + s.Endpoints()[0] + root
}

// Dir returns the data directory.
func (s *Server) Dir() string { return s.dir }

// Close stops the server and releases its ports and files. It waits for the
// server's goroutines to exit. Clients still connected see their requests
// fail. Close is safe to call more than once.
func (s *Server) Close() error {
	if s == nil || s.etcd == nil {
		return nil
	}
	e := s.etcd
	s.etcd = nil
	e.Close()
	// Close closes Err once the server is fully stopped; drain what is left.
	if errc := e.Err(); errc != nil {
		for range errc {
		}
	}
	// Only now may another server take the dir.
	return s.lock.Close()
}
