package bookie

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/metadata"
	_ "github.com/ringkeeper/ringkeeper/metadata/etcd" // the etcd:// driver
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server"
)

// Bookie is one running bookie: storage engine, network server, registration in the metadata
// store, disk checker, metrics and admin HTTP.
type Bookie struct {
	cfg      Config
	log      *slog.Logger
	id       string
	md       metadata.Driver
	eng      *engine.Engine
	srv      *server.Server
	reg      metadata.Registration
	registry *prometheus.Registry
	http     *http.Server
	httpAddr string
	metrics  *metrics

	// state guards registration updates: the disk checker and admin calls move the bookie
	// between writable and read-only.
	stateMu  sync.Mutex
	readOnly atomic.Bool
	// forcedReadOnly is set by an operator: the disk checker does not turn it writable.
	forcedReadOnly atomic.Bool
	// storageFailed: the engine or a journal failed (sticky): read-only until restart.
	storageFailed atomic.Bool
	// regStale says the registration does not show the current mode: its update failed (the
	// metadata store was unreachable), and the disk checker retries it.
	regStale atomic.Bool

	stop    chan struct{}
	done    sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
	// stopped is closed once Close has run; fatalErr says why the bookie stopped itself.
	stopped  chan struct{}
	fatalErr atomic.Pointer[error]
}

// ID returns the bookie id (host:port).
func (b *Bookie) ID() string { return b.id }

// Addr is the address of the plaintext port.
func (b *Bookie) Addr() net.Addr { return b.srv.Addr() }

// TLSAddr is the address of the TLS port, or nil.
func (b *Bookie) TLSAddr() net.Addr { return b.srv.TLSAddr() }

// HTTPAddr is the address of the metrics and admin HTTP server, or "".
func (b *Bookie) HTTPAddr() string { return b.httpAddr }

// Engine returns the storage engine.
func (b *Bookie) Engine() *engine.Engine { return b.eng }

// ErrorCode maps storage errors to BookKeeper return codes.
func ErrorCode(err error) protocol.ReturnCode {
	switch {
	case errors.Is(err, engine.ErrNoLedger):
		return protocol.ENOLEDGER
	case errors.Is(err, engine.ErrNoEntry):
		return protocol.ENOENTRY
	case errors.Is(err, engine.ErrUnauthorized):
		return protocol.EUA
	case errors.Is(err, engine.ErrFenced):
		return protocol.EFENCED
	case errors.Is(err, engine.ErrTooManyRequests), errors.Is(err, server.ErrTooManyAdds):
		return protocol.ETOOMANYREQUESTS
	case errors.Is(err, engine.ErrReadOnly):
		return protocol.EREADONLY
	case errors.Is(err, engine.ErrBadEntry):
		return protocol.EBADREQ
	}
	return protocol.EIO
}

// Start brings a bookie up: it connects to the metadata store, checks cookies (local and in
// the store), opens the engine (which replays the journal and checkpoints), starts serving,
// and only then registers as writable (or read-only if the disk is full).
func Start(ctx context.Context, cfg Config) (_ *Bookie, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Bookie{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), stopped: make(chan struct{}),
		registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			b.Close(context.Background())
		}
	}()
	if b.id, err = bookieID(cfg); err != nil {
		return nil, err
	}
	b.log = b.log.With("bookie", b.id)
	if b.md, err = metadata.Open(ctx, cfg.MetadataServiceURI, metadata.Options{Logger: b.log}); err != nil {
		return nil, err
	}
	instance, err := b.md.InstanceID(ctx)
	if err != nil {
		return nil, err
	}
	stored, version, err := b.md.Cookies().Read(ctx, b.id)
	if err != nil && !errors.Is(err, metadata.ErrNoSuchCookie) {
		return nil, err
	}
	hasStored := err == nil

	b.metrics = newMetrics(b.registry)
	ecfg := cfg.Engine
	ecfg.BookieID, ecfg.InstanceID = b.id, instance
	ecfg.RequireExistingCookies = hasStored
	ecfg.Logger = b.log
	ecfg.Journal.OnGroup = b.metrics.observeGroup
	ecfg.GC.Checker = ledgerChecker{b.md.Ledgers()}
	ecfg.GC.DiskUsageWarnThreshold = cfg.DiskUsageWarnThreshold
	ecfg.GC.DiskUsageThreshold = cfg.DiskUsageThreshold
	if b.eng, err = engine.Open(ecfg); err != nil {
		return nil, err
	}
	b.metrics.registerEngine(b.registry, b.eng)
	registerGC(b.registry, b.eng)
	// The store's cookie is checked before the bookie serves, and written only once it can (its
	// ports are bound): a start that fails before then leaves no cookie behind for a bookie that
	// never held data.
	local := b.eng.Cookie()
	cookie := local.Encode()
	storeCookie := !hasStored
	if hasStored && string(stored) != string(cookie) {
		remote, perr := engine.ParseCookie(stored)
		switch {
		case perr != nil || remote.InstanceID != local.InstanceID || remote.BookieID != local.BookieID:
			return nil, fmt.Errorf("%w: the metadata store's cookie for %s (version %d) does not match the local one; "+
				"this bookie id belongs to another bookie or cluster", engine.ErrCookie, b.id, version)
		case remote.Diff(local) != "":
			// BookKeeper's rule: the dirs are those the store's cookie names, or the bookie would
			// serve another set of dirs' data (an older run's) as its own.
			return nil, fmt.Errorf("%w: the metadata store's cookie for %s (version %d) holds %s: the bookie last "+
				"ran on other directories. Point it at those, or decommission the data of these",
				engine.ErrCookie, b.id, version, remote.Diff(local))
		}
		storeCookie = true // the same dirs spelt otherwise (an older version's cookie): record them as named now
	}

	scfg := cfg.Server
	scfg.Addr = net.JoinHostPort(cfg.ListenAddress, strconv.Itoa(cfg.BookiePort))
	if cfg.TLSPort != 0 {
		scfg.TLSAddr = net.JoinHostPort(cfg.ListenAddress, strconv.Itoa(cfg.TLSPort))
		if scfg.TLSConfig, err = server.LoadTLSConfig(cfg.TLSCertificatePath, cfg.TLSKeyPath, cfg.TLSTrustStorePath, cfg.TLSClientAuthentication); err != nil {
			return nil, err
		}
		// Client certificates required: the plaintext port must not serve clients without one.
		scfg.PlaintextRefused = cfg.TLSClientAuthentication
		if len(cfg.AuthorizedRoles) > 0 {
			scfg.AuthorizeCertificate = server.AuthorizeRoles(cfg.AuthorizedRoles)
		}
	}
	if cfg.AuthToken != "" {
		scfg.Auth = server.NewTokenAuth("", []byte(cfg.AuthToken))
	}
	scfg.ErrorCode = ErrorCode
	scfg.Logger = b.log
	scfg.Metrics = server.NewMetrics(b.registry)
	if b.srv, err = server.New(scfg, b.eng); err != nil {
		return nil, err
	}
	if err := b.srv.Start(); err != nil {
		return nil, fmt.Errorf("bookie: listen on %s: %w", scfg.Addr, err)
	}
	if cfg.PrometheusStatsHTTPPort != 0 {
		if err := b.startHTTP(); err != nil {
			return nil, err
		}
	}
	if storeCookie {
		if hasStored {
			_, err = b.md.Cookies().Write(ctx, b.id, cookie, version)
		} else {
			_, err = b.md.Cookies().Write(ctx, b.id, cookie, metadata.NoVersion)
		}
		if err != nil {
			return nil, fmt.Errorf("bookie: store cookie: %w", err)
		}
	}
	// The first state is known before registering.
	if err := b.checkDisk(); err != nil {
		return nil, err
	}
	info := b.info()
	reg, err := b.md.Bookies().Register(ctx, info, cfg.RegistrationTTL)
	if err != nil {
		return nil, fmt.Errorf("bookie: register: %w", err)
	}
	// The admin API serves already: an operator may have changed the mode since info was taken
	// (Register waits while a previous process's lease on the id lives). The registration must
	// show the mode now; a failed update is retried by the disk checker.
	b.stateMu.Lock()
	b.reg = reg
	if b.readOnly.Load() != (info.State == metadata.BookieReadOnly) {
		b.updateRegistrationLocked()
	}
	info.State = b.info().State
	b.stateMu.Unlock()
	b.done.Go(b.runDiskChecker)
	b.log.Info("bookie ready", "addr", b.srv.Addr().String(), "state", info.State, "ledgers", b.eng.Ledgers())
	return b, nil
}

// bookieID is bookieId, or advertisedAddress (else the address bound, listeningInterface's
// included, else this host's address) with bookiePort.
func bookieID(cfg Config) (string, error) {
	if cfg.BookieID != "" {
		return cfg.BookieID, metadata.ValidateBookieID(cfg.BookieID)
	}
	host := cfg.AdvertisedAddress
	if host == "" {
		host = cfg.ListenAddress
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = localAddress()
	}
	id := net.JoinHostPort(host, strconv.Itoa(cfg.BookiePort))
	return id, metadata.ValidateBookieID(id)
}

// localAddress is the first non-loopback IPv4 address, else 127.0.0.1.
func localAddress() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

func (b *Bookie) info() metadata.BookieInfo {
	_, free, total, _ := b.eng.Usage()
	state := metadata.BookieWritable
	if b.readOnly.Load() {
		state = metadata.BookieReadOnly
	}
	host, port, _ := net.SplitHostPort(b.id)
	p, _ := strconv.Atoi(port)
	eps := []metadata.Endpoint{{ID: metadata.EndpointBookie, Protocol: "bookie-rpc", Host: host, Port: p}}
	if a := b.srv.TLSAddr(); a != nil {
		eps = append(eps, metadata.Endpoint{ID: metadata.EndpointBookieTLS, Protocol: "bookie-rpc+tls", Host: host, Port: a.(*net.TCPAddr).Port})
	}
	if b.httpAddr != "" {
		_, hp, _ := net.SplitHostPort(b.httpAddr)
		n, _ := strconv.Atoi(hp)
		eps = append(eps, metadata.Endpoint{ID: metadata.EndpointHTTP, Protocol: "http", Host: host, Port: n})
	}
	return metadata.BookieInfo{ID: b.id, State: state, Endpoints: eps, FreeDiskBytes: free, TotalDiskBytes: total}
}

// ErrDisksFull: the ledger disks are above diskUsageThreshold and readOnlyModeEnabled=false,
// so the bookie stops (BookKeeper shuts down) instead of turning read-only.
var ErrDisksFull = errors.New("bookie: ledger disks full (above diskUsageThreshold) and readOnlyModeEnabled=false: shutting down instead of turning read-only")

// ErrReadOnlyModeDisabled: read-only mode was asked for, but readOnlyModeEnabled=false.
var ErrReadOnlyModeDisabled = errors.New("bookie: readOnlyModeEnabled=false: read-only mode is disabled")

// checkDisk applies the disk thresholds: read-only above diskUsageThreshold, writable again
// below diskUsageLwmThreshold; no adds at all once free space is below one entry log. With
// readOnlyModeEnabled=false, a disk above the threshold is ErrDisksFull: the bookie must stop.
func (b *Bookie) checkDisk() error {
	usage, free, _, err := b.eng.Usage()
	if err != nil {
		b.log.Warn("disk usage check failed", "err", err)
		return nil
	}
	b.metrics.diskUsage.Set(usage)
	b.eng.SetDiskFull(free < uint64(b.cfg.Engine.EntryLogSizeLimit)/4)
	switch {
	case usage >= b.cfg.DiskUsageThreshold && !b.readOnly.Load():
		if !b.cfg.ReadOnlyModeEnabled {
			return fmt.Errorf("%w (usage %.3f, threshold %.3f)", ErrDisksFull, usage, b.cfg.DiskUsageThreshold)
		}
		b.log.Warn("disk usage above diskUsageThreshold: turning read-only", "usage", usage, "threshold", b.cfg.DiskUsageThreshold)
		b.setReadOnly(true)
	case usage < b.cfg.DiskUsageLwmThreshold && b.readOnly.Load() && !b.forcedReadOnly.Load() && !b.storageFailed.Load():
		b.log.Info("disk usage below diskUsageLwmThreshold: writable again", "usage", usage)
		b.setReadOnly(false)
	case usage >= b.cfg.DiskUsageWarnThreshold:
		b.log.Warn("disk usage above diskUsageWarnThreshold", "usage", usage)
	}
	return nil
}

// checkStorage turns the bookie read-only for good once its storage failed: every add fails
// there (a write or fsync error is sticky), and a bookie registered writable would go on being
// picked for new ensembles, each add to it failing into an ensemble change. Reads go on. With
// readOnlyModeEnabled=false it returns the failure instead: BookKeeper shuts down on every
// transition to read-only then, and on fatal storage errors anyway.
func (b *Bookie) checkStorage() error {
	if b.storageFailed.Load() {
		return nil
	}
	err := b.eng.Failure()
	if err == nil {
		return nil
	}
	if !b.cfg.ReadOnlyModeEnabled {
		return fmt.Errorf("bookie: storage failed and readOnlyModeEnabled=false: shutting down: %w", err)
	}
	b.log.Error("storage failed: read-only until restart (reads still served)", "err", err)
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	b.storageFailed.Store(true)
	b.setReadOnlyLocked(true)
	return nil
}

// ErrStorageFailed: the bookie cannot be made writable, its storage failed.
var ErrStorageFailed = errors.New("bookie: storage failed; read-only until restart")

// setReadOnly switches modes and moves the registration, unless an operator forced read-only
// mode or the storage failed, and ro is false.
func (b *Bookie) setReadOnly(ro bool) error {
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	if !ro && (b.forcedReadOnly.Load() || b.storageFailed.Load()) {
		return nil // the disk check read the state before an operator forced read-only mode
	}
	return b.setReadOnlyLocked(ro)
}

func (b *Bookie) setReadOnlyLocked(ro bool) error {
	b.readOnly.Store(ro)
	b.eng.SetReadOnly(ro)
	return b.updateRegistrationLocked()
}

// updateRegistrationLocked moves the registration to the current mode. When the metadata store
// does not take it, clients would go on picking a read-only bookie (or not pick a writable
// one): it is marked stale and the disk checker retries it every diskCheckInterval.
func (b *Bookie) updateRegistrationLocked() error {
	if b.reg == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.reg.Update(ctx, b.info()); err != nil {
		if !b.regStale.Swap(true) {
			b.log.Warn("update registration failed; retrying every diskCheckInterval", "err", err)
		}
		return fmt.Errorf("bookie: the mode changed, but the registration does not show it yet (retried): %w", err)
	}
	if b.regStale.Swap(false) {
		b.log.Info("registration updated")
	}
	return nil
}

// SetReadOnly forces read-only mode on (until SetReadOnly(false)), as an operator would. The
// mode changes at once; an error says the registration does not show it yet (it is retried).
func (b *Bookie) SetReadOnly(ro bool) error {
	if ro && !b.cfg.ReadOnlyModeEnabled {
		return ErrReadOnlyModeDisabled // BookKeeper's admin API refuses it too (400)
	}
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	if !ro && b.storageFailed.Load() {
		return ErrStorageFailed
	}
	b.forcedReadOnly.Store(ro)
	return b.setReadOnlyLocked(ro)
}

// ReadOnly reports the bookie's mode.
func (b *Bookie) ReadOnly() bool { return b.readOnly.Load() }

func (b *Bookie) runDiskChecker() {
	t := time.NewTicker(b.cfg.DiskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			err := b.checkStorage()
			if err == nil {
				err = b.checkDisk()
			}
			if err != nil {
				b.fail(err)
				return
			}
			if b.regStale.Load() {
				b.stateMu.Lock()
				b.updateRegistrationLocked()
				b.stateMu.Unlock()
			}
		}
	}
}

// fail stops the bookie on a fatal error: it is logged, Err returns it, and Done is closed
// once the shutdown is over. The owner (ringkeeper bookie) exits on it; the library does not.
func (b *Bookie) fail(err error) {
	if !b.fatalErr.CompareAndSwap(nil, &err) {
		return
	}
	b.log.Error("fatal error: shutting down", "err", err)
	go func() { // not in b.done: Close waits for it, and this is called from the disk checker
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cerr := b.Close(ctx); cerr != nil {
			b.log.Warn("shutdown after a fatal error", "err", cerr)
		}
	}()
}

// Done is closed once the bookie has stopped: Close was called, or it stopped itself on a
// fatal error (Err says which).
func (b *Bookie) Done() <-chan struct{} { return b.stopped }

// Err is the fatal error the bookie stopped itself on, or nil.
func (b *Bookie) Err() error {
	if p := b.fatalErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Close shuts down gracefully: deregister (clients stop choosing this bookie), stop the server
// (in-flight requests finish within ctx), close the engine (journal drained, last checkpoint),
// close the metadata driver.
func (b *Bookie) Close(ctx context.Context) error {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	close(b.stop)
	b.done.Wait()
	var errs []error
	if b.reg != nil {
		errs = append(errs, b.reg.Close(ctx))
	}
	if b.srv != nil {
		errs = append(errs, b.srv.Stop(ctx))
	}
	if b.http != nil {
		errs = append(errs, b.http.Shutdown(ctx))
	}
	if b.eng != nil {
		errs = append(errs, b.eng.Close())
	}
	if b.md != nil {
		errs = append(errs, b.md.Close())
	}
	close(b.stopped)
	return errors.Join(errs...)
}
