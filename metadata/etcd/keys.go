package etcd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// ledgerIDDigits is the width of a zero-padded ledger id in a key: enough for
// math.MaxInt64, so that key order is id order. Part of the key layout.
const ledgerIDDigits = 19

// keys builds the key layout documented in package metadata.
type keys struct {
	root string // e.g. "/ledgers", validated
}

func (k keys) ledgersPrefix() string { return k.root + "/ledgers/" }

func (k keys) ledger(id int64) string {
	return fmt.Sprintf("%s%0*d", k.ledgersPrefix(), ledgerIDDigits, id)
}

// parseLedger returns the id of a ledger key.
func (k keys) parseLedger(key []byte) (int64, error) {
	s, ok := strings.CutPrefix(string(key), k.ledgersPrefix())
	if !ok || len(s) != ledgerIDDigits {
		return 0, fmt.Errorf("%w: unexpected key %q under %s", metadata.ErrCorruptMetadata, key, k.ledgersPrefix())
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: unexpected key %q under %s", metadata.ErrCorruptMetadata, key, k.ledgersPrefix())
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: key %q: %w", metadata.ErrCorruptMetadata, key, err)
	}
	return id, nil
}

// foreignLedgerID reads a key under the ledgers prefix that parseLedger rejects. A suffix of
// decimal digits names that number (named; id -1 if it exceeds every ledger id, so names no
// ledger); anything else names no id.
func (k keys) foreignLedgerID(key []byte) (id int64, named bool) {
	s, _ := strings.CutPrefix(string(key), k.ledgersPrefix())
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1, true // all digits: only a value beyond math.MaxInt64 fails
	}
	return id, true
}

func (k keys) bookiesPrefix() string { return k.root + "/bookies/" }

func (k keys) bookieStatePrefix(s metadata.BookieState) string {
	return k.bookiesPrefix() + s.String() + "/"
}

func (k keys) bookie(s metadata.BookieState, id string) string {
	return k.bookieStatePrefix(s) + id
}

// parseBookie returns the state and id of a registration key.
func (k keys) parseBookie(key []byte) (metadata.BookieState, string, bool) {
	for _, s := range []metadata.BookieState{metadata.BookieWritable, metadata.BookieReadOnly} {
		if id, ok := strings.CutPrefix(string(key), k.bookieStatePrefix(s)); ok && metadata.ValidateBookieID(id) == nil {
			return s, id, true
		}
	}
	return 0, "", false
}

func (k keys) cookie(bookieID string) string { return k.root + "/cookies/" + bookieID }
func (k keys) instanceID() string            { return k.root + "/instanceid" }
func (k keys) idgen() string                 { return k.root + "/idgen" }

func otherState(s metadata.BookieState) metadata.BookieState {
	if s == metadata.BookieWritable {
		return metadata.BookieReadOnly
	}
	return metadata.BookieWritable
}
