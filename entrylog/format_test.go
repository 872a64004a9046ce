package entrylog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

func TestFileNames(t *testing.T) {
	for _, id := range []uint64{0, 1, 0xabc, 1 << 40, ^uint64(0)} {
		got, ok := ParseFileName(FileName(id))
		if !ok || got != id {
			t.Errorf("ParseFileName(FileName(%x)) = %x, %v", id, got, ok)
		}
	}
	if FileName(0x1f) != "1f.log" {
		t.Errorf("FileName(0x1f) = %q", FileName(0x1f))
	}
	for _, bad := range []string{"", ".log", "xyz.log", "ABC.log", "00a.log", "a.log.tmp", "a.txn", "lastId", "lastId.tmp", "10000000000000000.log"} {
		if _, ok := ParseFileName(bad); ok {
			t.Errorf("ParseFileName(%q) accepted", bad)
		}
	}
	if _, ok := ParseFileName("/x/y/1a.log"); !ok {
		t.Error("ParseFileName rejects a path")
	}
}

func TestLocation(t *testing.T) {
	for _, c := range []struct {
		id  uint64
		off int64
	}{{1, 4096}, {0xffffffff, 0xffffffff}, {7, 1 << 31}} {
		l := NewLocation(c.id, c.off)
		if l.LogID() != c.id || l.Offset() != c.off {
			t.Errorf("NewLocation(%x, %d) = %v: %x, %d", c.id, c.off, l, l.LogID(), l.Offset())
		}
		if uint64(l) != c.id<<32|uint64(c.off) {
			t.Errorf("NewLocation(%x, %d) = %x: not BookKeeper's layout", c.id, c.off, uint64(l))
		}
	}
	if s := NewLocation(0x2a, 8192).String(); s != "2a@8192" {
		t.Errorf("String = %q", s)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	salt := logSalt(7)
	payload := []byte("stored entry bytes")
	buf := make([]byte, recordHeaderSize+len(payload))
	putRecordHeader(buf, salt, recordData, 3, 1<<40, len(payload), payloadChecksum(payload))
	copy(buf[recordHeaderSize:], payload)
	h, got, err := decodeRecord(buf, salt, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if h.typ != recordData || h.a != 3 || h.b != 1<<40 || h.size() != int64(len(buf)) || !bytes.Equal(got, payload) {
		t.Fatalf("decoded %+v %q", h, got)
	}
	// Negative ids (as int64) survive.
	putRecordHeader(buf, salt, recordData, ^uint64(0), ^uint64(1), 0, payloadChecksum(nil))
	if h, _, err := decodeRecord(buf[:recordHeaderSize], salt, 1024); err != nil || int64(h.a) != -1 || int64(h.b) != -2 {
		t.Fatalf("negative ids: %+v %v", h, err)
	}
	// Padding: the payload is not checked, and need not be present.
	putRecordHeader(buf, salt, recordPadding, 8192, 0, 4000, 0)
	if h, p, err := decodeRecord(buf[:recordHeaderSize], salt, 1024); err != nil || h.size() != 4032 || p != nil {
		t.Fatalf("padding: %+v %v", h, err)
	}
}

func TestRecordDecodeErrors(t *testing.T) {
	salt := logSalt(7)
	payload := []byte("0123456789")
	valid := make([]byte, recordHeaderSize+len(payload))
	putRecordHeader(valid, salt, recordData, 1, 2, len(payload), payloadChecksum(payload))
	copy(valid[recordHeaderSize:], payload)
	n := len(valid)
	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(valid)
		f(b)
		return b
	}
	reseal := func(f func(b []byte)) []byte {
		b := bytes.Clone(valid)
		f(b)
		binary.LittleEndian.PutUint32(b, crc32.Update(salt, castagnoli, b[4:recordHeaderSize]))
		return b
	}
	cases := []struct {
		name string
		in   []byte
		salt uint32
		max  int
		want error
	}{
		{"short header", valid[:recordHeaderSize-1], salt, 1024, errShortRecord},
		{"short payload", valid[:n-1], salt, 1024, errShortRecord},
		{"zero type", mutate(func(b []byte) { b[8] = 0 }), salt, 1024, errBadRecordType},
		{"unknown type", mutate(func(b []byte) { b[8] = byte(recordTypeLimit) }), salt, 1024, errBadRecordType},
		{"reserved", mutate(func(b []byte) { b[10] = 1 }), salt, 1024, errBadReserved},
		{"too big", valid, salt, 5, errRecordTooBig},
		{"payload bit flip", mutate(func(b []byte) { b[n-1] ^= 1 }), salt, 1024, errPayloadCRC},
		{"payload crc bit flip", mutate(func(b []byte) { b[29] ^= 1 }), salt, 1024, errRecordCRC},
		{"ledger bit flip", mutate(func(b []byte) { b[12] ^= 0x80 }), salt, 1024, errRecordCRC},
		{"length bit flip", mutate(func(b []byte) { b[4] ^= 1 }), salt, 1024, errRecordCRC},
		{"other log's salt", valid, logSalt(8), 1024, errRecordCRC},
		{"all zeros", make([]byte, 64), salt, 1024, errBadRecordType},
		{"padding with crc", reseal(func(b []byte) { b[8] = byte(recordPadding) }), salt, 1024, errBadPadding},
		{"map of odd length", reseal(func(b []byte) { b[8] = byte(recordLedgersMap) }), salt, 1024, errBadMapRecord},
	}
	for _, c := range cases {
		if _, _, err := decodeRecord(c.in, c.salt, c.max); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestLogHeaderRejectsDamage(t *testing.T) {
	h := logHeader{version: formatVersion, headerSize: 4096, logID: 5, mapOffset: 1 << 20, mapCount: 3, maxEntrySize: 100}
	b := make([]byte, 4096)
	h.encode(b)
	if got, err := decodeLogHeader(b); err != nil || got != h {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	reseal := func(d []byte) { binary.LittleEndian.PutUint32(d[44:], crc32.Checksum(d[:44], castagnoli)) }
	for name, c := range map[string]struct {
		mutate func(d []byte)
		want   error
	}{
		"magic":        {func(d []byte) { d[0] ^= 1 }, errBadMagic},
		"crc":          {func(d []byte) { d[16] ^= 1 }, errHeaderCRC},
		"version":      {func(d []byte) { d[8] = 2; reseal(d) }, errBadVersion},
		"header size":  {func(d []byte) { d[12] = 1; reseal(d) }, errBadHeader},
		"map below":    {func(d []byte) { binary.LittleEndian.PutUint64(d[24:], 100); reseal(d) }, errBadHeader},
		"zeros":        {func(d []byte) { clear(d) }, errNoHeader},
		"count no map": {func(d []byte) { binary.LittleEndian.PutUint64(d[24:], 0); reseal(d) }, errBadHeader},
	} {
		d := bytes.Clone(b)
		c.mutate(d)
		if _, err := decodeLogHeader(d); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
	if _, err := decodeLogHeader(b[:10]); !errors.Is(err, errNoHeader) {
		t.Errorf("short: %v", err)
	}
}

func TestLastIDRoundTrip(t *testing.T) {
	b := encodeLastID(0x1234)
	if id, err := decodeLastID(b); err != nil || id != 0x1234 {
		t.Fatalf("round trip: %x %v", id, err)
	}
	for i := range b {
		d := bytes.Clone(b)
		d[i] ^= 4
		if _, err := decodeLastID(d); !errors.Is(err, errBadLastIDFile) {
			t.Errorf("flip at %d accepted", i)
		}
	}
	if _, err := decodeLastID(b[:19]); err == nil {
		t.Error("short file accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := DefaultConfig("/x")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg.FS == nil || cfg.Logger == nil {
		t.Fatal("Validate did not fill in FS and Logger")
	}
	for name, mutate := range map[string]func(c *Config){
		"no dir":           func(c *Config) { c.Dir = "" },
		"max entry 0":      func(c *Config) { c.MaxEntrySize = 0 },
		"max entry huge":   func(c *Config) { c.MaxEntrySize = 2 << 30 },
		"log size 0":       func(c *Config) { c.LogSizeLimit = 0 },
		"log size > 4 GiB": func(c *Config) { c.LogSizeLimit = 4<<30 + 1 },
		"log size < entry": func(c *Config) { c.LogSizeLimit = 5 << 20 },
		"write buffer":     func(c *Config) { c.WriteBufferSize = 100 },
		"one write buffer": func(c *Config) { c.WriteBuffers = 1 },
		"read buffer":      func(c *Config) { c.ReadBufferSize = 4096 },
		"no read buffers":  func(c *Config) { c.ReadBuffers = 0 },
		"no large buffers": func(c *Config) { c.LargeReadBuffers = 0 },
		"negative hint":    func(c *Config) { c.ReadHint = -1 },
		"hint above max":   func(c *Config) { c.ReadHint = c.MaxEntrySize + 1 },
		"no open files":    func(c *Config) { c.MaxOpenReadFiles = 0 },
	} {
		c := DefaultConfig("/x")
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: got %v, want ErrBadConfig", name, err)
		}
	}
}
