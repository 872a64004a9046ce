package dlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestDLSNOrderAndForms(t *testing.T) {
	ds := []DLSN{{1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 9, 99}, {2, 0, 0}, {10, 5, 3}}
	for i, a := range ds {
		for j, b := range ds {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.Compare(b); got != want || a.Less(b) != (want < 0) {
				t.Fatalf("%s vs %s: %d, want %d", a.Text(), b.Text(), got, want)
			}
		}
		b := a.Bytes()
		if len(b) != DLSNSize || b[0] != 1 {
			t.Fatalf("bytes %x", b)
		}
		if back, err := DLSNFromBytes(b); err != nil || back != a {
			t.Fatalf("bytes round trip %s: %s, %v", a.Text(), back.Text(), err)
		}
		if back, err := ParseDLSN(a.String()); err != nil || back != a {
			t.Fatalf("string round trip %s: %v", a.String(), err)
		}
		j, _ := json.Marshal(map[string]DLSN{"d": a})
		var m map[string]DLSN
		if err := json.Unmarshal(j, &m); err != nil || m["d"] != a {
			t.Fatalf("json %s: %v", j, err)
		}
	}
	// DistributedLog's serialisation of (1,0,0): 0x01, then 1, 0, 0 as big-endian longs.
	if got := InitialDLSN.String(); got != "AQAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAA==" {
		t.Fatalf("InitialDLSN = %s", got)
	}
	for _, bad := range [][]byte{nil, make([]byte, 24), append([]byte{2}, make([]byte, 24)...),
		append([]byte{1, 0x80}, make([]byte, 23)...)} {
		if _, err := DLSNFromBytes(bad); !errors.Is(err, ErrInvalidDLSN) {
			t.Fatalf("decode %x: %v", bad, err)
		}
	}
	if _, err := ParseDLSN("not base64!"); !errors.Is(err, ErrInvalidDLSN) {
		t.Fatalf("parse: %v", err)
	}
}

func FuzzDLSN(f *testing.F) {
	f.Add(InitialDLSN.Bytes())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DLSNFromBytes(b)
		if err != nil {
			return
		}
		if !bytes.Equal(d.Bytes(), b) {
			t.Fatalf("%x decodes to %s, which encodes to %x", b, d.Text(), d.Bytes())
		}
	})
}

func buildEnvelope(h entryHeader, recs []entryRecord) []byte {
	buf := make([]byte, envelopeHeaderSize)
	for _, r := range recs {
		buf = appendRecord(buf, r.txID, r.payload)
	}
	h.count = len(recs)
	sealEnvelope(buf, h)
	return buf
}

func TestEnvelopeRoundTripAndCorruption(t *testing.T) {
	recs := []entryRecord{{5, []byte("hello")}, {7, nil}, {9, bytes.Repeat([]byte{0xab}, 300)}}
	env := buildEnvelope(entryHeader{recordsBefore: 10, firstTxID: 1, lastTxID: 9}, recs)
	h, got, err := decodeEnvelope(env, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.count != 3 || h.recordsBefore != 10 || h.firstTxID != 1 || h.lastTxID != 9 || h.control {
		t.Fatalf("header %+v", h)
	}
	for i := range recs {
		if got[i].txID != recs[i].txID || !bytes.Equal(got[i].payload, recs[i].payload) {
			t.Fatalf("record %d: %+v", i, got[i])
		}
	}
	ctl := buildEnvelope(entryHeader{control: true, recordsBefore: 13, firstTxID: 1, lastTxID: 9}, nil)
	if h, got, err := decodeEnvelope(ctl, nil); err != nil || !h.control || len(got) != 0 || h.recordsBefore != 13 {
		t.Fatalf("control: %+v %v", h, err)
	}
	empty := buildEnvelope(entryHeader{control: true, firstTxID: -1, lastTxID: -1}, nil)
	if _, _, err := decodeEnvelope(empty, nil); err != nil {
		t.Fatalf("control entry of an empty segment: %v", err)
	}
	// Every single-bit flip is caught (by the CRC or a check).
	for i := range len(env) * 8 {
		b := bytes.Clone(env)
		b[i/8] ^= 1 << (i % 8)
		if _, _, err := decodeEnvelope(b, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip of bit %d not detected: %v", i, err)
		}
	}
	for n := range len(env) {
		if _, _, err := decodeEnvelope(env[:n], nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncation to %d bytes not detected", n)
		}
	}
	// Well-formed but inconsistent: decreasing txids, wrong last txid, a control entry with
	// records.
	for name, env := range map[string][]byte{
		"decreasing": buildEnvelope(entryHeader{firstTxID: 1, lastTxID: 4}, []entryRecord{{5, nil}, {4, nil}}),
		"last txid":  buildEnvelope(entryHeader{firstTxID: 1, lastTxID: 6}, []entryRecord{{5, nil}}),
		"control":    buildEnvelope(entryHeader{control: true, firstTxID: 1, lastTxID: 5}, []entryRecord{{5, nil}}),
		"no first":   buildEnvelope(entryHeader{firstTxID: -1, lastTxID: 5}, []entryRecord{{5, nil}}),
	} {
		if _, _, err := decodeEnvelope(env, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add(buildEnvelope(entryHeader{firstTxID: 1, lastTxID: 2}, []entryRecord{{1, []byte("a")}, {2, []byte("bc")}}))
	f.Add(buildEnvelope(entryHeader{control: true, firstTxID: -1, lastTxID: -1}, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, recs, err := decodeEnvelope(b, nil)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes.
		if again := buildEnvelope(h, recs); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func TestSegmentAndLogValues(t *testing.T) {
	now := time.UnixMilli(time.Now().UnixMilli())
	for _, s := range []Segment{
		{SeqNo: 1, LedgerID: 7, State: InProgress, FirstTxID: -1, LastTxID: -1, LastEntryID: -1, Created: now},
		{SeqNo: 3, LedgerID: 0, State: Completed, FirstTxID: 10, LastTxID: 99, LastEntryID: 41, RecordCount: 90, Bytes: 4000,
			Created: now, CompletedAt: now.Add(time.Second)},
		{SeqNo: 4, LedgerID: 9, State: Completed, FirstTxID: -1, LastTxID: -1, LastEntryID: -1, Created: now, CompletedAt: now},
	} {
		got, err := decodeSegment(encodeSegment(&s))
		if err != nil || got.SeqNo != s.SeqNo || got.LedgerID != s.LedgerID || got.State != s.State ||
			got.FirstTxID != s.FirstTxID || got.LastTxID != s.LastTxID || got.LastEntryID != s.LastEntryID ||
			got.RecordCount != s.RecordCount || got.Bytes != s.Bytes || !got.Created.Equal(s.Created) || !got.CompletedAt.Equal(s.CompletedAt) {
			t.Fatalf("%s -> %+v, %v", encodeSegment(&s), got, err)
		}
	}
	for _, bad := range []string{"", "2;1;i;7;-1;-1;-1;0;0;0;0", "1;1;x;7;-1;-1;-1;0;0;0;0", "1;1;i;7;-1;-1;-1;0;0;0",
		"1;0;i;7;-1;-1;-1;0;0;0;0", "1;1;c;7;5;4;3;1;0;0;0", "1;1;c;7;-1;-1;3;1;0;0;0", "1;1;i;z;-1;-1;-1;0;0;0;0"} {
		if _, err := decodeSegment([]byte(bad)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("segment %q: %v", bad, err)
		}
	}
	m := logMeta{created: now, lastSeqNo: 12, maxTxID: 400, truncation: DLSN{3, 4, 5}}
	if got, err := decodeLog(encodeLog(m)); err != nil || got != m {
		t.Fatalf("log %s -> %+v, %v", encodeLog(m), got, err)
	}
	if got, err := decodeLog(encodeLog(newLogMeta(now))); err != nil || got.truncation != InitialDLSN || got.maxTxID != -1 {
		t.Fatalf("new log: %+v %v", got, err)
	}
	for _, bad := range []string{"1;0;0;-1;0;0;0", "1;0;-1;-1;1;0;0", "1;0;0;-2;1;0;0", "1;0;0;-1;1;0"} {
		if _, err := decodeLog([]byte(bad)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("log %q: %v", bad, err)
		}
	}
}

func FuzzDecodeSegment(f *testing.F) {
	f.Add([]byte("1;3;c;0;10;99;41;90;4000;1;2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSegment(b)
		if err != nil {
			return
		}
		if again, err := decodeSegment(encodeSegment(&s)); err != nil || again.SeqNo != s.SeqNo || again.RecordCount != s.RecordCount {
			t.Fatalf("%q: re-decoding %q: %v", b, encodeSegment(&s), err)
		}
	})
}

func FuzzDecodeLog(f *testing.F) {
	f.Add([]byte("1;0;12;400;3;4;5"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeLog(b)
		if err != nil {
			return
		}
		if again, err := decodeLog(encodeLog(m)); err != nil || again.truncation != m.truncation || again.lastSeqNo != m.lastSeqNo {
			t.Fatalf("%q: re-decoding: %v", b, err)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	var c Config
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.EnsembleSize != 3 || c.WriteQuorum != 3 || c.AckQuorum != 2 || c.MaxLogSegmentBytes != 256<<20 ||
		c.LogSegmentRollingInterval != 120*time.Minute || c.OutputBufferSize != 1024 || c.RetentionPeriod != 72*time.Hour {
		t.Fatalf("defaults %+v", c)
	}
	for name, mutate := range map[string]func(*Config){
		"quorums":     func(c *Config) { c.AckQuorum = 4 },
		"buffer":      func(c *Config) { c.OutputBufferSize = maxEntryRecordBytes + 1 },
		"segment":     func(c *Config) { c.MaxLogSegmentBytes = -1 },
		"lock ttl":    func(c *Config) { c.LockTTL = time.Millisecond },
		"in flight":   func(c *Config) { c.MaxInFlightEntries = -1 },
		"poll":        func(c *Config) { c.TailPollInterval = -1 },
		"read ahead":  func(c *Config) { c.ReadAheadEntries = -5 },
		"outstanding": func(c *Config) { c.MaxOutstandingBytes = -5 },
		"flush":       func(c *Config) { c.PeriodicFlushFrequency = -time.Second },
		"rolling":     func(c *Config) { c.LogSegmentRollingInterval = -time.Second },
	} {
		c := Config{}
		c.EnsureDefaults()
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for _, n := range []string{"", ".", "..", "a/b", "a b", string(make([]byte, 256))} {
		if err := ValidateName(n); !errors.Is(err, ErrInvalidName) {
			t.Fatalf("name %q: %v", n, err)
		}
	}
	if err := ValidateName("orders-2024.v1_x"); err != nil {
		t.Fatal(err)
	}
}
