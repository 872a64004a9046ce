package journal

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// span is a byte range [start, end) of a file.
type span struct{ start, end int64 }

// spanSet is a sorted set of disjoint, non-adjacent spans.
type spanSet []span

func (s spanSet) add(a span) spanSet {
	var out spanSet
	for _, b := range s {
		if b.end < a.start || a.end < b.start {
			out = append(out, b)
			continue
		}
		a = span{min(a.start, b.start), max(a.end, b.end)}
	}
	out = append(out, a)
	slices.SortFunc(out, func(x, y span) int { return int(x.start - y.start) })
	return out
}

func (s spanSet) sub(a span) spanSet {
	var out spanSet
	for _, b := range s {
		if b.end <= a.start || a.end <= b.start {
			out = append(out, b)
			continue
		}
		if b.start < a.start {
			out = append(out, span{b.start, a.start})
		}
		if a.end < b.end {
			out = append(out, span{a.end, b.end})
		}
	}
	return out
}

// prefix is the offset below which every byte is in s.
func (s spanSet) prefix() int64 {
	if len(s) > 0 && s[0].start == 0 {
		return s[0].end
	}
	return 0
}

func (s spanSet) covers(a span) bool {
	for _, b := range s {
		if b.start <= a.start && a.end <= b.end {
			return true
		}
	}
	return false
}

// durFile is what ackChecker knows of one file (inode): which bytes hold durable content, and
// the completed writes not yet made durable.
type durFile struct {
	path    string
	durable spanSet
	pending []pendingWrite
}

type pendingWrite struct {
	span
	seq     uint64
	records bool // holds journal records (a group), not zeros or a header
}

// recLoc is where a record was written.
type recLoc struct {
	f       *durFile
	at      span
	written bool // the write that holds it returned
}

// ackChecker is a diskio.FS over Mem that models durability as the seam defines it: a
// completed SyncData/Sync makes every write that completed before it started durable; a
// WriteAtDataSync (RWF_DSYNC, a FUA write) makes only its own bytes durable. It parses every
// group the journal writes to learn where each record lies, and checks at every
// acknowledgement that the record's bytes are durable (journalSyncData on) or at least written
// (off), and that the LastLogMark never passes the durable prefix of its file.
type ackChecker struct {
	inner    diskio.FS
	syncData bool
	mark     atomic.Pointer[Journal]

	mu         sync.Mutex
	seq        uint64
	files      map[string]*durFile
	locs       map[key]*recLoc
	acks       int
	violations []string
}

func newAckChecker(inner diskio.FS, syncData bool) *ackChecker {
	return &ackChecker{inner: inner, syncData: syncData, files: make(map[string]*durFile), locs: make(map[key]*recLoc)}
}

func (c *ackChecker) violate(format string, args ...any) {
	if len(c.violations) < 20 {
		c.violations = append(c.violations, fmt.Sprintf(format, args...))
	}
}

// ack checks one acknowledgement (a Done with err == nil).
func (c *ackChecker) ack(k key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.acks++
	l := c.locs[k]
	switch {
	case l == nil:
		c.violate("record %v acknowledged, never written", k)
	case !l.written:
		c.violate("record %v acknowledged before its write at %s [%d,%d) returned", k, l.f.path, l.at.start, l.at.end)
	case c.syncData && !l.f.durable.covers(l.at):
		c.violate("record %v acknowledged at %s [%d,%d), durable prefix %d: not durable",
			k, l.f.path, l.at.start, l.at.end, l.f.durable.prefix())
	}
	if j := c.mark.Load(); j != nil {
		c.checkMarkLocked(j.LastLogMark())
	}
}

// checkMarkLocked checks that every byte before the mark is durable. Durable prefixes only grow
// while a file is written, so reading the mark before the prefix makes the check sound.
func (c *ackChecker) checkMarkLocked(m Mark) {
	f := c.files[filepath.Join("/j", FileName(m.FileID))]
	if f == nil {
		c.violate("mark %v names an unknown file", m)
		return
	}
	if p := f.durable.prefix(); m.Offset > p {
		c.violate("mark %v passes the durable prefix %d of %s", m, p, f.path)
	}
}

func (c *ackChecker) Create(name string, opts diskio.Options) (diskio.File, error) {
	f, err := c.inner.Create(name, opts)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	df := &durFile{path: name}
	c.files[name] = df
	return &ackFile{File: f, c: c, df: df}, nil
}

func (c *ackChecker) Open(name string, opts diskio.Options) (diskio.File, error) {
	f, err := c.inner.Open(name, opts)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	df := c.files[name]
	if df == nil {
		return nil, fmt.Errorf("ackChecker: open of %s, not created through the checker", name)
	}
	return &ackFile{File: f, c: c, df: df}, nil
}

func (c *ackChecker) Remove(name string) error {
	if err := c.inner.Remove(name); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.files, name)
	c.mu.Unlock()
	return nil
}

func (c *ackChecker) Rename(oldname, newname string) error {
	if err := c.inner.Rename(oldname, newname); err != nil {
		return err
	}
	c.mu.Lock()
	if df := c.files[oldname]; df != nil {
		delete(c.files, oldname)
		df.path = newname
		c.files[newname] = df
	}
	c.mu.Unlock()
	return nil
}

func (c *ackChecker) MkdirAll(dir string) error                { return c.inner.MkdirAll(dir) }
func (c *ackChecker) List(dir string) ([]string, error)        { return c.inner.List(dir) }
func (c *ackChecker) SyncDir(dir string) error                 { return c.inner.SyncDir(dir) }
func (c *ackChecker) Alignment(dir string) int                 { return c.inner.Alignment(dir) }
func (c *ackChecker) Usage(dir string) (uint64, uint64, error) { return c.inner.Usage(dir) }
func (c *ackChecker) Lock(dir string) (func() error, error)    { return c.inner.Lock(dir) }

type ackFile struct {
	diskio.File
	c  *ackChecker
	df *durFile
}

// beginWrite notes a write of p at off before it reaches the file: the bytes it replaces are no
// longer durable content, and the records in it (a group) get their locations. It checks the
// group's durable claim and that no other file still has unsynced groups (a file is written
// only after the previous one is wholly durable).
func (f *ackFile) beginWrite(p []byte, off int64) (recs []key, isGroup bool) {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	at := span{off, off + int64(len(p))}
	f.df.durable = f.df.durable.sub(at)
	id, ok := ParseFileName(filepath.Base(f.df.path))
	if !ok || off == 0 {
		return nil, false // not a journal file, or a file header
	}
	salt := fileSalt(id)
	for pos := 0; pos < len(p); {
		h, _, size, err := decodeRecord(p[pos:], salt, len(p))
		if err != nil {
			break // zeros (preallocation)
		}
		isGroup = true
		switch h.typ {
		case RecordData:
			k := key{int64(h.ledgerID), int64(h.entryID)}
			if c.locs[k] != nil {
				c.violate("record %v written twice", k)
			}
			c.locs[k] = &recLoc{f: f.df, at: span{off + int64(pos), off + int64(pos+size)}}
			recs = append(recs, k)
		case recordPadding:
			if claim := int64(h.ledgerID); claim > f.df.durable.prefix() {
				c.violate("group at %s %d claims durable end %d, durable prefix is %d", f.df.path, off, claim, f.df.durable.prefix())
			}
		}
		pos += size
	}
	if isGroup {
		for _, o := range c.files {
			if o == f.df {
				continue
			}
			for _, w := range o.pending {
				if w.records {
					c.violate("group written to %s at %d while %s has an unsynced group at %d", f.df.path, off, o.path, w.start)
				}
			}
		}
	}
	return recs, isGroup
}

// endWrite notes a completed write: pending until a sync covers it.
func (f *ackFile) endWrite(p []byte, off int64, recs []key, isGroup bool) uint64 {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	f.df.pending = append(f.df.pending, pendingWrite{span{off, off + int64(len(p))}, c.seq, isGroup})
	for _, k := range recs {
		c.locs[k].written = true
	}
	return c.seq
}

// settle makes the pending writes that durable selects durable; bytes that a later,
// still-pending write replaced stay non-durable (an earlier pending write does not matter:
// its bytes were replaced).
func (f *ackFile) settle(durable func(pendingWrite) bool) {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	df := f.df
	var done, rest []pendingWrite
	for _, w := range df.pending {
		if durable(w) {
			done = append(done, w)
		} else {
			rest = append(rest, w)
		}
	}
	df.pending = rest
	for _, w := range done {
		df.durable = df.durable.add(w.span)
		for _, r := range rest {
			if r.seq > w.seq {
				df.durable = df.durable.sub(r.span)
			}
		}
	}
}

// jitter delays some operations a little, as a device would, so that pipelined writes and
// syncs complete in varied orders (Mem completes each at once).
func jitter() {
	if rand.IntN(4) == 0 {
		time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
	}
}

func (f *ackFile) WriteAt(p []byte, off int64) (int, error) {
	recs, isGroup := f.beginWrite(p, off)
	jitter()
	n, err := f.File.WriteAt(p, off)
	if err == nil {
		f.endWrite(p, off, recs, isGroup)
	}
	return n, err
}

// WriteAtDataSync models RWF_DSYNC: only this write becomes durable. (Mem has no such call; a
// full SyncData stands in, and the model credits only these bytes.)
func (f *ackFile) WriteAtDataSync(p []byte, off int64) error {
	recs, isGroup := f.beginWrite(p, off)
	jitter()
	if _, err := f.File.WriteAt(p, off); err != nil {
		return err
	}
	seq := f.endWrite(p, off, recs, isGroup)
	if err := f.File.SyncData(); err != nil {
		return err
	}
	f.settle(func(w pendingWrite) bool { return w.seq == seq })
	return nil
}

func (f *ackFile) sync(inner func() error) error {
	f.c.mu.Lock()
	upto := f.c.seq
	f.c.mu.Unlock()
	jitter()
	if err := inner(); err != nil {
		return err
	}
	f.settle(func(w pendingWrite) bool { return w.seq <= upto })
	return nil
}

func (f *ackFile) SyncData() error { return f.sync(f.File.SyncData) }
func (f *ackFile) Sync() error     { return f.sync(f.File.Sync) }

// TestAckAfterSync checks the ack-after-sync invariant (reliability §5.3) over the real writer:
// with journalSyncData on, no record is acknowledged before a completed sync (or RWF_DSYNC
// write) covers its bytes; with it off, none before its write returned. In both, the
// LastLogMark never passes a file's durable prefix, a group's durable claim is true when it is
// written, and no group goes to a new file while the previous one has unsynced groups.
// Pipelining, small groups, frequent rollovers and file reuse are on.
func TestAckAfterSync(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	perWriter := 1500
	if testing.Short() {
		perWriter = 400
	}
	for _, syncData := range []bool{true, false} {
		for depth := 2; depth <= 4; depth++ {
			for _, flushEmpty := range []bool{true, false} {
				name := fmt.Sprintf("syncData=%v/depth=%d/flushWhenQueueEmpty=%v", syncData, depth, flushEmpty)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, uint64(depth)))
					checkAckAfterSync(t, rng, syncData, depth, flushEmpty, perWriter)
				})
			}
		}
	}
}

func checkAckAfterSync(t *testing.T, rng *rand.Rand, syncData bool, depth int, flushEmpty bool, perWriter int) {
	c := newAckChecker(diskio.NewMem(4096), syncData)
	cfg := DefaultConfig("/j")
	cfg.FS = c
	cfg.SyncData = syncData
	cfg.PageCacheFlushInterval = time.Duration(100+rng.IntN(900)) * time.Microsecond
	cfg.PipelineDepth = depth
	cfg.FlushWhenQueueEmpty = flushEmpty
	cfg.MaxGroupWait = time.Duration(50+rng.IntN(200)) * time.Microsecond
	cfg.MaxRecordSize = 4 << 10
	cfg.BufferedWritesThreshold = 8 << 10
	cfg.MaxFileSize = 128 << 10 // a rollover every few groups
	cfg.MaxBackups = 0
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.mark.Store(j)
	// Collect files behind the in-memory mark as checkpoints would, so that files are reused.
	stopGC := make(chan struct{})
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		for {
			select {
			case <-stopGC:
				return
			case <-time.After(200 * time.Microsecond):
				j.GC(j.LastLogMark())
			}
		}
	}()
	const writers = 4
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range writers {
		pause := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
		wg.Go(func() {
			ledger := int64(w + 1)
			var done sync.WaitGroup
			for entry := range int64(perWriter) {
				done.Add(1)
				e := &Entry{Type: RecordData, LedgerID: ledger, EntryID: entry,
					Payload: testPayload(ledger, entry, payloadSize(ledger, entry)),
					Done: func(e *Entry, err error) {
						defer done.Done()
						if err != nil {
							failed.Add(1)
							return
						}
						c.ack(key{e.LedgerID, e.EntryID})
					}}
				if err := j.Append(e); err != nil {
					t.Errorf("append: %v", err)
					done.Done()
					return
				}
				if entry%32 == 0 {
					time.Sleep(time.Duration(pause.IntN(300)) * time.Microsecond)
				}
			}
			done.Wait()
		})
	}
	wg.Wait()
	close(stopGC)
	<-gcDone
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.violations {
		t.Error(v)
	}
	st := j.Stats()
	if failed.Load() != 0 || c.acks != writers*perWriter {
		t.Fatalf("%d acknowledgements checked, %d failed, want %d", c.acks, failed.Load(), writers*perWriter)
	}
	if st.FilesCreated.Load()+st.FilesReused.Load() < 4 || st.FilesReused.Load() == 0 {
		t.Fatalf("%d files created, %d reused: too few rollovers to prove anything", st.FilesCreated.Load(), st.FilesReused.Load())
	}
	t.Logf("%d acks checked over %d groups, %d syncs, %d files created, %d reused",
		c.acks, st.Groups.Load(), st.Syncs.Load(), st.FilesCreated.Load(), st.FilesReused.Load())
}
