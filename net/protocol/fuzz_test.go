package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// The seed corpora (the golden vectors and the malformed tables) run in the normal suite;
// `go test -fuzz FuzzDecodeRequest ./net/protocol/` explores further.

func addSeeds(f *testing.F, frames ...[]byte) {
	for _, fr := range frames {
		f.Add(fr)
	}
}

func FuzzFrameSplit(f *testing.F) {
	for _, v := range requestVectors(f) {
		f.Add(unhex(f, v.hex), 0)
	}
	for _, v := range responseVectors(f) {
		f.Add(unhex(f, v.hex), 64)
	}
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff}, 0)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0}, 0)
	f.Add([]byte{0, 0, 0, 3, 1, 2, 3}, 0)
	f.Add([]byte{0, 0x4f, 0xff, 0xfc}, 0)
	f.Add([]byte{0, 0x4f, 0xff, 0xfd}, -1)
	f.Fuzz(func(t *testing.T, buf []byte, maxFrameSize int) {
		size, complete, err := SplitFrame(buf, maxFrameSize)
		limit := maxFrameSize
		if limit <= 0 {
			limit = DefaultMaxFrameSize
		}
		if len(buf) < LengthPrefixSize {
			if size != 0 || complete || err != nil {
				t.Fatalf("short buffer gave %d %v %v", size, complete, err)
			}
			return
		}
		length := int64(int32(binary.BigEndian.Uint32(buf)))
		switch {
		case length < MinFrameLength:
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("length %d: err %v", length, err)
			}
		case length+LengthPrefixSize > int64(limit):
			if !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("length %d over %d: err %v", length, limit, err)
			}
		default:
			if err != nil || int64(size) != length+LengthPrefixSize || complete != (len(buf) >= size) {
				t.Fatalf("length %d: %d %v %v", length, size, complete, err)
			}
			if complete {
				// Whatever the frame holds, decoding must not panic.
				var req Request
				_ = DecodeRequest(buf[LengthPrefixSize:size], &req)
				var resp Response
				_ = DecodeResponse(buf[LengthPrefixSize:size], &resp)
			}
		}
		if err != nil && (size != 0 || complete) {
			t.Fatalf("error with a size: %d %v %v", size, complete, err)
		}
	})
}

func FuzzDecodeRequest(f *testing.F) {
	for _, v := range requestVectors(f) {
		f.Add(unhex(f, v.hex)[LengthPrefixSize:])
	}
	addSeeds(f,
		unhex(f, "02020001"+hexLedger+hexEntryLAC),
		unhex(f, "02070000"+hexLedger+hexEntry5+"0000000000000077"+"ffffffff"+"0000000000000400"),
		unhex(f, "02010000"+hexKeyPassword+hexLedger+hexEntry5),
		unhex(f, "03020000"+hexLedger+hexEntry5),
		unhex(f, "00ffff02"+hexLedger+hexEntry5),
		unhex(f, "02030000 1200 0a00 1200 0a03746f6b 18 01"),
		unhex(f, "02040000"),
		[]byte{},
	)
	f.Fuzz(func(t *testing.T, frame []byte) {
		var req Request
		err := DecodeRequest(frame, &req)
		if err != nil {
			de, ok := AsDecodeError(err)
			if !ok {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			_ = de.Error()
			if de.Action == ActionRespond {
				checkErrorResponse(t, de)
			}
			return
		}
		enc, err := encodeRequest(&req)
		if err != nil {
			t.Fatalf("decoded request does not encode: %v", err)
		}
		checkReencoded(t, frame, enc)
		if req.Header.Op == OpAuth && !bytes.Equal(enc[LengthPrefixSize+HeaderSize:], frame[HeaderSize:]) {
			// A valid but non-canonical protobuf encoding: the fields must survive.
			var again Request
			if err := DecodeRequest(enc[LengthPrefixSize:], &again); err != nil {
				t.Fatalf("re-encoded auth does not decode: %v", err)
			}
			if !authEqual(again.Auth.Message, req.Auth.Message) {
				t.Fatalf("auth fields changed: %+v vs %+v", again.Auth.Message, req.Auth.Message)
			}
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	for _, v := range responseVectors(f) {
		f.Add(unhex(f, v.hex)[LengthPrefixSize:])
	}
	addSeeds(f,
		unhex(f, "02070000 00000000"+hexLedger+hexEntry5+"0000000000000077"+"ffffffff"),
		unhex(f, "02070000 00000000"+hexLedger+hexEntry5+"0000000000000077"+"00000000"+"00000001ff"),
		unhex(f, "02010000 00000000"+hexLedger+hexEntry5+"00"),
		unhex(f, "02030000 0a00"),
		[]byte{0, 0, 0, 1},
	)
	f.Fuzz(func(t *testing.T, frame []byte) {
		var resp Response
		err := DecodeResponse(frame, &resp)
		if err != nil {
			de, ok := AsDecodeError(err)
			if !ok || de.Action != ActionClose {
				t.Fatalf("response error %v is not a close *DecodeError", err)
			}
			_ = de.Error()
			return
		}
		enc, err := encodeResponse(&resp)
		if err != nil {
			t.Fatalf("decoded response does not encode: %v", err)
		}
		checkReencoded(t, frame, enc)
		switch resp.Header.Op {
		case OpBatchReadEntry:
			n := 0
			for range resp.BatchRead.Entries() {
				n++
			}
			if n != resp.BatchRead.Count {
				t.Fatalf("Entries yields %d, Count %d", n, resp.BatchRead.Count)
			}
		case OpAuth:
			var again Response
			if err := DecodeResponse(enc[LengthPrefixSize:], &again); err != nil ||
				!authEqual(again.Auth.Message, resp.Auth.Message) {
				t.Fatalf("auth response does not survive re-encoding: %v", err)
			}
		}
	})
}

func encodeRequest(r *Request) ([]byte, error) {
	switch r.Header.Op {
	case OpAddEntry:
		return AppendAddRequest(nil, r.Add)
	case OpReadEntry:
		return AppendReadRequest(nil, r.Read), nil
	case OpBatchReadEntry:
		return AppendBatchReadRequest(nil, r.BatchRead), nil
	case OpAuth:
		return AppendAuthRequest(nil, r.Auth)
	}
	return nil, errors.New("no encoder")
}

func encodeResponse(r *Response) ([]byte, error) {
	switch r.Header.Op {
	case OpAddEntry:
		return AppendAddResponse(nil, r.Add), nil
	case OpReadEntry:
		return AppendReadResponse(nil, r.Read)
	case OpBatchReadEntry:
		return AppendBatchReadResponse(nil, r.BatchRead)
	case OpAuth:
		return AppendAuthResponse(nil, r.Auth)
	}
	return nil, errors.New("no encoder")
}

// checkReencoded checks that enc, a re-encoding of the decoded frame, is a well-framed copy of
// it. The header must be the same int, except a legacy (version 0) header whose ignored bits
// 8–23 were set: then it must parse the same. The body must be byte-identical, except AUTH
// bodies, which may have been a non-canonical protobuf encoding (checked by the caller).
func checkReencoded(t *testing.T, frame, enc []byte) {
	t.Helper()
	size, complete, err := SplitFrame(enc, int(^uint32(0)>>1))
	if err != nil || !complete || size != len(enc) {
		t.Fatalf("re-encoding %x does not frame: %d %v %v", enc, size, complete, err)
	}
	got, in := binary.BigEndian.Uint32(enc[LengthPrefixSize:]), binary.BigEndian.Uint32(frame)
	if got != in && (in>>24 != 0 || ParseHeader(got) != ParseHeader(in)) {
		t.Fatalf("header %#x re-encoded as %#x", in, got)
	}
	if ParseHeader(in).Op == OpAuth {
		return
	}
	if !bytes.Equal(enc[LengthPrefixSize+HeaderSize:], frame[HeaderSize:]) {
		t.Fatalf("re-encoding differs:\n  in %x\n out %x", frame, enc[LengthPrefixSize:])
	}
}

func authEqual(a, b AuthMessage) bool {
	return bytes.Equal(a.PluginName, b.PluginName) && bytes.Equal(a.Payload, b.Payload)
}

// TestRoundTrip encodes messages with every field set to edge values and decodes them back.
func TestRoundTrip(t *testing.T) {
	ids := []int64{0, 1, -1, 1<<63 - 1, -1 << 63}
	key := MasterKey([]byte("secret"))
	entry := append(AppendEntryHeader(nil, EntryHeader{LedgerID: 9, EntryID: 8, LastAddConfirmed: 7, Length: 6}),
		bytes.Repeat([]byte{0xab}, 100)...)
	for _, version := range []uint8{0, 1, 2} {
		for _, flags := range []Flags{0, FlagDoFencing, FlagRecoveryAdd | FlagHighPriority, 0xfff0} {
			h := Header{Version: version, Flags: flags}
			if version == 0 {
				h.Flags = 0
			}
			var readKey [MasterKeyLength]byte
			if version >= 2 {
				readKey = key
			}
			for _, id := range ids {
				e := append([]byte(nil), entry...)
				binary.BigEndian.PutUint64(e, uint64(id))
				binary.BigEndian.PutUint64(e[8:], uint64(-id))
				reqs := []Request{
					{Header: withOp(h, OpAddEntry), Add: AddRequest{Header: withOp(h, OpAddEntry), MasterKey: key,
						LedgerID: id, EntryID: -id, Entry: e}},
					{Header: withOp(h, OpReadEntry), Read: ReadRequest{Header: withOp(h, OpReadEntry),
						LedgerID: id, EntryID: -id, MasterKey: readKey, HasMasterKey: version >= 2}},
					{Header: withOp(h, OpBatchReadEntry), BatchRead: BatchReadRequest{Header: withOp(h, OpBatchReadEntry),
						LedgerID: id, StartEntryID: -id, RequestID: id ^ 0x55, MaxCount: int32(uint32(id) >> 1),
						MaxSize: int64(uint64(id) >> 1), MasterKey: readKey, HasMasterKey: version >= 2}},
					{Header: withOp(h, OpAuth), Auth: AuthRequest{Header: withOp(h, OpAuth),
						Message: AuthMessage{PluginName: bytes.Repeat([]byte("p"), int(id&0xff)), Payload: e}}},
				}
				for _, want := range reqs {
					if want.Header.Op == OpReadEntry && flags.Has(FlagDoFencing) && version < 2 {
						continue // a pre-v2 fencing read has no key on the wire
					}
					enc, err := encodeRequest(&want)
					if err != nil {
						t.Fatal(err)
					}
					var got Request
					if err := DecodeRequest(enc[LengthPrefixSize:], &got); err != nil {
						t.Fatalf("%+v: %v", want.Header, err)
					}
					if got.Header != want.Header || !reflect.DeepEqual(requestPart(&got), requestPart(&want)) {
						t.Fatalf("round trip:\n got %+v\nwant %+v", requestPart(&got), requestPart(&want))
					}
				}
				resps := []Response{
					{Header: withOp(h, OpAddEntry), Add: AddResponse{Header: withOp(h, OpAddEntry), RC: ReturnCode(id),
						LedgerID: id, EntryID: -id}},
					{Header: withOp(h, OpReadEntry), Read: ReadResponse{Header: withOp(h, OpReadEntry), RC: EOK,
						LedgerID: id, EntryID: -id, Entry: e}},
					{Header: withOp(h, OpBatchReadEntry), BatchRead: batchOf(t, withOp(h, OpBatchReadEntry), id, e, e[:40], nil)},
					{Header: withOp(h, OpAuth), Auth: AuthResponse{Header: withOp(h, OpAuth),
						Message: AuthMessage{PluginName: []byte("x"), Payload: e}}},
				}
				for _, want := range resps {
					enc, err := encodeResponse(&want)
					if err != nil {
						t.Fatal(err)
					}
					var got Response
					if err := DecodeResponse(enc[LengthPrefixSize:], &got); err != nil {
						t.Fatalf("%+v: %v", want.Header, err)
					}
					if got.Header != want.Header || !reflect.DeepEqual(responsePart(&got), responsePart(&want)) {
						t.Fatalf("round trip:\n got %+v\nwant %+v", responsePart(&got), responsePart(&want))
					}
				}
			}
		}
	}
}

func withOp(h Header, op OpCode) Header {
	h.Op = op
	return h
}

func batchOf(t *testing.T, h Header, id int64, entries ...[]byte) BatchReadResponse {
	var data []byte
	for _, e := range entries {
		var err error
		if data, err = AppendBatchEntry(data, e); err != nil {
			t.Fatal(err)
		}
	}
	return BatchReadResponse{Header: h, RC: EOK, LedgerID: id, StartEntryID: -id, RequestID: id + 1,
		Data: data, Count: len(entries)}
}

// TestStreamSplit feeds a stream of frames in pieces of every size and checks that splitting
// and decoding finds every message.
func TestStreamSplit(t *testing.T) {
	var stream []byte
	var want []Header
	for _, v := range requestVectors(t) {
		stream = append(stream, unhex(t, v.hex)...)
		want = append(want, v.want.Header)
	}
	for piece := 1; piece <= len(stream); piece++ {
		var inbound []byte
		var got []Header
		for off := 0; off < len(stream); off += piece {
			inbound = append(inbound, stream[off:min(off+piece, len(stream))]...)
			for {
				size, complete, err := SplitFrame(inbound, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !complete {
					break
				}
				var req Request
				if err := DecodeRequest(inbound[LengthPrefixSize:size], &req); err != nil {
					t.Fatal(err)
				}
				got = append(got, req.Header)
				inbound = inbound[size:]
			}
		}
		if !reflect.DeepEqual(got, want) || len(inbound) != 0 {
			t.Fatalf("piece %d: got %v, want %v, %d bytes left", piece, got, want, len(inbound))
		}
	}
}
