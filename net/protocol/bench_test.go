package protocol

import "testing"

func benchAddFrame(tb testing.TB, payload int) []byte {
	entry := AppendEntryHeader(nil, EntryHeader{LedgerID: 42, EntryID: 7, LastAddConfirmed: 6, Length: 7 * 1024})
	entry = append(entry, make([]byte, 4+payload)...) // CRC32C digest and payload
	frame, err := AppendAddRequest(nil, AddRequest{Header: Header{Version: 2}, MasterKey: MasterKey([]byte("p")), Entry: entry})
	if err != nil {
		tb.Fatal(err)
	}
	return frame[LengthPrefixSize:]
}

func benchReadFrame() []byte {
	frame := AppendReadRequest(nil, ReadRequest{Header: Header{Version: 2, Flags: FlagDoFencing},
		LedgerID: 42, EntryID: -1, MasterKey: MasterKey([]byte("p")), HasMasterKey: true})
	return frame[LengthPrefixSize:]
}

func BenchmarkDecodeAdd(b *testing.B) {
	frame := benchAddFrame(b, 1024)
	var req Request
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if err := DecodeRequest(frame, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRead(b *testing.B) {
	frame := benchReadFrame()
	var req Request
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeRequest(frame, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeAddResponse(b *testing.B) {
	out := make([]byte, 0, 64*28)
	b.ReportAllocs()
	b.SetBytes(28)
	for b.Loop() {
		if len(out)+28 > cap(out) {
			out = out[:0]
		}
		out = AppendAddResponse(out, AddResponse{Header: Header{Version: 2}, RC: EOK, LedgerID: 42, EntryID: 7})
	}
}

func BenchmarkSplitFrame(b *testing.B) {
	frame := append([]byte{0, 0, 0, 0}, benchAddFrame(b, 1024)...)
	_ = PatchFrameLength(frame, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, complete, err := SplitFrame(frame, 0); err != nil || !complete {
			b.Fatal(err)
		}
	}
}

// TestZeroAllocs checks the allocation contract (not timing): decoding an add or a read request
// and appending an add response into a buffer with room allocate nothing.
func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	add, read := benchAddFrame(t, 1024), benchReadFrame()
	var req Request
	if n := testing.AllocsPerRun(100, func() {
		if err := DecodeRequest(add, &req); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("DecodeRequest(add): %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := DecodeRequest(read, &req); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("DecodeRequest(read): %v allocs", n)
	}
	out := make([]byte, 0, 28*200)
	if n := testing.AllocsPerRun(100, func() {
		out = req.Add.AppendResponse(out, EOK)
	}); n != 0 {
		t.Errorf("AppendResponse(add): %v allocs", n)
	}
}
