package journal

import (
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// failpoint, set only by the crash tests' child process, is called at the points of a group's
// commit where a kill -9 must lose nothing acknowledged. Unset, it costs a load and a branch
// per group.
var failpoint func(failpointSite)

type failpointSite int

const (
	fpBeforeSubmit failpointSite = iota // the group is laid out, its write not yet submitted
	fpAfterSync                         // its write and sync completed, its callbacks not queued
)

// owner is the state of the writer goroutine. Nothing in it is shared.
type owner struct {
	j        *Journal
	file     *journalFile
	offset   int64 // where the next group starts in file
	free     []*group
	inFlight int
	seq      uint64
	cur      *group
	batch    []*Entry
	next     int // index of the next unconsumed entry in batch
	timer    *time.Timer
	lastSync int64
	// batchNs is when batch was taken: a group's wait counts from when its first record was
	// taken from the queue (one clock read per batch, not per record). batchQueuedNs is when
	// the batch's first record was pushed.
	batchNs       int64
	batchQueuedNs int64
}

// runOwner is the writer goroutine: it drains the queue into groups and submits each group as
// one aligned write plus fdatasync, keeping up to PipelineDepth groups in flight.
func (j *Journal) runOwner(first *journalFile, free []*group) {
	o := &owner{j: j, file: first, offset: first.dataStart, free: free, timer: time.NewTimer(time.Hour)}
	o.timer.Stop()
	o.lastSync = monotime.Now()
	j.groups = append([]*group(nil), free...)
	close(j.groupsReady)
	defer close(j.ownerDone)
	for o.step() {
	}
	for o.inFlight > 0 {
		o.awaitRelease()
	}
	o.failPending(ErrClosed)
	j.ws.Close()
	j.files.release(o.file)
}

// step runs one round of the writer loop; it returns false when the journal is closed and
// everything queued has been handled.
func (o *owner) step() bool {
	j := o.j
	if err := j.Err(); err != nil {
		o.drainFailed(err)
		return !j.q.isClosed() || j.q.length() > 0
	}
	if o.cur == nil && !o.startGroup() {
		return true
	}
	if o.next == len(o.batch) {
		o.batch, o.batchQueuedNs = j.q.take()
		o.next, o.batchNs = 0, monotime.Now()
		j.stats.QueueDepth.Store(int64(len(o.batch)))
	}
	o.fill()
	if len(o.cur.entries) == 0 {
		if j.q.isClosed() && j.q.length() == 0 {
			return false
		}
		select {
		case <-j.q.notify:
		case g := <-j.released:
			o.recycle(g)
		}
		return true
	}
	full := o.next < len(o.batch) || o.cur.used >= j.cfg.BufferedWritesThreshold
	waited := monotime.Now() - o.cur.firstNs
	due := full || j.cfg.FlushWhenQueueEmpty || waited >= int64(j.cfg.MaxGroupWait) || j.q.isClosed()
	if due && o.inFlight < j.cfg.PipelineDepth {
		g := o.cur
		o.cur = nil
		o.commit(g, false)
		return true
	}
	// Wait for a free slot, for more records (while the group has room), or for the group wait.
	var notify <-chan struct{}
	if !full {
		notify = j.q.notify
	}
	var timeout <-chan time.Time
	if !due {
		o.timer.Reset(time.Duration(int64(j.cfg.MaxGroupWait) - waited))
		timeout = o.timer.C
	}
	select {
	case g := <-j.released:
		o.recycle(g)
	case <-notify:
	case <-timeout:
	}
	o.timer.Stop()
	return true
}

// fill copies queued records into the current group while they fit.
func (o *owner) fill() {
	g, salt := o.cur, o.file.salt
	for o.next < len(o.batch) {
		e := o.batch[o.next]
		if g.used+2*recordHeaderSize+len(e.Payload) > len(g.buf) {
			return
		}
		if len(g.entries) == 0 {
			g.firstNs, g.queuedNs = o.batchNs, o.batchQueuedNs
		}
		g.used += appendRecord(g.buf[g.used:], salt, e.Type, uint64(e.LedgerID), uint64(e.EntryID), e.Payload, e.payloadCRC)
		g.entries = append(g.entries, e)
		o.batch[o.next] = nil
		o.next++
	}
}

// startGroup takes a free group for the next commit, rolling the file over first if the group
// might not fit in it. It returns false if the journal failed meanwhile.
func (o *owner) startGroup() bool {
	j := o.j
	for len(o.free) == 0 {
		o.awaitRelease()
	}
	if o.offset+int64(len(o.free[0].buf)) > j.cfg.MaxFileSize {
		if !o.roll() {
			return false
		}
	}
	g := o.free[len(o.free)-1]
	o.free = o.free[:len(o.free)-1]
	g.used, g.entries, g.fileEnd = 0, g.entries[:0], false
	o.cur = g
	return true
}

// roll ends the current file with a synced file-end record and switches to the prepared file.
// Nothing of the old file is in flight when the new one gets its first write, so a torn tail
// can only be in the newest file that holds records (replay relies on it).
func (o *owner) roll() bool {
	j := o.j
	for o.inFlight > 0 {
		o.awaitRelease()
	}
	next, err := j.files.next()
	if err != nil {
		j.fail(err)
		return false
	}
	g := o.free[len(o.free)-1]
	o.free = o.free[:len(o.free)-1]
	g.used, g.entries = 0, g.entries[:0]
	g.used += appendRecord(g.buf, o.file.salt, recordFileEnd, next.id, 0, nil, payloadChecksum(nil))
	g.fileEnd = true
	if o.commit(g, true) {
		o.awaitRelease()
	}
	if j.Err() != nil {
		next.f.Close()
		return false
	}
	if err := j.files.release(o.file); err != nil {
		j.log.Warn("closing journal file", "err", err)
	}
	o.file, o.offset = next, next.dataStart
	j.advanceMark(Mark{FileID: next.id, Offset: next.dataStart})
	return true
}

// commit pads g with a trailer to the alignment and submits it. If the submission fails, the
// journal fails and g's records fail with it.
func (o *owner) commit(g *group, forceSync bool) bool {
	j := o.j
	// One clock read decides both whether this group is synced and whether to drain first:
	// with two, a flush interval ending between them made a synced group that had not waited.
	now := monotime.Now()
	g.synced = forceSync || j.cfg.SyncData || now-o.lastSync >= int64(j.cfg.PageCacheFlushInterval)
	if g.synced && !j.cfg.SyncData {
		// This group ends with an fdatasync, which covers only writes that completed before
		// it: the unsynced groups still in flight finish first, or the mark would pass them.
		for o.inFlight > 0 {
			o.awaitRelease()
		}
	}
	claim := o.file.dataStart
	if m := j.LastLogMark(); m.FileID == o.file.id {
		claim = m.Offset
	}
	g.seq, g.err = o.seq, nil
	end := int(diskio.AlignUp(int64(g.used+recordHeaderSize), j.cfg.Alignment))
	trailer := g.buf[g.used:end]
	pad := trailer[recordHeaderSize:]
	clear(pad)
	putRecordHeader(trailer, o.file.salt, recordPadding, uint64(claim), g.seq, len(pad), payloadChecksum(pad))
	g.file, g.start, g.end, g.submitNs = o.file, o.offset, o.offset+int64(end), now
	// With every group synced, each group only needs its own write durable (RWF_DSYNC); a group
	// that follows unsynced ones (journalSyncData=false) or ends a file needs a full fdatasync.
	sync := diskio.SyncNone
	switch {
	case g.synced && (forceSync || !j.cfg.SyncData):
		sync = diskio.SyncFile
	case g.synced:
		sync = diskio.SyncWrite
	}
	if failpoint != nil {
		failpoint(fpBeforeSubmit)
	}
	err := j.ws.Submit(diskio.WriteRequest{
		File: o.file.f, Buf: g.buf[:end], BufIndex: g.bufIndex, Offset: g.start, Sync: sync,
		ID: uint64(g.bufIndex),
	})
	if err != nil {
		j.fail(err)
		for o.inFlight > 0 {
			o.awaitRelease()
		}
		g.entries = j.deliver(callbackBatch{entries: g.entries, err: err})
		o.inFlight++ // recycle counts it back
		o.recycle(g)
		return false
	}
	if g.synced {
		o.lastSync = now
	}
	o.seq++
	o.offset = g.end
	o.inFlight++
	return true
}

// awaitRelease waits for one in-flight group to complete.
func (o *owner) awaitRelease() {
	o.recycle(<-o.j.released)
}

func (o *owner) recycle(g *group) {
	o.inFlight--
	clear(g.entries)
	g.entries = g.entries[:0]
	o.free = append(o.free, g)
}

// drainFailed fails, in order, everything not yet submitted once the journal has a sticky
// error. It waits for in-flight groups first, so callbacks never run out of order.
func (o *owner) drainFailed(err error) {
	for o.inFlight > 0 {
		o.awaitRelease()
	}
	o.failPending(err)
	o.batch, _ = o.j.q.take()
	o.next = 0
	o.failPending(err)
	if o.j.q.length() == 0 && !o.j.q.isClosed() {
		<-o.j.q.notify
	}
}

// failPending fails the current group's records and the rest of the batch, through the
// callback goroutine so that the order holds.
func (o *owner) failPending(err error) {
	j := o.j
	if g := o.cur; g != nil {
		g.entries = j.deliver(callbackBatch{entries: g.entries, err: err})
		g.used = 0
	}
	if o.next < len(o.batch) {
		rest := append(<-j.callbackSlices, o.batch[o.next:]...)
		clear(o.batch[o.next:])
		o.next = len(o.batch)
		j.callbackSlices <- j.deliver(callbackBatch{entries: rest, err: err})
	}
}

// runSequencer receives completions, puts them in submission order and finishes each group:
// it advances the mark for synced groups, queues the records' callbacks and hands the buffer
// back to the writer at once, so that running callbacks never delays the next write.
func (j *Journal) runSequencer() {
	defer close(j.callbacks)
	<-j.groupsReady
	// At most PipelineDepth groups are in flight and their sequence numbers are consecutive,
	// so seq modulo len(ready) never collides.
	ready := make([]*group, len(j.groups))
	var nextSeq uint64
	for c := range j.ws.Completions() {
		g := j.groups[c.ID]
		g.err = c.Err
		ready[g.seq%uint64(len(ready))] = g
		for {
			slot := &ready[nextSeq%uint64(len(ready))]
			if *slot == nil || (*slot).seq != nextSeq {
				break
			}
			g := *slot
			*slot = nil
			nextSeq++
			j.finish(g)
		}
	}
}

func (j *Journal) finish(g *group) {
	err := g.err
	if err != nil {
		j.fail(err)
	} else {
		err = j.Err()
	}
	b := callbackBatch{entries: g.entries, err: err}
	if err == nil {
		if g.synced && !g.fileEnd {
			j.advanceMark(Mark{FileID: g.file.id, Offset: g.end})
			now := monotime.Now()
			latency := now - g.submitNs
			j.stats.Syncs.Add(1)
			j.stats.SyncNanos.Add(uint64(latency))
			if j.cfg.OnGroup != nil {
				b.report, b.durableNs = true, now
				b.stats = GroupStats{Records: len(g.entries), Bytes: int(g.end - g.start),
					QueueWait: time.Duration(g.firstNs - g.queuedNs), GroupWait: time.Duration(g.submitNs - g.firstNs),
					Sync: time.Duration(latency)}
			}
		}
		j.stats.Groups.Add(1)
		j.stats.Entries.Add(uint64(len(g.entries)))
		j.stats.Bytes.Add(uint64(g.end - g.start))
	}
	if failpoint != nil {
		failpoint(fpAfterSync)
	}
	// Callbacks are queued before the group is released: the writer fails records only after
	// every group was released, so its callbacks always come after these.
	g.entries = j.deliver(b)
	j.released <- g
}

// callbackBatch is a group's records, to be called back with err; with report set, OnGroup
// gets stats once they have been called back.
type callbackBatch struct {
	entries   []*Entry
	err       error
	report    bool
	durableNs int64
	stats     GroupStats
}

// deliver queues b for the callback goroutine and returns an empty slice to use instead of
// b.entries.
func (j *Journal) deliver(b callbackBatch) []*Entry {
	if len(b.entries) == 0 {
		return b.entries
	}
	spare := <-j.callbackSlices
	j.callbacks <- b
	return spare[:0]
}

// runCallbacks calls Done for each record, in journal order.
func (j *Journal) runCallbacks() {
	defer close(j.completerDone)
	for b := range j.callbacks {
		if b.report {
			b.stats.CallbackDelay = time.Duration(monotime.Now() - b.durableNs)
		}
		for i, e := range b.entries {
			e.Done(e, b.err)
			b.entries[i] = nil
		}
		j.callbackSlices <- b.entries[:0]
		if b.report {
			j.cfg.OnGroup(b.stats)
		}
	}
}

// advanceMark moves the in-memory LastLogMark forward (never backwards).
func (j *Journal) advanceMark(m Mark) {
	j.markMu.Lock()
	if m.Compare(j.mark) > 0 {
		j.mark = m
	}
	j.markMu.Unlock()
}
