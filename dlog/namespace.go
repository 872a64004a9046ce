package dlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// Namespace is a set of named logs on one cluster: the logs' metadata lives in the cluster's
// metadata service (its KV keyspace), their records in ledgers. It is safe for concurrent
// use.
type Namespace struct {
	cl    *client.Client
	owned bool
	kv    metadata.KV
	cfg   Config
	// ignoreLockLoss (tests) makes writers carry on after losing their lock, so that only
	// ledger fencing stops them.
	ignoreLockLoss bool
	// afterDeleteBatch (tests) runs in DeleteLog after each batch of segments is deleted.
	afterDeleteBatch func()
}

// OpenNamespace connects a new client to the metadata service at uri (e.g.
// etcd://127.0.0.1:2379/ledgers) and binds a namespace to it; Close closes the client.
func OpenNamespace(ctx context.Context, uri string, cfg Config) (*Namespace, error) {
	ccfg := client.DefaultConfig(uri)
	ccfg.Logger = cfg.Logger
	cl, err := client.New(ctx, ccfg)
	if err != nil {
		return nil, err
	}
	ns, err := NewNamespace(cl, cfg)
	if err != nil {
		cl.Close()
		return nil, err
	}
	ns.owned = true
	return ns, nil
}

// NewNamespace binds a namespace to an open client, which Close leaves open.
func NewNamespace(cl *client.Client, cfg Config) (*Namespace, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kv, err := metadata.KVOf(cl.Metadata())
	if err != nil {
		return nil, fmt.Errorf("dlog: %w", err)
	}
	return &Namespace{cl: cl, kv: kv, cfg: cfg}, nil
}

// Client returns the namespace's ledger client.
func (ns *Namespace) Client() *client.Client { return ns.cl }

// Config returns the namespace's configuration (with defaults filled in).
func (ns *Namespace) Config() Config { return ns.cfg }

// Close closes the client if OpenNamespace opened it. Close writers and readers first.
func (ns *Namespace) Close() error {
	if ns.owned {
		return ns.cl.Close()
	}
	return nil
}

// CreateLog creates an empty log; ErrLogExists if there is one of that name.
func (ns *Namespace) CreateLog(ctx context.Context, name string) (*Log, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	_, err := ns.kv.Commit(ctx, nil, metadata.Put(logKey(name), encodeLog(newLogMeta(time.Now())), metadata.NoVersion))
	if errors.Is(err, metadata.ErrBadVersion) {
		return nil, fmt.Errorf("%w: %s", ErrLogExists, name)
	}
	if err != nil {
		return nil, fmt.Errorf("dlog: create log %s: %w", name, err)
	}
	return &Log{ns: ns, name: name}, nil
}

// OpenLog returns the log called name; ErrNoSuchLog if there is none.
func (ns *Namespace) OpenLog(ctx context.Context, name string) (*Log, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	l := &Log{ns: ns, name: name}
	if _, _, err := l.readMeta(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// LogExists reports whether a log called name exists.
func (ns *Namespace) LogExists(ctx context.Context, name string) (bool, error) {
	_, err := ns.OpenLog(ctx, name)
	if errors.Is(err, ErrNoSuchLog) {
		return false, nil
	}
	return err == nil, err
}

// ListLogs returns the names of the namespace's logs, sorted.
func (ns *Namespace) ListLogs(ctx context.Context) ([]string, error) {
	var names []string
	after := ""
	for {
		page, more, err := ns.kv.List(ctx, logsPrefix, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("dlog: list logs: %w", err)
		}
		for _, kv := range page {
			names = append(names, strings.TrimPrefix(kv.Key, logsPrefix))
		}
		if !more || len(page) == 0 {
			return names, nil
		}
		after = page[len(page)-1].Key
	}
}

// DeleteLog deletes a log: its segments' ledgers and all its metadata. It takes the log's
// ownership lock first, so it waits (until ctx is done) while a writer has the log open, and
// fences the segments a previous writer left in progress. Readers of the log fail afterwards
// with ErrNoSuchLog (ErrTruncated while the delete runs).
func (ns *Namespace) DeleteLog(ctx context.Context, name string) error {
	l, err := ns.OpenLog(ctx, name)
	if err != nil {
		return err
	}
	lock, err := ns.kv.Lock(ctx, lockName(name), ns.cfg.LockTTL)
	if err != nil {
		return fmt.Errorf("dlog: delete log %s: take the writer lock: %w", name, err)
	}
	defer lock.Unlock(context.WithoutCancel(ctx))
	meta, version, err := l.readMeta(ctx)
	if err != nil {
		return err
	}
	segs, err := l.Segments(ctx)
	if err != nil {
		return err
	}
	// Fence the segments left in progress, as a new writer would: a writer that lost its
	// lock without noticing gets no more acknowledgements (the ledger's deletion alone does
	// not stop its bookies from taking adds).
	for _, s := range segs {
		if s.State != InProgress {
			continue
		}
		_, err := ns.cl.OpenLedger(ctx, s.LedgerID, ns.cfg.Password, true)
		if err != nil && !errors.Is(err, client.ErrNoSuchLedger) {
			return fmt.Errorf("dlog: delete log %s: fence segment %d (ledger %d): %w", name, s.SeqNo, s.LedgerID, err)
		}
	}
	// Truncate the whole log first, so that a reader finding a segment gone while the delete
	// runs (or after it stopped half-way) sees it truncated, not a gap (ErrCorrupt).
	if end := (DLSN{SegmentSeqNo: meta.lastSeqNo + 1}); meta.truncation.Less(end) {
		meta.truncation = end
		if version, err = ns.kv.Commit(ctx, lock, metadata.Put(logKey(name), encodeLog(meta), version)); err != nil {
			return fmt.Errorf("dlog: delete log %s: %w", name, err)
		}
	}
	// Segment keys first, a batch at a time (a commit has at most MaxKVOps ops), each batch
	// followed by its ledgers; the log key last, so a half-done delete can be run again.
	for len(segs) > 0 {
		n := min(len(segs), metadata.MaxKVOps)
		ops := make([]metadata.KVOp, n)
		for i, s := range segs[:n] {
			ops[i] = metadata.Delete(segmentKey(name, s.SeqNo), s.version)
		}
		if _, err := ns.kv.Commit(ctx, lock, ops...); err != nil {
			return fmt.Errorf("dlog: delete log %s: %w", name, err)
		}
		for _, s := range segs[:n] {
			ns.deleteLedger(ctx, name, s)
		}
		segs = segs[n:]
		if ns.afterDeleteBatch != nil {
			ns.afterDeleteBatch()
		}
	}
	if _, err := ns.kv.Commit(ctx, lock, metadata.Delete(logKey(name), version)); err != nil {
		return fmt.Errorf("dlog: delete log %s: %w", name, err)
	}
	return nil
}

// deleteLedger deletes a segment's ledger after its metadata is gone; a failure leaves an
// orphaned ledger, which is logged.
func (ns *Namespace) deleteLedger(ctx context.Context, name string, s Segment) {
	err := ns.cl.DeleteLedger(ctx, s.LedgerID)
	if err != nil && !errors.Is(err, client.ErrNoSuchLedger) {
		ns.cfg.Logger.Warn("dlog: could not delete a deleted segment's ledger; it is orphaned",
			"log", name, "segment", s.SeqNo, "ledger", s.LedgerID, "err", err)
	}
}

// Log is a named log of a namespace. It is safe for concurrent use; it holds no resources.
type Log struct {
	ns   *Namespace
	name string
}

// Name returns the log's name.
func (l *Log) Name() string { return l.name }

func (l *Log) readMeta(ctx context.Context) (logMeta, metadata.Version, error) {
	kv, err := l.ns.kv.Get(ctx, logKey(l.name))
	if errors.Is(err, metadata.ErrNoSuchKey) {
		return logMeta{}, 0, fmt.Errorf("%w: %s", ErrNoSuchLog, l.name)
	}
	if err != nil {
		return logMeta{}, 0, fmt.Errorf("dlog: log %s: %w", l.name, err)
	}
	m, err := decodeLog(kv.Value)
	if err != nil {
		return logMeta{}, 0, fmt.Errorf("log %s: %w", l.name, err)
	}
	return m, kv.Version, nil
}

// Segments returns the log's segments in sequence order.
func (l *Log) Segments(ctx context.Context) ([]Segment, error) {
	var segs []Segment
	prefix := segmentPrefix(l.name)
	after := ""
	for {
		page, more, err := l.ns.kv.List(ctx, prefix, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("dlog: log %s: list segments: %w", l.name, err)
		}
		for _, kv := range page {
			s, err := decodeSegment(kv.Value)
			if err != nil {
				return nil, fmt.Errorf("log %s: key %s: %w", l.name, kv.Key, err)
			}
			if kv.Key != segmentKey(l.name, s.SeqNo) {
				return nil, fmt.Errorf("%w: log %s: key %s holds segment %d", ErrCorrupt, l.name, kv.Key, s.SeqNo)
			}
			s.version = kv.Version
			segs = append(segs, s)
		}
		if !more || len(page) == 0 {
			return segs, nil
		}
		after = page[len(page)-1].Key
	}
}

// segment reads one segment's metadata; ok is false if it does not exist.
func (l *Log) segment(ctx context.Context, seq int64) (Segment, bool, error) {
	kv, err := l.ns.kv.Get(ctx, segmentKey(l.name, seq))
	if errors.Is(err, metadata.ErrNoSuchKey) {
		return Segment{}, false, nil
	}
	if err != nil {
		return Segment{}, false, fmt.Errorf("dlog: log %s: segment %d: %w", l.name, seq, err)
	}
	s, err := decodeSegment(kv.Value)
	if err != nil {
		return Segment{}, false, fmt.Errorf("log %s: %w", l.name, err)
	}
	s.version = kv.Version
	return s, true, nil
}

// TruncationPoint returns the log's truncation point: records before it may be deleted.
func (l *Log) TruncationPoint(ctx context.Context) (DLSN, error) {
	m, _, err := l.readMeta(ctx)
	return m.truncation, err
}

// LastTxID returns the highest transaction id of the log's completed segments (-1: none). An
// in-progress segment's records are not counted.
func (l *Log) LastTxID(ctx context.Context) (int64, error) {
	m, _, err := l.readMeta(ctx)
	return m.maxTxID, err
}
