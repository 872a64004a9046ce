package entrylog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// FuzzDecodeRecord checks that the record decoder never panics and that whatever it accepts
// re-encodes to the same bytes. The seed corpus runs in the normal test suite.
func FuzzDecodeRecord(f *testing.F) {
	salt := logSalt(42)
	for _, p := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte{0xab}, 300)} {
		b := make([]byte, recordHeaderSize+len(p))
		putRecordHeader(b, salt, recordData, 1, 2, len(p), payloadChecksum(p))
		copy(b[recordHeaderSize:], p)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	pad := make([]byte, 64)
	putRecordHeader(pad, salt, recordPadding, 4096, 0, 32, 0)
	f.Add(pad)
	pairs := putMapPairs(nil, []ledgerBytes{{1, 100}, {5, 64}})
	m := make([]byte, recordHeaderSize+len(pairs))
	putRecordHeader(m, salt, recordLedgersMap, 2, 0, len(pairs), payloadChecksum(pairs))
	copy(m[recordHeaderSize:], pairs)
	f.Add(m)
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, payload, err := decodeRecord(b, salt, 1<<16)
		if err != nil {
			return
		}
		re := make([]byte, recordHeaderSize)
		putRecordHeader(re, salt, h.typ, h.a, h.b, int(h.length), h.payloadCRC)
		if !bytes.Equal(re, b[:recordHeaderSize]) {
			t.Fatalf("accepted header does not re-encode identically")
		}
		if h.typ != recordPadding && (payloadChecksum(payload) != h.payloadCRC || len(payload) != int(h.length)) {
			t.Fatalf("accepted a %v record whose payload does not verify", h.typ)
		}
	})
}

// fuzzConfig is the configuration the scan fuzzer opens its directory with.
func fuzzConfig(fs diskio.FS) Config {
	cfg := memConfig(fs)
	cfg.Dir = "/d"
	return cfg
}

// Scan fuzz inputs are small, so that the fuzzer can minimize them: the harness writes log 1's
// header block itself and the input holds the rest.
//
//	[0]    mode: bit 0 = write a valid header (else a zero block), bit 1 = finalized
//	[1:5]  map offset for a finalized header, relative to the end of the header block
//	[5:]   the bytes after the header block
const fuzzScanPrefix = 5

// scanSeeds are real logs (id 1) with small entries, turned into fuzz inputs: finalized, left
// unfinalized by a crash, truncated and damaged.
func scanSeeds(tb testing.TB) [][]byte {
	var seeds [][]byte
	for _, finalize := range []bool{true, false} {
		fs := diskio.NewMem(4096)
		e := mustOpen(tb, fuzzConfig(fs))
		add := func(ledger, from, to int64) {
			for i := from; i < to; i++ {
				if _, err := e.Add(ledger, i, bytes.Repeat([]byte{byte(i)}, int(i*7%50))); err != nil {
					tb.Fatal(err)
				}
			}
		}
		add(1, 0, 5)
		add(2, 0, 5)
		e.Flush()
		add(3, 5, 10)
		if finalize {
			e.Close()
		} else {
			e.Flush()
			add(3, 10, 12)
			fs = fs.Crash(diskio.CrashPrefix, rand.New(rand.NewPCG(1, 2)))
			e.Close()
		}
		b := readFileBytes(tb, fs, "/d/1.log")
		hdr, err := decodeLogHeader(b)
		if err != nil {
			tb.Fatal(err)
		}
		rest := bytes.TrimRight(b[minHeaderBlock:], "\x00")
		in := []byte{1, 0, 0, 0, 0}
		if hdr.mapOffset != 0 {
			in[0] |= 2
			binary.LittleEndian.PutUint32(in[1:], uint32(hdr.mapOffset-minHeaderBlock))
		}
		in = append(in, rest...)
		seeds = append(seeds, in, in[:len(in)/2])
		d := bytes.Clone(in)
		d[fuzzScanPrefix+40] ^= 1
		seeds = append(seeds, d)
	}
	return seeds
}

// FuzzScan writes a log from the input and checks that Scan, LedgersMap and ReadAhead never
// panic, fail only with ErrCorrupt, and that every entry Scan returns reads back identically.
// Inputs are kilobytes (flush padding), so minimizing one takes long: fuzz with
// -fuzzminimizetime=3s.
func FuzzScan(f *testing.F) {
	for _, s := range scanSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < fuzzScanPrefix || len(in) > 1<<20 {
			return
		}
		file := make([]byte, minHeaderBlock+diskio.AlignUp(int64(len(in)-fuzzScanPrefix), 4096))
		copy(file[minHeaderBlock:], in[fuzzScanPrefix:])
		if in[0]&1 != 0 {
			h := logHeader{version: formatVersion, headerSize: minHeaderBlock, logID: 1, maxEntrySize: 16 << 10}
			if in[0]&2 != 0 {
				h.mapOffset = minHeaderBlock + uint64(binary.LittleEndian.Uint32(in[1:]))
				h.mapCount = uint32(in[1])
			}
			h.encode(file[:minHeaderBlock])
		}
		fs := diskio.NewMem(4096)
		fs.MkdirAll("/d")
		f, err := fs.Create("/d/1.log", diskio.Options{})
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt(file, 0)
		f.Close()
		e, err := Open(fuzzConfig(fs))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var first Location
		err = e.Scan(1, func(ledger, entry int64, b []byte, loc Location) error {
			got, err := e.Read(loc, ledger, entry, nil)
			if err != nil || !bytes.Equal(got, b) {
				t.Fatalf("scanned entry %d/%d at %v reads back as %d bytes, %v", ledger, entry, loc, len(got), err)
			}
			if first == 0 {
				first = loc
			}
			return nil
		})
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("scan: %v", err)
		}
		if _, err := e.LedgersMap(1); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("ledgers map: %v", err)
		}
		if first != 0 {
			if err := e.ReadAhead(first, 1<<16, func(int64, int64, []byte, Location) bool { return true }); err != nil {
				t.Fatalf("read-ahead from a scanned entry: %v", err)
			}
		}
	})
}
