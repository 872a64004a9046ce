package bookie

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
	"github.com/ringkeeper/ringkeeper/net/server"
)

// ErrBadConfig is wrapped by every configuration error.
var ErrBadConfig = errors.New("bookie: bad config")

// Config is a bookie's configuration. Keys of the properties file use BookKeeper's names
// (bk_server.conf) for the settings ringkeeper supports; see Keys.
type Config struct {
	// BookiePort is bookiePort (3181); ListenAddress is the host address to bind ("" = all).
	BookiePort    int
	ListenAddress string
	// ListeningInterface is listeningInterface: the name of a network interface ("eth0") whose
	// address (its first IPv4 one, else an IPv6 one) the bookie binds and, without
	// advertisedAddress, names in its id. Start resolves it into ListenAddress.
	ListeningInterface string
	// AdvertisedAddress is advertisedAddress: the host in the bookie id ("" = the address
	// bound, else this host's first non-loopback IPv4 address, or 127.0.0.1).
	AdvertisedAddress string
	// BookieID is bookieId: overrides host:port as the bookie's identity.
	BookieID string
	// TLSPort serves the same protocol over TLS (0 = off), with TLSCertificatePath,
	// TLSKeyPath, TLSTrustStorePath (client CAs) and TLSClientAuthentication (see
	// server.LoadTLSConfig): with a trust store, a client certificate that has expired, is not
	// yet valid or does not chain to it fails the handshake, and nothing the client sent is
	// processed; TLSClientAuthentication also refuses clients without one (it needs the trust
	// store), and makes the plaintext port (bookiePort) answer every add and read EUA, so that
	// no client goes around the check (BookKeeper serves both on one port). PEM files, not
	// Java key stores, whatever the keys' names say.
	TLSPort                 int
	TLSCertificatePath      string
	TLSKeyPath              string
	TLSTrustStorePath       string
	TLSClientAuthentication bool
	// AuthorizedRoles (authorizedRoles, BookKeeper's BookieAuthZFactory): when set, a TLS
	// client's certificate must name one of these roles first in its OU (server.AuthorizeRoles);
	// other clients get EUA for every add and read. It needs tlsClientAuthentication.
	AuthorizedRoles []string
	// AuthToken (bookieAuthToken / bookieAuthTokenFile): when set, clients must authenticate
	// with this shared token before adds and reads.
	AuthToken string

	// MetadataServiceURI is metadataServiceUri, e.g. etcd://host:2379/ledgers.
	MetadataServiceURI string
	// RegistrationTTL is how long the bookie's registration outlives a crash.
	RegistrationTTL time.Duration

	// Engine holds journal and storage settings.
	Engine engine.Config
	// Server holds network settings.
	Server server.Config

	// Disk usage (fractions of the file system): read-only above DiskUsageThreshold, writable
	// again below DiskUsageLwmThreshold; checked every DiskCheckInterval.
	DiskUsageThreshold     float64
	DiskUsageWarnThreshold float64
	DiskUsageLwmThreshold  float64
	DiskCheckInterval      time.Duration
	// ReadOnlyModeEnabled false: the bookie stops where it would turn read-only (full disks,
	// failed storage), and refuses read-only mode from the admin API, as BookKeeper does.
	ReadOnlyModeEnabled bool

	// PrometheusStatsHTTPPort serves /metrics, /heartbeat and the admin API (0 = off).
	PrometheusStatsHTTPPort int
	// HTTPServerEnabled is httpServerEnabled: whether that port also serves the admin API
	// (/api/v1/bookie/...). BookKeeper's default is false; ringkeeper's is true, as `ringkeeper
	// shell gc` drives bookies through it. /metrics and /heartbeat are served either way.
	HTTPServerEnabled bool

	Logger *slog.Logger
}

// DefaultConfig returns BookKeeper's defaults where the concept is the same.
func DefaultConfig() Config {
	ec := engine.DefaultConfig([]string{"/tmp/bk-txn"}, []string{"/tmp/bk-data"})
	return Config{
		BookiePort:              3181,
		MetadataServiceURI:      "etcd://127.0.0.1:2379/ledgers",
		RegistrationTTL:         10 * time.Second,
		Engine:                  ec,
		Server:                  server.DefaultConfig(),
		DiskUsageThreshold:      0.95,
		DiskUsageWarnThreshold:  0.90,
		DiskUsageLwmThreshold:   0.90,
		DiskCheckInterval:       10 * time.Second,
		ReadOnlyModeEnabled:     true,
		PrometheusStatsHTTPPort: 8000,
		HTTPServerEnabled:       true,
	}
}

// Validate checks cross-field rules; field formats are checked when they are set.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	switch {
	case c.BookiePort < 1 || c.BookiePort > 65535:
		// Not 0 either: the bookie id (cookie, registration) names the port.
		return bad("bookiePort %d is not a port in [1, 65535]", c.BookiePort)
	case c.TLSPort < 0 || c.TLSPort > 65535:
		return bad("tlsPort %d is not a port", c.TLSPort)
	case c.PrometheusStatsHTTPPort < -1 || c.PrometheusStatsHTTPPort > 65535:
		return bad("prometheusStatsHttpPort %d is not a port (0: no HTTP server, -1: any free port)", c.PrometheusStatsHTTPPort)
	case c.TLSPort != 0 && (c.TLSCertificatePath == "" || c.TLSKeyPath == ""):
		return bad("tlsPort is set but tlsCertificatePath or tlsKeyStore is not")
	case c.TLSClientAuthentication && c.TLSPort == 0:
		// Ignored, it would leave the plaintext port serving clients without a certificate.
		return bad("tlsClientAuthentication=true needs tlsPort: client certificates come over TLS")
	case c.TLSClientAuthentication && c.TLSTrustStorePath == "":
		return bad("tlsClientAuthentication=true needs tlsTrustStore, the CAs client certificates must chain to")
	case len(c.AuthorizedRoles) > 0 && (c.TLSPort == 0 || !c.TLSClientAuthentication):
		return bad("authorizedRoles needs tlsPort and tlsClientAuthentication=true: roles come from client certificates")
	case c.DiskUsageThreshold <= 0 || c.DiskUsageThreshold > 1:
		return bad("diskUsageThreshold %v must be in (0, 1]", c.DiskUsageThreshold)
	case c.DiskUsageLwmThreshold <= 0 || c.DiskUsageLwmThreshold > c.DiskUsageThreshold:
		return bad("diskUsageLwmThreshold %v must be in (0, diskUsageThreshold]", c.DiskUsageLwmThreshold)
	case c.DiskUsageWarnThreshold <= 0 || c.DiskUsageWarnThreshold > c.DiskUsageThreshold:
		return bad("diskUsageWarnThreshold %v must be in (0, diskUsageThreshold]", c.DiskUsageWarnThreshold)
	case c.DiskCheckInterval <= 0:
		return bad("diskCheckInterval must be positive")
	case c.RegistrationTTL < time.Second:
		return bad("registration TTL %v is below 1s", c.RegistrationTTL)
	case c.MetadataServiceURI == "":
		return bad("metadataServiceUri is empty")
	case c.ListeningInterface != "" && c.ListenAddress != "":
		return bad("listeningInterface %q and ListenAddress %q are both set", c.ListeningInterface, c.ListenAddress)
	}
	if err := c.validateServer(); err != nil {
		return err
	}
	// The engine's and the journal's errors are configuration errors too.
	if err := c.Engine.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	jc := c.Engine.Journal // the template: each journal gets its dir at start
	jc.Dir = c.Engine.JournalDirs[0]
	if err := jc.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return nil
}

// maxFrameSize is the largest nettyMaxFrameSizeBytes: the key also sets the journal's record
// limit, which is at most 1 GiB.
const maxFrameSize = 1 << 30

// maxReadWorkers bounds numReadWorkerThreads: each worker is a goroutine serving one read at a
// time, and an NVMe drive is saturated by a few hundred reads in flight (BookKeeper's default
// is 8), so more only costs memory; a typo (a million) would start a million goroutines.
const maxReadWorkers = 1024

// validateServer checks the network server's settings, named by their keys, before anything
// is opened or written (the server checks them again when it starts). 0 keeps a setting's
// default, as in server.Config.
func (c *Config) validateServer() error {
	sc := c.Server
	for _, k := range []struct {
		key string
		v   int
	}{
		{"serverNumIOThreads", sc.NumEventLoops},
		{"numReadWorkerThreads", sc.NumReadWorkerThreads},
		{"maxPendingAddRequestsPerThread", sc.MaxPendingAddRequestsPerThread},
		{"maxPendingReadRequestsPerThread", sc.MaxPendingReadRequestsPerThread},
		{"maxAddsInProgressLimit", sc.MaxAddsInProgressLimit},
		{"maxReadsInProgressLimit", sc.MaxReadsInProgressLimit},
		{"maxUnwrittenReadBytes", sc.MaxUnwrittenReadBytes},
	} {
		if k.v < 0 {
			return fmt.Errorf("%w: %s %d is negative", ErrBadConfig, k.key, k.v)
		}
	}
	if sc.NumReadWorkerThreads > maxReadWorkers {
		return fmt.Errorf("%w: numReadWorkerThreads %d is more than %d (more read workers than a disk can keep busy)",
			ErrBadConfig, sc.NumReadWorkerThreads, maxReadWorkers)
	}
	if n := sc.MaxFrameSize; n != 0 && (n < server.MinMaxFrameSize || n > maxFrameSize) {
		return fmt.Errorf("%w: nettyMaxFrameSizeBytes %d is not in [%d, %d] (an add must fit, and the journal's records are at most 1 GiB)",
			ErrBadConfig, n, server.MinMaxFrameSize, maxFrameSize)
	}
	sc.EnsureDefaults()
	if err := sc.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return nil
}

// resolve turns the settings that depend on where and on which machine the bookie runs into
// their fixed form, before Validate and before anything is written: journal and ledger dirs
// become absolute (the cookies record them, so the same directory named from another working
// directory must read the same), and listeningInterface becomes ListenAddress.
func (c *Config) resolve() error {
	var err error
	if c.Engine.JournalDirs, err = absDirs(c.Engine.JournalDirs); err != nil {
		return fmt.Errorf("%w: journalDirectories: %w", ErrBadConfig, err)
	}
	if c.Engine.LedgerDirs, err = absDirs(c.Engine.LedgerDirs); err != nil {
		return fmt.Errorf("%w: ledgerDirectories: %w", ErrBadConfig, err)
	}
	if c.ListeningInterface != "" && c.ListenAddress == "" {
		if c.ListenAddress, err = interfaceAddress(c.ListeningInterface); err != nil {
			return fmt.Errorf("%w: listeningInterface=%q: %w", ErrBadConfig, c.ListeningInterface, err)
		}
		c.ListeningInterface = "" // resolved: ListenAddress holds it
	}
	return nil
}

func absDirs(dirs []string) ([]string, error) {
	out := make([]string, len(dirs))
	for i, d := range dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, err
		}
		out[i] = abs
	}
	return out, nil
}

// interfaceAddress is the address of the network interface name, as BookKeeper picks it for
// listeningInterface: the first IPv4 one, else the first global unicast (or loopback) one; a
// link-local IPv6 address is usable only with its zone, which a bookie id cannot carry.
func interfaceAddress(name string) (string, error) {
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("no such network interface (%w)", err)
	}
	addrs, err := iface.Addrs()
	if err != nil {
		return "", err
	}
	var v6 net.IP
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		switch {
		case !ok:
		case ipn.IP.To4() != nil:
			return ipn.IP.String(), nil
		case v6 == nil && (ipn.IP.IsGlobalUnicast() || ipn.IP.IsLoopback()):
			v6 = ipn.IP
		}
	}
	if v6 == nil {
		return "", fmt.Errorf("interface %s has no usable address", name)
	}
	return v6.String(), nil
}

// setter parses a property value into the config.
type setter func(c *Config, v string) error

func intKey(f func(c *Config) *int) setter {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		*f(c) = n
		return nil
	}
}

func int64Key(f func(c *Config) *int64, unit int64) setter {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		if err := checkScale(n, unit); err != nil {
			return err
		}
		*f(c) = n * unit
		return nil
	}
}

// checkScale refuses a value whose size in the key's unit overflows (it would wrap to a small
// or negative one).
func checkScale(n, unit int64) error {
	if n > math.MaxInt64/unit || n < math.MinInt64/unit {
		return fmt.Errorf("%d is out of range", n)
	}
	return nil
}

func boolKey(f func(c *Config) *bool) setter {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean (true or false)")
		}
		*f(c) = b
		return nil
	}
}

func floatKey(f func(c *Config) *float64) setter {
	return func(c *Config, v string) error {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("not a finite number")
		}
		*f(c) = x
		return nil
	}
}

func durationKey(f func(c *Config) *time.Duration, unit time.Duration) setter {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		if err := checkScale(n, int64(unit)); err != nil {
			return err
		}
		*f(c) = time.Duration(n) * unit
		return nil
	}
}

func stringKey(f func(c *Config) *string) setter {
	return func(c *Config, v string) error {
		*f(c) = v
		return nil
	}
}

func listKey(f func(c *Config) *[]string) setter {
	return func(c *Config, v string) error {
		var dirs []string
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d != "" {
				dirs = append(dirs, d)
			}
		}
		if len(dirs) == 0 {
			return fmt.Errorf("empty list")
		}
		*f(c) = dirs
		return nil
	}
}

// Keys maps every supported property to its setter. Units follow the key names: MSec
// milliseconds, MB mebibytes, Bytes bytes.
var Keys = map[string]setter{
	"bookiePort":              intKey(func(c *Config) *int { return &c.BookiePort }),
	"listeningInterface":      stringKey(func(c *Config) *string { return &c.ListeningInterface }),
	"advertisedAddress":       stringKey(func(c *Config) *string { return &c.AdvertisedAddress }),
	"bookieId":                stringKey(func(c *Config) *string { return &c.BookieID }),
	"tlsPort":                 intKey(func(c *Config) *int { return &c.TLSPort }),
	"tlsCertificatePath":      stringKey(func(c *Config) *string { return &c.TLSCertificatePath }),
	"tlsKeyStore":             stringKey(func(c *Config) *string { return &c.TLSKeyPath }),
	"tlsTrustStore":           stringKey(func(c *Config) *string { return &c.TLSTrustStorePath }),
	"tlsClientAuthentication": boolKey(func(c *Config) *bool { return &c.TLSClientAuthentication }),
	"authorizedRoles":         listKey(func(c *Config) *[]string { return &c.AuthorizedRoles }),
	"bookieAuthToken":         stringKey(func(c *Config) *string { return &c.AuthToken }),
	"bookieAuthTokenFile": func(c *Config, v string) error {
		b, err := os.ReadFile(v)
		if err != nil {
			return err
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			// An empty token turns authentication off: refuse rather than serve every client.
			return fmt.Errorf("%s holds no token", v)
		}
		c.AuthToken = token
		return nil
	},
	"metadataServiceUri":                stringKey(func(c *Config) *string { return &c.MetadataServiceURI }),
	"registrationTtlSeconds":            durationKey(func(c *Config) *time.Duration { return &c.RegistrationTTL }, time.Second),
	"journalDirectories":                listKey(func(c *Config) *[]string { return &c.Engine.JournalDirs }),
	"journalDirectory":                  listKey(func(c *Config) *[]string { return &c.Engine.JournalDirs }),
	"ledgerDirectories":                 listKey(func(c *Config) *[]string { return &c.Engine.LedgerDirs }),
	"journalMaxGroupWaitMSec":           durationKey(func(c *Config) *time.Duration { return &c.Engine.Journal.MaxGroupWait }, time.Millisecond),
	"journalBufferedWritesThreshold":    intKey(func(c *Config) *int { return &c.Engine.Journal.BufferedWritesThreshold }),
	"journalFlushWhenQueueEmpty":        boolKey(func(c *Config) *bool { return &c.Engine.Journal.FlushWhenQueueEmpty }),
	"journalQueueSize":                  intKey(func(c *Config) *int { return &c.Engine.Journal.QueueSize }),
	"journalMaxSizeMB":                  int64Key(func(c *Config) *int64 { return &c.Engine.Journal.MaxFileSize }, 1<<20),
	"journalMaxBackups":                 intKey(func(c *Config) *int { return &c.Engine.Journal.MaxBackups }),
	"journalSyncData":                   boolKey(func(c *Config) *bool { return &c.Engine.Journal.SyncData }),
	"journalPageCacheFlushIntervalMSec": durationKey(func(c *Config) *time.Duration { return &c.Engine.Journal.PageCacheFlushInterval }, time.Millisecond),
	"journalAlignmentSize":              intKey(func(c *Config) *int { return &c.Engine.Journal.Alignment }),
	"journalReuseFiles":                 boolKey(func(c *Config) *bool { return &c.Engine.Journal.ReuseFiles }),
	"journalIOEngine": func(c *Config, v string) (err error) {
		c.Engine.Journal.Engine, err = diskio.ParseEngine(v)
		return err
	},
	"journalPreallocMode": func(c *Config, v string) (err error) {
		c.Engine.Journal.Prealloc, err = journal.ParsePreallocMode(v)
		return err
	},
	"journalWritePipelineDepth":      intKey(func(c *Config) *int { return &c.Engine.Journal.PipelineDepth }),
	"skipReplayJournalInvalidRecord": boolKey(func(c *Config) *bool { return &c.Engine.Journal.SkipInvalidRecords }),
	"nettyMaxFrameSizeBytes": func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		c.Server.MaxFrameSize = n
		c.Engine.Journal.MaxRecordSize = n
		// The limits that default from the frame size follow a larger one up (each must hold a
		// whole frame; a frame over 16 MiB failed the server's validation).
		c.Server.MaxInboundBytesPerConnection = max(c.Server.MaxInboundBytesPerConnection, n)
		c.Server.MaxUnwrittenReadBytes = max(c.Server.MaxUnwrittenReadBytes, n)
		return nil
	},
	"dbStorage_writeCacheMaxSizeMb":     int64Key(func(c *Config) *int64 { return &c.Engine.WriteCacheMaxSize }, 1<<20),
	"dbStorage_readAheadCacheMaxSizeMb": int64Key(func(c *Config) *int64 { return &c.Engine.ReadAheadCacheMaxSize }, 1<<20),
	"dbStorage_readAheadCacheBatchSize": intKey(func(c *Config) *int { return &c.Engine.ReadAheadBatchSize }),
	"dbStorage_maxThrottleTimeMs":       durationKey(func(c *Config) *time.Duration { return &c.Engine.MaxThrottleTime }, time.Millisecond),
	"dbStorage_rocksDB_blockCacheSize":  int64Key(func(c *Config) *int64 { return &c.Engine.IndexBlockCacheSize }, 1),
	"indexWarmOnStart":                  boolKey(func(c *Config) *bool { return &c.Engine.WarmIndex }),
	"flushInterval":                     durationKey(func(c *Config) *time.Duration { return &c.Engine.FlushInterval }, time.Millisecond),
	"logSizeLimit":                      int64Key(func(c *Config) *int64 { return &c.Engine.EntryLogSizeLimit }, 1),
	"serverNumIOThreads":                intKey(func(c *Config) *int { return &c.Server.NumEventLoops }),
	"numReadWorkerThreads":              intKey(func(c *Config) *int { return &c.Server.NumReadWorkerThreads }),
	"maxPendingAddRequestsPerThread":    intKey(func(c *Config) *int { return &c.Server.MaxPendingAddRequestsPerThread }),
	"maxPendingReadRequestsPerThread":   intKey(func(c *Config) *int { return &c.Server.MaxPendingReadRequestsPerThread }),
	"maxAddsInProgressLimit":            intKey(func(c *Config) *int { return &c.Server.MaxAddsInProgressLimit }),
	"maxReadsInProgressLimit":           intKey(func(c *Config) *int { return &c.Server.MaxReadsInProgressLimit }),
	"maxUnwrittenReadBytes":             intKey(func(c *Config) *int { return &c.Server.MaxUnwrittenReadBytes }),
	"diskUsageThreshold":                floatKey(func(c *Config) *float64 { return &c.DiskUsageThreshold }),
	"diskUsageWarnThreshold":            floatKey(func(c *Config) *float64 { return &c.DiskUsageWarnThreshold }),
	"diskUsageLwmThreshold":             floatKey(func(c *Config) *float64 { return &c.DiskUsageLwmThreshold }),
	"diskCheckInterval":                 durationKey(func(c *Config) *time.Duration { return &c.DiskCheckInterval }, time.Millisecond),
	"readOnlyModeEnabled":               boolKey(func(c *Config) *bool { return &c.ReadOnlyModeEnabled }),
	"prometheusStatsHttpPort":           intKey(func(c *Config) *int { return &c.PrometheusStatsHTTPPort }),
	"httpServerEnabled":                 boolKey(func(c *Config) *bool { return &c.HTTPServerEnabled }),
	"gcWaitTime":                        durationKey(func(c *Config) *time.Duration { return &c.Engine.GC.WaitTime }, time.Millisecond),
	"minorCompactionThreshold":          floatKey(func(c *Config) *float64 { return &c.Engine.GC.MinorThreshold }),
	"minorCompactionInterval":           durationKey(func(c *Config) *time.Duration { return &c.Engine.GC.MinorInterval }, time.Second),
	"majorCompactionThreshold":          floatKey(func(c *Config) *float64 { return &c.Engine.GC.MajorThreshold }),
	"majorCompactionInterval":           durationKey(func(c *Config) *time.Duration { return &c.Engine.GC.MajorInterval }, time.Second),
	"compactionRateByBytes":             int64Key(func(c *Config) *int64 { return &c.Engine.GC.RateBytes }, 1),
	"majorCompactionMaxTimeMillis":      durationKey(func(c *Config) *time.Duration { return &c.Engine.GC.MajorMaxTime }, time.Millisecond),
	"minorCompactionMaxTimeMillis":      durationKey(func(c *Config) *time.Duration { return &c.Engine.GC.MinorMaxTime }, time.Millisecond),
	"gcMetadataOpRateLimit":             intKey(func(c *Config) *int { return &c.Engine.GC.MetadataOpRate }),
	"isForceGCAllowWhenNoSpace":         boolKey(func(c *Config) *bool { return &c.Engine.GC.ForceAllowWhenNoSpace }),
}

// ignoredKeys are BookKeeper keys that have no meaning here; they are accepted silently.
var ignoredKeys = []string{"ledgerStorageClass", "zkServers", "zkTimeout",
	"statsProviderClass", "allowLoopback", "journalAdaptiveGroupWrites", "journalWriteBufferSizeKB",
	"journalRemoveFromPageCache", "journalPreAllocSizeMB", "journalFormatVersionToWrite",
	// Compaction is always throttled by bytes (compactionRateByBytes), never by entries.
	"isThrottleByBytes"}

// ParseProperties reads a Java properties file (key=value or key: value, # and ! comments,
// backslash line continuations).
func ParseProperties(r io.Reader) (map[string]string, error) {
	props := map[string]string{}
	sc := bufio.NewScanner(r)
	var pending string
	continued := false // pending ends in a continuation
	line := 0
	add := func(text string) error {
		i := strings.IndexAny(text, "=:")
		if i < 0 {
			return fmt.Errorf("%w: line %d: %q is not key=value", ErrBadConfig, line, text)
		}
		props[strings.TrimSpace(text[:i])] = strings.TrimSpace(text[i+1:])
		return nil
	}
	for sc.Scan() {
		line++
		text := strings.TrimLeft(sc.Text(), " \t\f")
		if !continued && (text == "" || text[0] == '#' || text[0] == '!') {
			continue
		}
		// An odd number of trailing backslashes continues the line; an even one is escaped.
		trailing := len(text) - len(strings.TrimRight(text, "\\"))
		if continued = trailing%2 == 1; continued {
			pending += text[:len(text)-1]
			continue
		}
		if err := add(pending + text); err != nil {
			return nil, err
		}
		pending = ""
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bookie: read config: %w", err)
	}
	// A continuation on the last line ends at the end of the file (java.util.Properties).
	if continued {
		if err := add(pending); err != nil {
			return nil, err
		}
	}
	return props, nil
}

// ReadProperties reads a properties file (ParseProperties).
func ReadProperties(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	defer f.Close()
	return ParseProperties(f)
}

// Apply sets the properties on c. A bad value is an error naming the key; an unknown key is a
// warning (returned, not fatal). Apply props as one set: journalDirectory, deprecated, counts
// only when the same set has no journalDirectories (BookKeeper's rule).
func (c *Config) Apply(props map[string]string) (warnings []string, err error) {
	_, token := props["bookieAuthToken"]
	_, tokenFile := props["bookieAuthTokenFile"]
	if token && tokenFile {
		// Applied in key order, the file would silently win.
		return nil, fmt.Errorf("%w: bookieAuthToken and bookieAuthTokenFile are both set: set one", ErrBadConfig)
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := props[k]
		if _, ok := props["journalDirectories"]; ok && k == "journalDirectory" {
			warnings = append(warnings, fmt.Sprintf("journalDirectory=%q ignored: journalDirectories is set", v))
			continue
		}
		set, ok := Keys[k]
		if !ok {
			if !slices.Contains(ignoredKeys, k) {
				warnings = append(warnings, fmt.Sprintf("unknown configuration key %q ignored", k))
			}
			continue
		}
		if err := set(c, v); err != nil {
			return warnings, fmt.Errorf("%w: %s=%q: %v", ErrBadConfig, k, v, err)
		}
	}
	return warnings, nil
}

// LoadFile reads a properties file onto c.
func (c *Config) LoadFile(path string) (warnings []string, err error) {
	props, err := ReadProperties(path)
	if err != nil {
		return nil, err
	}
	return c.Apply(props)
}

// MemoryBudget is the memory the bookie's configured bounds let it hold: the write cache, the
// read-ahead cache, each ledger dir's index block cache, and the read responses not yet
// written to sockets (maxUnwrittenReadBytes). The process's garbage-collection limit starts
// from it (cmd/ringkeeper). Not in it: pebble's memtables (up to two of 64 MiB per ledger dir),
// which a cgo build allocates outside the Go heap, and the per-connection and in-progress
// bounds, which the limit's fixed headroom covers.
func (c *Config) MemoryBudget() int64 {
	srv := c.Server
	srv.EnsureDefaults() // maxUnwrittenReadBytes=0 is the server's default, not 0 bytes
	return c.Engine.WriteCacheMaxSize + c.Engine.ReadAheadCacheMaxSize +
		c.Engine.IndexBlockCacheSize*int64(len(c.Engine.LedgerDirs)) + int64(srv.MaxUnwrittenReadBytes)
}
