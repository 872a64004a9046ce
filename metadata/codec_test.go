package metadata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

func sampleLedger() *LedgerMetadata {
	return &LedgerMetadata{
		EnsembleSize:    3,
		WriteQuorumSize: 2,
		AckQuorumSize:   2,
		State:           StateClosed,
		LastEntryID:     41,
		Length:          4200,
		Ensembles: []Ensemble{
			{FirstEntryID: 0, Bookies: []string{"10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"}},
			{FirstEntryID: 17, Bookies: []string{"10.0.0.1:3181", "10.0.0.4:3181", "10.0.0.3:3181"}},
		},
		DigestType:     DigestCRC32C,
		Password:       []byte("pw"),
		CreationTime:   time.UnixMilli(1_700_000_000_123).UTC(),
		CustomMetadata: map[string][]byte{"app": []byte("dlog"), "empty": {}, "z": []byte{0, 1, 2}},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	open := sampleLedger()
	open.State, open.LastEntryID, open.Length = StateOpen, NoEntry, 0
	open.CustomMetadata, open.Password, open.CreationTime = nil, nil, time.Time{}
	for name, md := range map[string]*LedgerMetadata{"closed": sampleLedger(), "open-minimal": open} {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeLedgerMetadata(md)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeLedgerMetadata(b)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(md) {
				t.Fatalf("round trip changed metadata:\n got %+v\nwant %+v", got, md)
			}
			b2, err := EncodeLedgerMetadata(got)
			if err != nil || !bytes.Equal(b, b2) {
				t.Fatalf("encoding is not deterministic (err %v)", err)
			}
		})
	}
}

func TestCodecHeader(t *testing.T) {
	b, err := EncodeLedgerMetadata(sampleLedger())
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:4]) != "RKLM" || binary.BigEndian.Uint16(b[4:]) != 1 {
		t.Fatalf("header % x", b[:6])
	}
	if n := binary.BigEndian.Uint32(b[6:]); int(n) != len(b)-14 {
		t.Fatalf("body length %d, encoding %d bytes", n, len(b))
	}
}

func TestCodecRejectsInvalid(t *testing.T) {
	md := sampleLedger()
	md.AckQuorumSize = 3
	if _, err := EncodeLedgerMetadata(md); !errors.Is(err, ErrInvalidMetadata) {
		t.Fatalf("want ErrInvalidMetadata, got %v", err)
	}
}

// TestDecodeCorrupt flips every bit and truncates at every length: each
// variant must fail with ErrCorruptMetadata or ErrUnsupportedFormat.
func TestDecodeCorrupt(t *testing.T) {
	good, err := EncodeLedgerMetadata(sampleLedger())
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, b []byte) {
		t.Helper()
		_, err := DecodeLedgerMetadata(b)
		if !errors.Is(err, ErrCorruptMetadata) && !errors.Is(err, ErrUnsupportedFormat) {
			t.Fatalf("%s: want a decode error, got %v", what, err)
		}
	}
	for i := range good {
		for bit := 0; bit < 8; bit++ {
			b := bytes.Clone(good)
			b[i] ^= 1 << bit
			check("bit flip", b)
		}
	}
	for n := 0; n < len(good); n++ {
		check("truncated", good[:n])
	}
	check("trailing byte", append(bytes.Clone(good), 0))
	check("nil", nil)
}

// TestDecodeValidCRCBadBody re-seals corrupt bodies with a valid checksum, so
// the field decoder and Validate are what must catch them.
func TestDecodeValidCRCBadBody(t *testing.T) {
	good, err := EncodeLedgerMetadata(sampleLedger())
	if err != nil {
		t.Fatal(err)
	}
	reseal := func(b []byte) []byte {
		end := len(b) - 4
		binary.BigEndian.PutUint32(b[6:], uint32(end-10))
		binary.BigEndian.PutUint32(b[end:], crcOf(b[:end]))
		return b
	}
	for i := 10; i < len(good)-4; i++ {
		for _, v := range []byte{0x00, 0xff, 0x80} {
			b := bytes.Clone(good)
			b[i] = v
			md, err := DecodeLedgerMetadata(reseal(b))
			if err == nil {
				if verr := md.Validate(); verr != nil {
					t.Fatalf("byte %d=%#x decoded to invalid metadata: %v", i, v, verr)
				}
				continue
			}
			if !errors.Is(err, ErrCorruptMetadata) {
				t.Fatalf("byte %d=%#x: want ErrCorruptMetadata, got %v", i, v, err)
			}
		}
	}
	// A huge segment count must not allocate: it fails the size check.
	b := bytes.Clone(good)
	segCountAt := 10 + 1 + 1 + 2 + 2 + 2 + 8 + 8 + 8 + 2 + len("pw")
	binary.BigEndian.PutUint32(b[segCountAt:], 0xffffffff)
	if _, err := DecodeLedgerMetadata(reseal(b)); !errors.Is(err, ErrCorruptMetadata) {
		t.Fatalf("huge segment count: %v", err)
	}
}

func TestDecodeUnsupported(t *testing.T) {
	_, err := DecodeLedgerMetadata([]byte("BookieMetadataFormatVersion\t3\n\x10\x08\x03"))
	if !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("BookKeeper format: %v", err)
	}
	good, _ := EncodeLedgerMetadata(sampleLedger())
	good[5] = 2 // version 2
	if _, err := DecodeLedgerMetadata(good); !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("version 2: %v", err)
	}
}

func FuzzDecodeLedgerMetadata(f *testing.F) {
	good, err := EncodeLedgerMetadata(sampleLedger())
	if err != nil {
		f.Fatal(err)
	}
	minimal, _ := EncodeLedgerMetadata(&LedgerMetadata{
		EnsembleSize: 1, WriteQuorumSize: 1, AckQuorumSize: 1, State: StateOpen, LastEntryID: NoEntry,
		Ensembles: []Ensemble{{Bookies: []string{"b:1"}}}, DigestType: DigestDummy,
	})
	f.Add(good)
	f.Add(minimal)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Add([]byte("RKLM"))
	f.Add([]byte("BookieMetadataFormatVersion\t3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		md, err := DecodeLedgerMetadata(data)
		if err != nil {
			if !errors.Is(err, ErrCorruptMetadata) && !errors.Is(err, ErrUnsupportedFormat) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if err := md.Validate(); err != nil {
			t.Fatalf("decoded invalid metadata: %v", err)
		}
		again, err := EncodeLedgerMetadata(md)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		md2, err := DecodeLedgerMetadata(again)
		if err != nil || !md2.Equal(md) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// FuzzDecodeLedgerMetadataBody fuzzes the body behind a valid header and
// checksum, so that the field decoder is reached (FuzzDecodeLedgerMetadata
// rarely gets past the checksum).
func FuzzDecodeLedgerMetadataBody(f *testing.F) {
	good, err := EncodeLedgerMetadata(sampleLedger())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good[10 : len(good)-4])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		b := make([]byte, 10, 14+len(body))
		copy(b, "RKLM\x00\x01")
		binary.BigEndian.PutUint32(b[6:], uint32(len(body)))
		b = append(b, body...)
		b = binary.BigEndian.AppendUint32(b, crcOf(b))
		md, err := DecodeLedgerMetadata(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptMetadata) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		again, err := EncodeLedgerMetadata(md)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded body does not re-encode to the same bytes")
		}
	})
}
