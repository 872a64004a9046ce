package protocol

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
)

// The vectors below are written by hand from the layouts in bookkeeper.md §2.2 and
// BookieProtoEncoding (frame length, header, fields, all big-endian), not produced by the
// encoder under test. Each is the whole frame, length prefix included.

// unhex parses hex with any whitespace and "|" separators.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex in test vector: %v", err)
	}
	return b
}

const (
	// SHA-1("ledgerpassword"), computed with sha1sum.
	hexKeyPassword = "776734ff34b8278465ec6051092ee57a434bb849"
	// SHA-1("ledger"), computed with sha1sum.
	hexKeyEmpty = "850bf1071c5e3d8c24235676f8816ae0cbe2f14f"

	hexLedger   = "0000000000001234" // 4660
	hexEntry5   = "0000000000000005"
	hexEntryLAC = "ffffffffffffffff" // -1

	// Stored entry A: ledger 0x1234, entry 5, LAC 4, length 100, CRC32C digest deadbeef,
	// payload "hi". 38 bytes.
	hexEntryA = hexLedger + hexEntry5 + "0000000000000004" + "0000000000000064" + "deadbeef" + "6869"
	// Stored entry B: ledger 0x1234, entry 6, LAC 5, length 102, digest 01020304, no payload.
	// 36 bytes.
	hexEntryB = hexLedger + "0000000000000006" + "0000000000000005" + "0000000000000066" + "01020304"
)

func keyFromHex(t testing.TB, s string) (k [MasterKeyLength]byte) {
	copy(k[:], unhex(t, s))
	return k
}

type requestVector struct {
	name   string
	hex    string
	want   Request // only Header and the sub-struct for Header.Op are compared
	encode func(Request) ([]byte, error)
}

func requestVectors(t testing.TB) []requestVector {
	key := keyFromHex(t, hexKeyPassword)
	entryA := unhex(t, hexEntryA)
	v2 := func(op OpCode, f Flags) Header { return Header{Version: 2, Op: op, Flags: f} }
	encAdd := func(r Request) ([]byte, error) { return AppendAddRequest(nil, r.Add) }
	encRead := func(r Request) ([]byte, error) { return AppendReadRequest(nil, r.Read), nil }
	encBatch := func(r Request) ([]byte, error) { return AppendBatchReadRequest(nil, r.BatchRead), nil }
	encAuth := func(r Request) ([]byte, error) { return AppendAuthRequest(nil, r.Auth) }
	return []requestVector{
		{
			name: "add",
			hex:  "0000003e | 02010000 | " + hexKeyPassword + " | " + hexEntryA,
			want: Request{Header: v2(OpAddEntry, 0), Add: AddRequest{
				Header: v2(OpAddEntry, 0), MasterKey: key, LedgerID: 0x1234, EntryID: 5, Entry: entryA}},
			encode: encAdd,
		},
		{
			name: "recovery add, high priority",
			hex:  "0000003e | 02010006 | " + hexKeyPassword + " | " + hexEntryA,
			want: Request{Header: v2(OpAddEntry, 6), Add: AddRequest{
				Header: v2(OpAddEntry, FlagRecoveryAdd|FlagHighPriority), MasterKey: key,
				LedgerID: 0x1234, EntryID: 5, Entry: entryA}},
			encode: encAdd,
		},
		{
			name: "add with the empty-password key",
			hex:  "0000003e | 02010000 | " + hexKeyEmpty + " | " + hexEntryA,
			want: Request{Header: v2(OpAddEntry, 0), Add: AddRequest{
				Header: v2(OpAddEntry, 0), MasterKey: keyFromHex(t, hexKeyEmpty),
				LedgerID: 0x1234, EntryID: 5, Entry: entryA}},
			encode: encAdd,
		},
		{
			name: "read",
			hex:  "00000014 | 02020000 | " + hexLedger + " | " + hexEntry5,
			want: Request{Header: v2(OpReadEntry, 0), Read: ReadRequest{
				Header: v2(OpReadEntry, 0), LedgerID: 0x1234, EntryID: 5}},
			encode: encRead,
		},
		{
			name: "fencing read of the LAC with key, high priority",
			hex:  "00000028 | 02020005 | " + hexLedger + " | " + hexEntryLAC + " | " + hexKeyPassword,
			want: Request{Header: v2(OpReadEntry, 5), Read: ReadRequest{
				Header: v2(OpReadEntry, FlagDoFencing|FlagHighPriority), LedgerID: 0x1234, EntryID: -1,
				MasterKey: key, HasMasterKey: true}},
			encode: encRead,
		},
		{
			name: "read with a key but no fencing",
			hex:  "00000028 | 02020000 | " + hexLedger + " | " + hexEntry5 + " | " + hexKeyPassword,
			want: Request{Header: v2(OpReadEntry, 0), Read: ReadRequest{
				Header: v2(OpReadEntry, 0), LedgerID: 0x1234, EntryID: 5, MasterKey: key, HasMasterKey: true}},
			encode: encRead,
		},
		{
			name: "legacy version 0 read",
			hex:  "00000014 | 00000002 | " + hexLedger + " | " + hexEntry5,
			want: Request{Header: Header{Op: OpReadEntry}, Read: ReadRequest{
				Header: Header{Op: OpReadEntry}, LedgerID: 0x1234, EntryID: 5}},
			encode: encRead,
		},
		{
			name: "batch read",
			hex: "00000028 | 02070000 | " + hexLedger + " | 000000000000000a | 0000000000000077 | " +
				"00000010 | 0000000000100000",
			want: Request{Header: v2(OpBatchReadEntry, 0), BatchRead: BatchReadRequest{
				Header: v2(OpBatchReadEntry, 0), LedgerID: 0x1234, StartEntryID: 10, RequestID: 0x77,
				MaxCount: 16, MaxSize: 1 << 20}},
			encode: encBatch,
		},
		{
			name: "fencing batch read with key",
			hex: "0000003c | 02070001 | " + hexLedger + " | 000000000000000a | 0000000000000077 | " +
				"00000010 | 0000000000100000 | " + hexKeyPassword,
			want: Request{Header: v2(OpBatchReadEntry, 1), BatchRead: BatchReadRequest{
				Header: v2(OpBatchReadEntry, FlagDoFencing), LedgerID: 0x1234, StartEntryID: 10, RequestID: 0x77,
				MaxCount: 16, MaxSize: 1 << 20, MasterKey: key, HasMasterKey: true}},
			encode: encBatch,
		},
		{
			name: "auth",
			hex:  "0000000e | 02030000 | 0a03746f6b | 1203010203",
			want: Request{Header: v2(OpAuth, 0), Auth: AuthRequest{
				Header: v2(OpAuth, 0), Message: AuthMessage{PluginName: []byte("tok"), Payload: []byte{1, 2, 3}}}},
			encode: encAuth,
		},
		{
			name: "auth with empty fields",
			hex:  "00000008 | 02030000 | 0a00 | 1200",
			want: Request{Header: v2(OpAuth, 0), Auth: AuthRequest{
				Header: v2(OpAuth, 0), Message: AuthMessage{PluginName: []byte{}, Payload: []byte{}}}},
			encode: encAuth,
		},
	}
}

// requestPart returns the header and the sub-struct DecodeRequest fills for r.Header.Op.
func requestPart(r *Request) any {
	switch r.Header.Op {
	case OpAddEntry:
		return r.Add
	case OpReadEntry:
		return r.Read
	case OpBatchReadEntry:
		return r.BatchRead
	case OpAuth:
		return r.Auth
	}
	return nil
}

func TestGoldenRequests(t *testing.T) {
	for _, v := range requestVectors(t) {
		t.Run(v.name, func(t *testing.T) {
			golden := unhex(t, v.hex)
			got, err := v.encode(v.want)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal(got, golden) {
				t.Fatalf("encode:\n got %x\nwant %x", got, golden)
			}
			size, complete, err := SplitFrame(golden, 0)
			if err != nil || !complete || size != len(golden) {
				t.Fatalf("SplitFrame = %d, %v, %v; want %d, true, nil", size, complete, err, len(golden))
			}
			var req Request
			if err := DecodeRequest(golden[LengthPrefixSize:], &req); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if req.Header != v.want.Header {
				t.Fatalf("decoded header %+v, want %+v", req.Header, v.want.Header)
			}
			if g, w := requestPart(&req), requestPart(&v.want); !reflect.DeepEqual(g, w) {
				t.Fatalf("decoded\n %+v\nwant\n %+v", g, w)
			}
		})
	}
}

type responseVector struct {
	name   string
	hex    string
	want   Response
	encode func(Response) ([]byte, error)
}

func responseVectors(t testing.TB) []responseVector {
	entryA := unhex(t, hexEntryA)
	v2 := func(op OpCode) Header { return Header{Version: 2, Op: op} }
	encAdd := func(r Response) ([]byte, error) { return AppendAddResponse(nil, r.Add), nil }
	encRead := func(r Response) ([]byte, error) { return AppendReadResponse(nil, r.Read) }
	encBatch := func(r Response) ([]byte, error) { return AppendBatchReadResponse(nil, r.BatchRead) }
	encAuth := func(r Response) ([]byte, error) { return AppendAuthResponse(nil, r.Auth) }
	batchData := unhex(t, "00000026"+hexEntryA+"00000024"+hexEntryB)
	return []responseVector{
		{
			name: "add EOK",
			hex:  "00000018 | 02010000 | 00000000 | " + hexLedger + " | " + hexEntry5,
			want: Response{Header: v2(OpAddEntry), Add: AddResponse{
				Header: v2(OpAddEntry), RC: EOK, LedgerID: 0x1234, EntryID: 5}},
			encode: encAdd,
		},
		{
			name: "add EFENCED",
			hex:  "00000018 | 02010000 | 00000068 | " + hexLedger + " | " + hexEntry5,
			want: Response{Header: v2(OpAddEntry), Add: AddResponse{
				Header: v2(OpAddEntry), RC: EFENCED, LedgerID: 0x1234, EntryID: 5}},
			encode: encAdd,
		},
		{
			name: "add EUA to a legacy version 0 request",
			hex:  "00000018 | 00000001 | 00000066 | " + hexLedger + " | " + hexEntry5,
			want: Response{Header: Header{Op: OpAddEntry}, Add: AddResponse{
				Header: Header{Op: OpAddEntry}, RC: EUA, LedgerID: 0x1234, EntryID: 5}},
			encode: encAdd,
		},
		{
			name: "read EOK with entry",
			hex:  "0000003e | 02020000 | 00000000 | " + hexLedger + " | " + hexEntry5 + " | " + hexEntryA,
			want: Response{Header: v2(OpReadEntry), Read: ReadResponse{
				Header: v2(OpReadEntry), RC: EOK, LedgerID: 0x1234, EntryID: 5, Entry: entryA}},
			encode: encRead,
		},
		{
			name: "read ENOENTRY for the LAC",
			hex:  "00000018 | 02020000 | 00000002 | " + hexLedger + " | " + hexEntryLAC,
			want: Response{Header: v2(OpReadEntry), Read: ReadResponse{
				Header: v2(OpReadEntry), RC: ENOENTRY, LedgerID: 0x1234, EntryID: -1, Entry: []byte{}}},
			encode: encRead,
		},
		{
			name: "read EUNKNOWNLEDGERSTATE",
			hex:  "00000018 | 02020000 | 0000006b | " + hexLedger + " | " + hexEntry5,
			want: Response{Header: v2(OpReadEntry), Read: ReadResponse{
				Header: v2(OpReadEntry), RC: EUNKNOWNLEDGERSTATE, LedgerID: 0x1234, EntryID: 5, Entry: []byte{}}},
			encode: encRead,
		},
		{
			name: "batch read EOK with two entries",
			hex: "00000072 | 02070000 | 00000000 | " + hexLedger + " | " + hexEntry5 + " | 0000000000000077 | " +
				"00000026 | " + hexEntryA + " | 00000024 | " + hexEntryB,
			want: Response{Header: v2(OpBatchReadEntry), BatchRead: BatchReadResponse{
				Header: v2(OpBatchReadEntry), RC: EOK, LedgerID: 0x1234, StartEntryID: 5, RequestID: 0x77,
				Data: batchData, Count: 2}},
			encode: encBatch,
		},
		{
			name: "batch read EIO without entries",
			hex:  "00000020 | 02070000 | 00000065 | " + hexLedger + " | " + hexEntry5 + " | 0000000000000077",
			want: Response{Header: v2(OpBatchReadEntry), BatchRead: BatchReadResponse{
				Header: v2(OpBatchReadEntry), RC: EIO, LedgerID: 0x1234, StartEntryID: 5, RequestID: 0x77,
				Data: []byte{}}},
			encode: encBatch,
		},
		{
			name: "auth",
			hex:  "00000014 | 02030000 | 0a0c4175746844697361626c6564 | 1200",
			want: Response{Header: v2(OpAuth), Auth: AuthResponse{
				Header: v2(OpAuth), Message: AuthMessage{PluginName: []byte("AuthDisabled"), Payload: []byte{}}}},
			encode: encAuth,
		},
	}
}

func responsePart(r *Response) any {
	switch r.Header.Op {
	case OpAddEntry:
		return r.Add
	case OpReadEntry:
		return r.Read
	case OpBatchReadEntry:
		return r.BatchRead
	case OpAuth:
		return r.Auth
	}
	return nil
}

func TestGoldenResponses(t *testing.T) {
	for _, v := range responseVectors(t) {
		t.Run(v.name, func(t *testing.T) {
			golden := unhex(t, v.hex)
			got, err := v.encode(v.want)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal(got, golden) {
				t.Fatalf("encode:\n got %x\nwant %x", got, golden)
			}
			var resp Response
			if err := DecodeResponse(golden[LengthPrefixSize:], &resp); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if resp.Header != v.want.Header {
				t.Fatalf("decoded header %+v, want %+v", resp.Header, v.want.Header)
			}
			if g, w := responsePart(&resp), responsePart(&v.want); !reflect.DeepEqual(g, w) {
				t.Fatalf("decoded\n %+v\nwant\n %+v", g, w)
			}
		})
	}
}

func TestGoldenBatchEntries(t *testing.T) {
	golden := unhex(t, "00000072 | 02070000 | 00000000 | "+hexLedger+" | "+hexEntry5+" | 0000000000000077 | "+
		"00000026 | "+hexEntryA+" | 00000024 | "+hexEntryB)
	var resp Response
	if err := DecodeResponse(golden[LengthPrefixSize:], &resp); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	for e := range resp.BatchRead.Entries() {
		got = append(got, e)
	}
	want := [][]byte{unhex(t, hexEntryA), unhex(t, hexEntryB)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("entries %x, want %x", got, want)
	}
	// Built piece by piece: header with no data, entries appended, length patched.
	buf := []byte("prefix")
	start := len(buf)
	buf, err := AppendBatchReadResponse(buf, BatchReadResponse{
		Header: Header{Version: 2}, LedgerID: 0x1234, StartEntryID: 5, RequestID: 0x77})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range want {
		if buf, err = AppendBatchEntry(buf, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := PatchFrameLength(buf, start); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[start:], golden) {
		t.Fatalf("incremental build:\n got %x\nwant %x", buf[start:], golden)
	}
}

// Error responses produced from a failed decode, against hand-written vectors.
func TestGoldenErrorResponses(t *testing.T) {
	cases := []struct {
		name, request, response string
		code                    ReturnCode
	}{
		{
			name:     "read of an unserved version gets EBADVERSION with that version",
			request:  "00000014 | 03020000 | " + hexLedger + " | " + hexEntry5,
			response: "00000018 | 03020000 | 00000067 | " + hexLedger + " | " + hexEntry5,
			code:     EBADVERSION,
		},
		{
			name:     "fencing read without key gets EBADREQ",
			request:  "00000014 | 02020001 | " + hexLedger + " | " + hexEntryLAC,
			response: "00000018 | 02020000 | 00000064 | " + hexLedger + " | " + hexEntryLAC,
			code:     EBADREQ,
		},
		{
			name:     "add with a short stored entry gets EBADREQ",
			request:  "00000028 | 02010000 | " + hexKeyPassword + " | " + hexLedger + " | " + hexEntry5,
			response: "00000018 | 02010000 | 00000064 | " + hexLedger + " | " + hexEntry5,
			code:     EBADREQ,
		},
		{
			name: "batch read with a negative count gets EBADREQ with its request id",
			request: "00000028 | 02070000 | " + hexLedger + " | " + hexEntry5 + " | 0000000000000077 | " +
				"ffffffff | 0000000000100000",
			response: "00000020 | 02070000 | 00000064 | " + hexLedger + " | " + hexEntry5 + " | 0000000000000077",
			code:     EBADREQ,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := unhex(t, c.request)
			var r Request
			err := DecodeRequest(req[LengthPrefixSize:], &r)
			de, ok := AsDecodeError(err)
			if !ok || de.Action != ActionRespond || de.Code != c.code || !ShouldRespond(err) {
				t.Fatalf("err = %v, want a respond error with %v", err, c.code)
			}
			if got, want := de.AppendResponse(nil), unhex(t, c.response); !bytes.Equal(got, want) {
				t.Fatalf("response:\n got %x\nwant %x", got, want)
			}
		})
	}
}

func TestMasterKey(t *testing.T) {
	cases := []struct{ password, key string }{
		{"", hexKeyEmpty},
		{"password", hexKeyPassword},
	}
	for _, c := range cases {
		got := MasterKey([]byte(c.password))
		if want := keyFromHex(t, c.key); got != want {
			t.Errorf("MasterKey(%q) = %x, want %x", c.password, got, want)
		}
	}
	if MasterKey(nil) != MasterKey([]byte{}) {
		t.Error("nil and empty passwords differ")
	}
	// SHA-1("ledger\x00\xff"), computed with sha1sum: binary passwords are hashed as they are.
	if got, want := MasterKey([]byte{0, 0xff}), keyFromHex(t, "6cb3a8d61a49ef1482dc67efda98fe2a694fcccc"); got != want {
		t.Errorf("binary password key = %x, want %x", got, want)
	}
	a, b := MasterKey([]byte("a")), MasterKey([]byte("b"))
	if !MasterKeyEqual(a[:], a[:]) || MasterKeyEqual(a[:], b[:]) {
		t.Error("MasterKeyEqual does not compare")
	}
	if MasterKeyEqual(a[:19], a[:19]) || MasterKeyEqual(nil, nil) {
		t.Error("MasterKeyEqual accepts keys of the wrong length")
	}
}

func TestEntryHeader(t *testing.T) {
	entry := unhex(t, hexEntryA)
	h, err := ParseEntryHeader(entry)
	if err != nil {
		t.Fatal(err)
	}
	want := EntryHeader{LedgerID: 0x1234, EntryID: 5, LastAddConfirmed: 4, Length: 100}
	if h != want {
		t.Fatalf("header %+v, want %+v", h, want)
	}
	if got := AppendEntryHeader(nil, h); !bytes.Equal(got, entry[:StoredEntryHeaderSize]) {
		t.Fatalf("AppendEntryHeader = %x", got)
	}
	if _, err := ParseEntryHeader(entry[:31]); err == nil {
		t.Fatal("31-byte entry parsed")
	}
}

// The server-side helpers answer a decoded request with its version and ids, flags 0.
func TestRequestHelpers(t *testing.T) {
	var req Request
	frame := unhex(t, "02010006 | "+hexKeyPassword+" | "+hexEntryA)
	if err := DecodeRequest(frame, &req); err != nil {
		t.Fatal(err)
	}
	if !req.Add.IsRecoveryAdd() || !req.Add.IsHighPriority() {
		t.Fatal("add flags not reported")
	}
	want := unhex(t, "00000018 | 02010000 | 00000068 | "+hexLedger+" | "+hexEntry5)
	if got := req.Add.AppendResponse(nil, EFENCED); !bytes.Equal(got, want) {
		t.Fatalf("add response %x, want %x", got, want)
	}

	frame = unhex(t, "02020005 | "+hexLedger+" | "+hexEntry5+" | "+hexKeyPassword)
	if err := DecodeRequest(frame, &req); err != nil {
		t.Fatal(err)
	}
	if !req.Read.IsFencing() || !req.Read.IsHighPriority() {
		t.Fatal("read flags not reported")
	}
	want = unhex(t, "0000003e | 02020000 | 00000000 | "+hexLedger+" | "+hexEntry5+" | "+hexEntryA)
	got, err := req.Read.AppendResponse(nil, EOK, unhex(t, hexEntryA))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read response %x, %v; want %x", got, err, want)
	}

	frame = unhex(t, "02070001 | "+hexLedger+" | 000000000000000a | 0000000000000077 | 00000000 | "+
		"0000000000000000 | "+hexKeyPassword)
	if err := DecodeRequest(frame, &req); err != nil {
		t.Fatal(err)
	}
	if !req.BatchRead.IsFencing() || req.BatchRead.MaxCount != 0 {
		t.Fatalf("batch read %+v", req.BatchRead)
	}
	if ActionClose.String() != "close" || ActionRespond.String() != "respond" {
		t.Fatal("Action.String")
	}
}
