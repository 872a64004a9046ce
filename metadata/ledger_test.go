package metadata

import (
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	if err := sampleLedger().Validate(); err != nil {
		t.Fatalf("sample: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(m *LedgerMetadata)
		want   string
	}{
		{"ack > write", func(m *LedgerMetadata) { m.AckQuorumSize = 3 }, "ensemble >= write quorum >= ack quorum"},
		{"write > ensemble", func(m *LedgerMetadata) { m.WriteQuorumSize = 4 }, "ensemble >= write quorum"},
		{"zero ack", func(m *LedgerMetadata) { m.AckQuorumSize = 0 }, ">= 1"},
		{"huge ensemble", func(m *LedgerMetadata) {
			m.EnsembleSize, m.WriteQuorumSize = MaxEnsembleSize+1, 2
		}, "exceeds"},
		{"bad state", func(m *LedgerMetadata) { m.State = 9 }, "unknown state"},
		{"bad digest", func(m *LedgerMetadata) { m.DigestType = 0 }, "unknown digest"},
		{"open with last entry", func(m *LedgerMetadata) { m.State = StateOpen }, "want -1 and 0"},
		{"closed below -1", func(m *LedgerMetadata) { m.LastEntryID = -2 }, "last entry id -2"},
		{"closed negative length", func(m *LedgerMetadata) { m.Length = -1 }, "negative length"},
		{"no ensembles", func(m *LedgerMetadata) { m.Ensembles = nil }, "no ensemble"},
		{"first not 0", func(m *LedgerMetadata) { m.Ensembles[0].FirstEntryID = 1 }, "not 0"},
		{"not increasing", func(m *LedgerMetadata) { m.Ensembles[1].FirstEntryID = 0 }, "not after"},
		{"short ensemble", func(m *LedgerMetadata) { m.Ensembles[1].Bookies = m.Ensembles[1].Bookies[:2] }, "has 2 bookies"},
		{"duplicate bookie", func(m *LedgerMetadata) { m.Ensembles[0].Bookies[1] = m.Ensembles[0].Bookies[0] }, "twice"},
		{"bad bookie id", func(m *LedgerMetadata) { m.Ensembles[0].Bookies[1] = "a/b" }, "invalid bookie id"},
		{"long password", func(m *LedgerMetadata) { m.Password = make([]byte, MaxPasswordLen+1) }, "password"},
		{"long custom key", func(m *LedgerMetadata) {
			m.CustomMetadata[strings.Repeat("k", MaxCustomKeyLen+1)] = nil
		}, "custom metadata key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := sampleLedger()
			c.mutate(m)
			err := m.Validate()
			if !errors.Is(err, ErrInvalidMetadata) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want ErrInvalidMetadata mentioning %q, got %v", c.want, err)
			}
		})
	}
	var nilMD *LedgerMetadata
	if err := nilMD.Validate(); !errors.Is(err, ErrInvalidMetadata) {
		t.Fatalf("nil: %v", err)
	}
}

func TestCloneIsDeep(t *testing.T) {
	m := sampleLedger()
	c := m.Clone()
	if !c.Equal(m) {
		t.Fatal("clone differs")
	}
	c.Ensembles[0].Bookies[0] = "x:1"
	c.Password[0] = 'X'
	c.CustomMetadata["app"][0] = 'X'
	if !m.Equal(sampleLedger()) {
		t.Fatal("mutating the clone changed the original")
	}
}

func TestEnsembleAt(t *testing.T) {
	m := sampleLedger()
	for _, c := range []struct {
		entry int64
		first int64
		ok    bool
	}{{-1, 0, false}, {0, 0, true}, {16, 0, true}, {17, 17, true}, {1 << 40, 17, true}} {
		e, ok := m.EnsembleAt(c.entry)
		if ok != c.ok || ok && e.FirstEntryID != c.first {
			t.Errorf("EnsembleAt(%d) = %d, %v; want %d, %v", c.entry, e.FirstEntryID, ok, c.first, c.ok)
		}
	}
	if last, _ := m.LastEnsemble(); last.FirstEntryID != 17 {
		t.Errorf("LastEnsemble starts at %d", last.FirstEntryID)
	}
	if !m.ContainsBookie("10.0.0.4:3181") || m.ContainsBookie("10.0.0.5:3181") {
		t.Error("ContainsBookie")
	}
}

func TestBadVersionError(t *testing.T) {
	var err error = &BadVersionError{What: "ledger 7", Expected: 3, Current: 5, Metadata: sampleLedger()}
	wrapped := errors.Join(errors.New("context"), err)
	if !errors.Is(wrapped, ErrBadVersion) {
		t.Fatal("BadVersionError does not match ErrBadVersion")
	}
	var bv *BadVersionError
	if !errors.As(wrapped, &bv) || bv.Current != 5 || bv.Metadata == nil {
		t.Fatalf("errors.As: %+v", bv)
	}
	if !strings.HasPrefix(err.Error(), "metadata: bad version: ledger 7") {
		t.Fatalf("message %q", err)
	}
}

func TestBookieInfo(t *testing.T) {
	b := BookieInfo{
		ID: "10.0.0.1:3181", State: BookieReadOnly, FreeDiskBytes: 1 << 40, TotalDiskBytes: 2 << 40,
		Endpoints:  []Endpoint{{ID: "bookie", Protocol: "bookie-rpc", Host: "10.0.0.1", Port: 3181}},
		Properties: map[string]string{"rack": "/r1"},
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	data, err := EncodeBookieInfo(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBookieInfo(data)
	if err != nil {
		t.Fatal(err)
	}
	got.ID, got.State = b.ID, b.State
	if got.FreeDiskBytes != b.FreeDiskBytes || got.Endpoints[0].Port != 3181 || got.Endpoints[0].Host != "10.0.0.1" || got.Properties["rack"] != "/r1" {
		t.Fatalf("round trip: %+v", got)
	}
	for _, bad := range []string{`{"v":2}`, `not json`, ``} {
		if _, err := DecodeBookieInfo([]byte(bad)); !errors.Is(err, ErrInvalidBookieInfo) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	for _, id := range []string{"", "readonly", "a/b", "a b", strings.Repeat("a", 256)} {
		if err := ValidateBookieID(id); !errors.Is(err, ErrInvalidBookieID) {
			t.Errorf("ValidateBookieID(%q) = %v", id, err)
		}
	}
	b.State = 0
	if err := b.Validate(); !errors.Is(err, ErrInvalidBookieInfo) {
		t.Errorf("state 0: %v", err)
	}
	if !ListAll.Matches(BookieReadOnly) || ListWritable.Matches(BookieReadOnly) {
		t.Error("filter")
	}
}

func TestOptions(t *testing.T) {
	var o Options
	o.EnsureDefaults()
	if err := o.Validate(); err != nil || o.IDBatchSize != DefaultIDBatchSize || o.Codec == nil {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	o.IDBatchSize = MaxIDBatchSize + 1
	if err := o.Validate(); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("big batch: %v", err)
	}
}
