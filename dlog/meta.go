package dlog

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// Keys in the metadata KV keyspace (layout documented in doc.go).
const (
	logsPrefix     = "dlog/logs/"
	segmentsPrefix = "dlog/segments/"
	lockPrefix     = "dlog/"
	// seqDigits is the width of a zero-padded segment sequence number in a key, so that key
	// order is sequence order.
	seqDigits = 19
	// maxNameLength bounds a log name.
	maxNameLength = 255
	// metaVersion is the version of the log and segment values (format, do not change).
	metaVersion = 1
)

func logKey(name string) string        { return logsPrefix + name }
func segmentPrefix(name string) string { return segmentsPrefix + name + "/" }
func lockName(name string) string      { return lockPrefix + name }
func segmentKey(name string, seq int64) string {
	return fmt.Sprintf("%s%0*d", segmentPrefix(name), seqDigits, seq)
}

// ValidateName checks a log name: 1..255 characters of [A-Za-z0-9._-], not "." or "..".
func ValidateName(name string) error {
	if name == "" || len(name) > maxNameLength || name == "." || name == ".." {
		return fmt.Errorf("%w %q: want 1..%d characters of [A-Za-z0-9._-], not . or ..", ErrInvalidName, name, maxNameLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("%w %q: character %q not allowed", ErrInvalidName, name, c)
		}
	}
	return nil
}

// SegmentState is a segment's state.
type SegmentState int

// Segment states.
const (
	// InProgress: the segment's writer may still add to it; readers read it up to the
	// ledger's last-add-confirmed.
	InProgress SegmentState = 1
	// Completed: the segment's ledger is closed and its metadata final.
	Completed SegmentState = 2
)

func (s SegmentState) String() string {
	switch s {
	case InProgress:
		return "inprogress"
	case Completed:
		return "completed"
	}
	return fmt.Sprintf("SegmentState(%d)", int(s))
}

// Segment is one segment's metadata: a ledger holding a contiguous run of the log's records.
type Segment struct {
	SeqNo    int64
	LedgerID int64
	State    SegmentState
	// FirstTxID and LastTxID are the transaction ids of the segment's first and last
	// records; LastEntryID is its ledger's last entry; RecordCount its records; Bytes its
	// ledger's length. They are final once Completed (-1 / 0 when there is none); while
	// InProgress they are -1 and 0.
	FirstTxID, LastTxID int64
	LastEntryID         int64
	RecordCount         int64
	Bytes               int64
	// Created is when the segment was started, Completed when it was completed (zero
	// while in progress).
	Created, CompletedAt time.Time

	version metadata.Version
}

// Empty reports whether a completed segment holds no record.
func (s *Segment) Empty() bool { return s.State == Completed && s.RecordCount == 0 }

// encodeSegment renders a segment's value:
// "1;seq;state;ledger;firstTx;lastTx;lastEntry;records;bytes;createdMs;completedMs".
func encodeSegment(s *Segment) []byte {
	state := "i"
	if s.State == Completed {
		state = "c"
	}
	return fmt.Appendf(nil, "%d;%d;%s;%d;%d;%d;%d;%d;%d;%d;%d", metaVersion, s.SeqNo, state, s.LedgerID,
		s.FirstTxID, s.LastTxID, s.LastEntryID, s.RecordCount, s.Bytes, unixMilli(s.Created), unixMilli(s.CompletedAt))
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// parseFields splits a versioned ';'-separated value into n integer fields, of which field
// textField (if ≥ 0) is text.
func parseFields(what string, b []byte, n, textField int) ([]int64, string, error) {
	parts := strings.Split(string(b), ";")
	if len(parts) == 0 || parts[0] != strconv.Itoa(metaVersion) {
		return nil, "", fmt.Errorf("%w: %s %q: unknown version", ErrCorrupt, what, b)
	}
	if len(parts) != n+1 {
		return nil, "", fmt.Errorf("%w: %s %q: %d fields, want %d", ErrCorrupt, what, b, len(parts)-1, n)
	}
	out := make([]int64, n)
	text := ""
	for i, p := range parts[1:] {
		if i == textField {
			text = p
			continue
		}
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("%w: %s %q: field %d: %w", ErrCorrupt, what, b, i+1, err)
		}
		out[i] = v
	}
	return out, text, nil
}

// decodeSegment parses a segment's value.
func decodeSegment(b []byte) (Segment, error) {
	f, state, err := parseFields("segment", b, 10, 1)
	if err != nil {
		return Segment{}, err
	}
	s := Segment{
		SeqNo: f[0], LedgerID: f[2], FirstTxID: f[3], LastTxID: f[4], LastEntryID: f[5],
		RecordCount: f[6], Bytes: f[7], Created: fromMilli(f[8]), CompletedAt: fromMilli(f[9]),
	}
	switch state {
	case "i":
		s.State = InProgress
	case "c":
		s.State = Completed
	default:
		return Segment{}, fmt.Errorf("%w: segment %q: state %q", ErrCorrupt, b, state)
	}
	if s.SeqNo < 1 || s.LedgerID < 0 || s.FirstTxID < -1 || s.LastTxID < s.FirstTxID || s.LastEntryID < -1 ||
		s.RecordCount < 0 || s.Bytes < 0 || (s.RecordCount == 0) != (s.FirstTxID == -1) {
		return Segment{}, fmt.Errorf("%w: segment %q: inconsistent fields", ErrCorrupt, b)
	}
	return s, nil
}

// logMeta is the log's own value: creation time, the last segment sequence number ever used,
// the highest transaction id of a completed segment, and the truncation point.
type logMeta struct {
	created    time.Time
	lastSeqNo  int64
	maxTxID    int64
	truncation DLSN
}

func newLogMeta(now time.Time) logMeta {
	return logMeta{created: now, maxTxID: -1, truncation: InitialDLSN}
}

// encodeLog renders "1;createdMs;lastSeqNo;maxTxID;truncSeq;truncEntry;truncSlot".
func encodeLog(m logMeta) []byte {
	t := m.truncation
	return fmt.Appendf(nil, "%d;%d;%d;%d;%d;%d;%d", metaVersion, unixMilli(m.created), m.lastSeqNo, m.maxTxID,
		t.SegmentSeqNo, t.EntryID, t.SlotID)
}

func decodeLog(b []byte) (logMeta, error) {
	f, _, err := parseFields("log", b, 6, -1)
	if err != nil {
		return logMeta{}, err
	}
	m := logMeta{created: fromMilli(f[0]), lastSeqNo: f[1], maxTxID: f[2], truncation: DLSN{f[3], f[4], f[5]}}
	if m.lastSeqNo < 0 || m.maxTxID < -1 || m.truncation.Less(InitialDLSN) || m.truncation.EntryID < 0 || m.truncation.SlotID < 0 {
		return logMeta{}, fmt.Errorf("%w: log %q: inconsistent fields", ErrCorrupt, b)
	}
	return m, nil
}
