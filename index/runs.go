package index

import (
	"encoding/binary"
	"fmt"
)

// maxRunEntries bounds the entries of one run, so that a look-up decodes at most this many
// pairs (about a microsecond) and a value stays a few KiB.
const maxRunEntries = 64

// pair is one entry's location inside a run.
type pair struct {
	entry int64
	loc   uint64
}

// appendRun appends the value of a run holding ps: at least one pair, entries strictly
// increasing, at most maxRunEntries of them. The key holds the ledger and ps's last entry.
func appendRun(dst []byte, ps []pair) []byte {
	first, last := ps[0].entry, ps[len(ps)-1].entry
	dst = binary.AppendUvarint(dst, uint64(len(ps)))
	dst = binary.AppendUvarint(dst, uint64(last-first))
	dst = binary.AppendUvarint(dst, ps[0].loc)
	for i := 1; i < len(ps); i++ {
		dst = binary.AppendUvarint(dst, uint64(ps[i].entry-ps[i-1].entry))
		// Locations of a flushed ledger grow by a record's size; a signed delta also covers
		// runs that a merge assembled from several logs.
		dst = binary.AppendVarint(dst, int64(ps[i].loc-ps[i-1].loc))
	}
	return dst
}

// runHeader decodes the count and first entry of a run value whose key says it ends at last.
// The rest is checked by decodeRun.
func runHeader(v []byte, ledgerID, last int64) (count int, first int64, rest []byte, err error) {
	n, k := binary.Uvarint(v)
	if k <= 0 || n == 0 || n > maxRunEntries {
		return 0, 0, nil, runCorrupt(ledgerID, last, "bad entry count")
	}
	v = v[k:]
	span, k := binary.Uvarint(v)
	if k <= 0 || span > uint64(last) || n-1 > span {
		return 0, 0, nil, runCorrupt(ledgerID, last, "bad entry span")
	}
	return int(n), last - int64(span), v[k:], nil
}

// decodeRun appends the pairs of a run value (key: ledgerID, last) to dst. Every field is
// checked: the count, strictly increasing entries that end exactly at last, no trailing bytes.
func decodeRun(dst []pair, v []byte, ledgerID, last int64) ([]pair, error) {
	err := scanRun(v, ledgerID, last, func(p pair) bool {
		dst = append(dst, p)
		return true
	})
	return dst, err
}

// findInRun returns the location of entry in a run value (key: ledgerID, last): a look-up's
// hot path. It decodes the whole run, hit or miss, so that a damaged run is an error
// (ErrCorrupt), never "not found" nor a wrong location: a damaged span or delta shifts the
// entries after it, and only the end check (the entries end at the key's, no trailing bytes)
// tells a shifted run from a good one.
func findInRun(v []byte, ledgerID, last, entry int64) (loc uint64, found bool, err error) {
	err = scanRun(v, ledgerID, last, func(p pair) bool {
		if p.entry == entry {
			loc, found = p.loc, true
		}
		return true
	})
	if err != nil {
		return 0, false, err
	}
	return loc, found, nil
}

// scanRun calls fn with the pairs of a run value in order until fn returns false. What it
// decodes is checked; once it reaches the last pair, the whole value is (the entries end at
// last, no trailing bytes).
func scanRun(v []byte, ledgerID, last int64, fn func(pair) bool) error {
	n, first, v, err := runHeader(v, ledgerID, last)
	if err != nil {
		return err
	}
	loc, k := binary.Uvarint(v)
	if k <= 0 {
		return runCorrupt(ledgerID, last, "truncated")
	}
	v = v[k:]
	entry := first
	for i := 0; i < n; i++ {
		if i > 0 {
			de, k := binary.Uvarint(v)
			if k <= 0 || de == 0 || de > uint64(last-entry) {
				return runCorrupt(ledgerID, last, "bad entry delta")
			}
			v = v[k:]
			dl, k := binary.Varint(v)
			if k <= 0 {
				return runCorrupt(ledgerID, last, "truncated")
			}
			v = v[k:]
			entry += int64(de)
			loc += uint64(dl)
		}
		if i == n-1 && (entry != last || len(v) != 0) {
			return runCorrupt(ledgerID, last, "entries do not end at the key's entry, or trailing bytes")
		}
		if !fn(pair{entry, loc}) {
			return nil
		}
	}
	return nil
}

func runCorrupt(ledgerID, last int64, what string) error {
	return fmt.Errorf("%w: run of ledger %d ending at entry %d: %s", ErrCorrupt, ledgerID, last, what)
}

// mergePairs merges two sorted pair lists into dst; on an entry in both, news wins.
func mergePairs(dst, news, olds []pair) []pair {
	i, j := 0, 0
	for i < len(news) && j < len(olds) {
		switch {
		case news[i].entry < olds[j].entry:
			dst = append(dst, news[i])
			i++
		case news[i].entry > olds[j].entry:
			dst = append(dst, olds[j])
			j++
		default:
			dst = append(dst, news[i])
			i++
			j++
		}
	}
	dst = append(dst, news[i:]...)
	return append(dst, olds[j:]...)
}
