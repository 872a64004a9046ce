package journal

import (
	"bytes"
	"errors"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	salt := fileSalt(7)
	buf := make([]byte, 256)
	payload := []byte("stored entry bytes")
	n := appendRecord(buf, salt, RecordData, 3, 1<<40, payload, payloadChecksum(payload))
	if n != recordHeaderSize+len(payload) {
		t.Fatalf("size %d", n)
	}
	h, got, size, err := decodeRecord(buf[:n], salt, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if h.typ != RecordData || h.ledgerID != 3 || h.entryID != 1<<40 || size != n || !bytes.Equal(got, payload) {
		t.Fatalf("decoded %+v %q size %d", h, got, size)
	}
	// An entry id of -1 (as int64) survives the round trip.
	n = appendRecord(buf, salt, RecordFence, 9, ^uint64(0), nil, payloadChecksum(nil))
	if h, _, _, err := decodeRecord(buf[:n], salt, 1024); err != nil || int64(h.entryID) != -1 {
		t.Fatalf("fence: %+v %v", h, err)
	}
}

func TestRecordDecodeErrors(t *testing.T) {
	salt := fileSalt(7)
	valid := make([]byte, 64)
	n := appendRecord(valid, salt, RecordData, 1, 2, []byte("0123456789"), payloadChecksum([]byte("0123456789")))
	valid = valid[:n]
	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(valid)
		f(b)
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
		{"other file's salt", valid, fileSalt(8), 1024, errRecordCRC},
		{"all zeros", make([]byte, 64), salt, 1024, errBadRecordType},
	}
	for _, c := range cases {
		if _, _, _, err := decodeRecord(c.in, c.salt, c.max); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestFileNames(t *testing.T) {
	for _, id := range []uint64{0, 1, 0xabc, 1 << 40, ^uint64(0)} {
		got, ok := ParseFileName(FileName(id))
		if !ok || got != id {
			t.Errorf("ParseFileName(FileName(%x)) = %x, %v", id, got, ok)
		}
	}
	for _, bad := range []string{"", ".txn", "xyz.txn", "ABC.txn", "00a.txn", "a.txn.tmp", "a.log", "10000000000000000.txn"} {
		if _, ok := ParseFileName(bad); ok {
			t.Errorf("ParseFileName(%q) accepted", bad)
		}
	}
}

func TestFileHeaderRejectsDamage(t *testing.T) {
	h := fileHeader{version: fileFormatVersion, alignment: 4096, fileID: 5, pipelineDepth: 2, groupCapacity: 8192, maxPayload: 100}
	b := make([]byte, 4096)
	h.encode(b)
	if got, err := decodeFileHeader(b); err != nil || got != h {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for name, c := range map[string]struct {
		off  int
		want error
	}{"magic": {0, errBadFileMagic}, "version": {8, errBadFileCRC}, "id": {16, errBadFileCRC}, "crc": {44, errBadFileCRC}} {
		d := bytes.Clone(b)
		d[c.off] ^= 1
		if _, err := decodeFileHeader(d); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
}

// FuzzDecodeRecord checks that the record decoder never panics and that whatever it accepts
// re-encodes to the same bytes. The seed corpus runs in the normal test suite.
func FuzzDecodeRecord(f *testing.F) {
	salt := fileSalt(42)
	for _, p := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte{0xab}, 300)} {
		b := make([]byte, recordHeaderSize+len(p))
		appendRecord(b, salt, RecordData, 1, 2, p, payloadChecksum(p))
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, payload, size, err := decodeRecord(b, salt, 1<<16)
		if err != nil {
			return
		}
		re := make([]byte, size)
		appendRecord(re, salt, h.typ, h.ledgerID, h.entryID, payload, h.payloadCRC)
		if !bytes.Equal(re, b[:size]) {
			t.Fatalf("accepted record does not re-encode identically")
		}
	})
}
