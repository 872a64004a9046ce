package protocol

import (
	"errors"
	"math"
	"testing"
)

func TestSplitFrame(t *testing.T) {
	cases := []struct {
		name     string
		buf      string
		max      int
		size     int
		complete bool
		err      error
	}{
		{name: "empty", buf: ""},
		{name: "three bytes", buf: "000000"},
		{name: "prefix only", buf: "00000014", size: 24},
		{name: "partial", buf: "00000004 | 0202", size: 8},
		{name: "whole", buf: "00000004 | 02020000", size: 8, complete: true},
		{name: "whole with more after", buf: "00000004 | 02020000 | 00000004", size: 8, complete: true},
		{name: "zero length", buf: "00000000", err: ErrBadFrame},
		{name: "length 3", buf: "00000003 | 020200", err: ErrBadFrame},
		{name: "negative length", buf: "ffffffff", err: ErrBadFrame},
		{name: "most negative length", buf: "80000000", err: ErrBadFrame},
		{name: "2^31-1", buf: "7fffffff", err: ErrFrameTooLarge},
		// The 5 MiB default counts the prefix: 5 MiB - 4 is the largest length.
		{name: "default max", buf: "004ffffc", size: DefaultMaxFrameSize},
		{name: "default max + 1", buf: "004ffffd", err: ErrFrameTooLarge},
		{name: "small max", buf: "00000010", max: 20, size: 20},
		{name: "small max + 1", buf: "00000011", max: 20, err: ErrFrameTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			size, complete, err := SplitFrame(unhex(t, c.buf), c.max)
			if !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if err == nil && (size != c.size || complete != c.complete) {
				t.Fatalf("SplitFrame = %d, %v; want %d, %v", size, complete, c.size, c.complete)
			}
		})
	}
}

func TestPatchFrameLength(t *testing.T) {
	if err := PatchFrameLength(make([]byte, 7), 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short buffer: %v", err)
	}
	if err := PatchFrameLength(make([]byte, 8), -1); !errors.Is(err, ErrMalformed) {
		t.Fatalf("negative start: %v", err)
	}
	buf := make([]byte, 12)
	if err := PatchFrameLength(buf, 2); err != nil || getInt32(buf[2:]) != 6 {
		t.Fatalf("patched %x, %v", buf, err)
	}
}

func TestMalformedRequests(t *testing.T) {
	key := hexKeyPassword
	cases := []struct {
		name   string
		frame  string // without the length prefix
		err    error
		action Action
		code   ReturnCode
		ledger int64
		entry  int64
		reqID  int64
	}{
		{name: "empty", frame: "", err: ErrMalformed},
		{name: "three bytes", frame: "020100", err: ErrMalformed},
		{name: "unknown opcode 0", frame: "02000000", err: ErrUnknownOp},
		{name: "READ_LAC is v3 only", frame: "02040000" + hexLedger, err: ErrUnknownOp},
		{name: "WRITE_LAC is v3 only", frame: "02050000", err: ErrUnknownOp},
		{name: "GET_BOOKIE_INFO is v3 only", frame: "02060000", err: ErrUnknownOp},
		{name: "opcode 255", frame: "02ff0000", err: ErrUnknownOp},
		{name: "legacy header, unknown op", frame: "00000009", err: ErrUnknownOp},
		{name: "add header only", frame: "02010000", err: ErrMalformed},
		{name: "add key only", frame: "02010000" + key, err: ErrMalformed},
		{name: "add key and ledger id", frame: "02010000" + key + hexLedger, err: ErrMalformed},
		{name: "add with 16-byte stored entry", frame: "02010000" + key + hexLedger + hexEntry5,
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5},
		{name: "add with 31-byte stored entry", frame: "02010000" + key + hexEntryA[:62],
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5},
		{name: "add version 3", frame: "03010000" + key + hexEntryA,
			err: ErrBadVersion, action: ActionRespond, code: EBADVERSION, ledger: 0x1234, entry: 5},
		{name: "add negative version", frame: "ff010000" + key + hexEntryA,
			err: ErrBadVersion, action: ActionRespond, code: EBADVERSION, ledger: 0x1234, entry: 5},
		{name: "read truncated", frame: "02020000" + hexLedger + "000000", err: ErrMalformed},
		{name: "read fencing without key", frame: "02020001" + hexLedger + hexEntryLAC,
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: -1},
		{name: "read fencing with short key", frame: "02020001" + hexLedger + hexEntryLAC + key[:38],
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: -1},
		{name: "read trailing garbage", frame: "02020000" + hexLedger + hexEntry5 + "00",
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5},
		{name: "read with key and more", frame: "02020001" + hexLedger + hexEntry5 + key + "00",
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5},
		{name: "version 1 read with key", frame: "01020001" + hexLedger + hexEntry5 + key,
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5},
		{name: "read version 3", frame: "03020000" + hexLedger + hexEntry5,
			err: ErrBadVersion, action: ActionRespond, code: EBADVERSION, ledger: 0x1234, entry: 5},
		{name: "batch read without request id", frame: "02070000" + hexLedger + hexEntry5, err: ErrMalformed},
		{name: "batch read without limits", frame: "02070000" + hexLedger + hexEntry5 + "0000000000000077",
			err: ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5, reqID: 0x77},
		{name: "batch read negative count",
			frame: "02070000" + hexLedger + hexEntry5 + "0000000000000077" + "80000000" + "0000000000000400",
			err:   ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5, reqID: 0x77},
		{name: "batch read negative size",
			frame: "02070000" + hexLedger + hexEntry5 + "0000000000000077" + "00000010" + "ffffffffffffffff",
			err:   ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5, reqID: 0x77},
		{name: "batch read fencing without key",
			frame: "02070001" + hexLedger + hexEntry5 + "0000000000000077" + "00000010" + "0000000000000400",
			err:   ErrMalformed, action: ActionRespond, code: EBADREQ, ledger: 0x1234, entry: 5, reqID: 0x77},
		{name: "batch read version 9",
			frame: "09070000" + hexLedger + hexEntry5 + "0000000000000077" + "00000010" + "0000000000000400",
			err:   ErrBadVersion, action: ActionRespond, code: EBADVERSION, ledger: 0x1234, entry: 5, reqID: 0x77},
		{name: "auth empty body", frame: "02030000", err: ErrMalformed},
		{name: "auth missing payload", frame: "02030000 0a03746f6b", err: ErrMalformed},
		{name: "auth missing name", frame: "02030000 1203010203", err: ErrMalformed},
		{name: "auth length past end", frame: "02030000 0a05746f6b 1200", err: ErrMalformed},
		{name: "auth truncated tag", frame: "02030000 0a00 1200 80", err: ErrMalformed},
		{name: "auth field 0", frame: "02030000 0a00 1200 0200", err: ErrMalformed},
		{name: "auth group", frame: "02030000 0a00 1200 1b", err: ErrMalformed},
		{name: "auth wire type 7", frame: "02030000 0a00 1200 1f", err: ErrMalformed},
		{name: "auth varint overflow", frame: "02030000 0a00 1200 18 ffffffffffffffffff02", err: ErrMalformed},
		{name: "auth truncated fixed64", frame: "02030000 0a00 1200 19 00000000", err: ErrMalformed},
		{name: "garbage", frame: "deadbeef0102030405060708", err: ErrUnknownOp},
		{name: "garbage with an add header", frame: "0201ffff" + "5a5a5a5a", err: ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Request
			err := DecodeRequest(unhex(t, c.frame), &r)
			if !errors.Is(err, c.err) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			de, ok := AsDecodeError(err)
			if !ok {
				t.Fatalf("err %v is not a *DecodeError", err)
			}
			if de.Action != c.action {
				t.Fatalf("action = %v, want %v (%v)", de.Action, c.action, err)
			}
			if ShouldRespond(err) != (c.action == ActionRespond) {
				t.Fatalf("ShouldRespond disagrees with Action")
			}
			if de.Error() == "" {
				t.Fatal("empty error message")
			}
			if c.action != ActionRespond {
				if got := de.AppendResponse([]byte{1}); len(got) != 1 {
					t.Fatalf("close error appended a response: %x", got)
				}
				return
			}
			if de.Code != c.code || de.LedgerID != c.ledger || de.EntryID != c.entry || de.RequestID != c.reqID {
				t.Fatalf("addressed %v %d/%d req %d, want %v %d/%d req %d",
					de.Code, de.LedgerID, de.EntryID, de.RequestID, c.code, c.ledger, c.entry, c.reqID)
			}
			checkErrorResponse(t, de)
		})
	}
}

// checkErrorResponse decodes the response a DecodeError writes and checks that it answers the
// request: same op and version, the code, the ids, no payload.
func checkErrorResponse(t *testing.T, de *DecodeError) {
	t.Helper()
	out := de.AppendResponse(nil)
	size, complete, err := SplitFrame(out, 0)
	if err != nil || !complete || size != len(out) {
		t.Fatalf("error response %x does not frame: %d %v %v", out, size, complete, err)
	}
	var resp Response
	if err := DecodeResponse(out[LengthPrefixSize:], &resp); err != nil {
		t.Fatalf("error response %x does not decode: %v", out, err)
	}
	want := Header{Version: de.Header.Version, Op: de.Header.Op}
	if resp.Header != want {
		t.Fatalf("error response header %+v, want %+v", resp.Header, want)
	}
	var rc ReturnCode
	var ledgerID, entryID int64
	switch want.Op {
	case OpAddEntry:
		rc, ledgerID, entryID = resp.Add.RC, resp.Add.LedgerID, resp.Add.EntryID
	case OpReadEntry:
		rc, ledgerID, entryID = resp.Read.RC, resp.Read.LedgerID, resp.Read.EntryID
		if len(resp.Read.Entry) != 0 {
			t.Fatal("error read response carries an entry")
		}
	case OpBatchReadEntry:
		rc, ledgerID, entryID = resp.BatchRead.RC, resp.BatchRead.LedgerID, resp.BatchRead.StartEntryID
		if resp.BatchRead.RequestID != de.RequestID || resp.BatchRead.Count != 0 {
			t.Fatalf("error batch response %+v", resp.BatchRead)
		}
	default:
		t.Fatalf("respond error for op %v", want.Op)
	}
	if rc != de.Code || ledgerID != de.LedgerID || entryID != de.EntryID {
		t.Fatalf("error response %v %d/%d, want %v %d/%d", rc, ledgerID, entryID, de.Code, de.LedgerID, de.EntryID)
	}
}

func TestMalformedResponses(t *testing.T) {
	head := "00000000" + hexLedger + hexEntry5 // rc, ledger, entry
	cases := []struct {
		name  string
		frame string
		err   error
	}{
		{name: "empty", frame: "", err: ErrMalformed},
		{name: "unknown opcode", frame: "02040000" + head, err: ErrUnknownOp},
		{name: "add short", frame: "02010000" + head[:38], err: ErrMalformed},
		{name: "add long", frame: "02010000" + head + "00", err: ErrMalformed},
		{name: "read short", frame: "02020000" + head[:38], err: ErrMalformed},
		{name: "batch without request id", frame: "02070000" + head, err: ErrMalformed},
		{name: "batch truncated length", frame: "02070000" + head + "0000000000000077" + "000000", err: ErrMalformed},
		{name: "batch negative length", frame: "02070000" + head + "0000000000000077" + "ffffffff", err: ErrMalformed},
		{name: "batch length past end", frame: "02070000" + head + "0000000000000077" + "00000002" + "00", err: ErrMalformed},
		{name: "batch huge length", frame: "02070000" + head + "0000000000000077" + "7fffffff" + "00", err: ErrMalformed},
		{name: "auth without fields", frame: "02030000", err: ErrMalformed},
		{name: "auth garbage", frame: "02030000" + "ffff", err: ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Response
			err := DecodeResponse(unhex(t, c.frame), &r)
			if !errors.Is(err, c.err) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if de, ok := AsDecodeError(err); !ok || de.Action != ActionClose || ShouldRespond(err) {
				t.Fatalf("response error %v is not a close *DecodeError", err)
			}
		})
	}
}

func TestEncoderErrors(t *testing.T) {
	if _, err := AppendAddRequest(nil, AddRequest{Entry: make([]byte, 31)}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short entry: %v", err)
	}
	if _, err := AppendBatchReadResponse(nil, BatchReadResponse{Data: []byte{0, 0, 0, 5}}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad batch data: %v", err)
	}
	if big := int64(math.MaxInt32) + 1; int64(int(big)) == big { // 64-bit int
		if _, err := frameLength(int(big)); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("oversize frame: %v", err)
		}
	}
	if _, err := frameLength(math.MaxInt32); err != nil {
		t.Fatalf("largest frame: %v", err)
	}
}

func TestHeader(t *testing.T) {
	cases := []struct {
		raw  uint32
		want Header
	}{
		{0x02010000, Header{Version: 2, Op: OpAddEntry}},
		{0x02020005, Header{Version: 2, Op: OpReadEntry, Flags: FlagDoFencing | FlagHighPriority}},
		{0x0207ffff, Header{Version: 2, Op: OpBatchReadEntry, Flags: 0xffff}},
		{0x00000002, Header{Op: OpReadEntry}},
		{0x00ffff01, Header{Op: OpAddEntry}}, // legacy: only the low byte counts
		{0xff030000, Header{Version: 0xff, Op: OpAuth}},
	}
	for _, c := range cases {
		h := ParseHeader(c.raw)
		if h != c.want {
			t.Errorf("ParseHeader(%#x) = %+v, want %+v", c.raw, h, c.want)
		}
		if back := ParseHeader(h.Uint32()); back != h {
			t.Errorf("header %+v does not round-trip: %+v", h, back)
		}
	}
	if (Header{Version: 2, Op: OpReadEntry, Flags: FlagDoFencing}).Uint32() != 0x02020001 {
		t.Error("v2 header encoding")
	}
	if (Header{Op: OpReadEntry, Flags: FlagDoFencing}).Uint32() != 2 {
		t.Error("legacy header keeps flags")
	}
	for v, ok := range map[uint8]bool{0: true, 1: true, 2: true, 3: false, 0x80: false, 0xff: false} {
		if (Header{Version: v}).Compatible() != ok {
			t.Errorf("Compatible(%d) != %v", v, ok)
		}
	}
	for _, s := range []string{OpCode(9).String(), ReturnCode(999).String(), EUA.String(), OpAuth.String()} {
		if s == "" {
			t.Error("empty String()")
		}
	}
}
