package client

import (
	"encoding/hex"
	"errors"
	"testing"
)

// TestDigestKnownAnswers pins each digest of a stored entry (ledger 0x1234, entry 5, LAC 4,
// length 100) to values computed independently (Python's zlib, a bitwise CRC32C checked
// against "123456789" → e3069283, hashlib's HMAC-SHA1 keyed by SHA1("mac" ‖ password)), in
// BookKeeper's layout: CRC32 as 8 bytes, CRC32C as 4. Sealing (header and payload apart) and
// verifying (one contiguous buffer) must agree with them.
func TestDigestKnownAnswers(t *testing.T) {
	payload := []byte("ringkeeper known answer")
	for _, tc := range []struct {
		typ  DigestType
		want string
	}{
		{DigestCRC32, "00000000173de512"},
		{DigestCRC32C, "2f7ccd41"},
		{DigestHMAC, "ef223b689701907bde30be8d47598a682a1af16f"},
		{DigestDummy, ""},
	} {
		dg, err := newDigester(tc.typ, []byte("secret"))
		if err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, dg.headerSize())
		dg.seal(hdr, dg.newMAC(), 0x1234, 5, 4, 100, payload)
		if got := hex.EncodeToString(hdr[entryHeaderSize:]); got != tc.want {
			t.Errorf("digest type %v: %s, want %s", tc.typ, got, tc.want)
		}
		stored := append(hdr, payload...)
		e, err := dg.verify(stored, 0x1234, 5)
		if err != nil || e.LastAddConfirmed != 4 || e.Length != 100 || string(e.Payload) != string(payload) {
			t.Errorf("digest type %v: verify of the sealed entry: %+v, %v", tc.typ, e, err)
		}
		if tc.typ == DigestDummy {
			continue
		}
		stored[len(stored)-1] ^= 1
		if _, err := dg.verify(stored, 0x1234, 5); !errors.Is(err, ErrDigestMismatch) {
			t.Errorf("digest type %v: verify of a damaged entry: %v, want ErrDigestMismatch", tc.typ, err)
		}
	}
	if k := MasterKey([]byte("secret")); hex.EncodeToString(k[:]) != "e793cbc379107648537183605cd361d3bb789a39" {
		t.Errorf("master key SHA1(\"ledger\" ‖ \"secret\") = %x", k)
	}
}
