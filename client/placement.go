package client

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// PlacementPolicy chooses bookies for ensembles. Implementations must be safe for concurrent
// use. available holds the writable bookies; excluded bookies must not be chosen.
type PlacementPolicy interface {
	// NewEnsemble picks size bookies for a ledger whose write quorum is writeQuorum.
	NewEnsemble(size, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) ([]string, error)
	// Replace picks a bookie to take the place of ensemble[index]. Positions that other
	// replacements of the same change will fill are empty strings (their bookies are in
	// excluded).
	Replace(ensemble []string, index, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) (string, error)
}

// RandomPlacement picks bookies at random, weighted by free disk space, so fuller bookies get
// fewer new ledgers (BookKeeper's default policy, with its disk-weighted option).
type RandomPlacement struct{}

func candidates(available []metadata.BookieInfo, excluded map[string]bool) []metadata.BookieInfo {
	var out []metadata.BookieInfo
	for _, b := range available {
		if !excluded[b.ID] {
			out = append(out, b)
		}
	}
	return out
}

// weightedPick removes and returns one candidate, chosen with probability proportional to its
// free space. Bookies that report no disk (TotalDiskBytes 0) count as average; one that reports
// its disk full weighs one byte, picked only when no other is left.
func weightedPick(cands []metadata.BookieInfo) (metadata.BookieInfo, []metadata.BookieInfo) {
	var total, reported float64
	n := 0
	for _, c := range cands {
		if c.TotalDiskBytes > 0 {
			total += float64(c.FreeDiskBytes)
			n++
		}
	}
	if n > 0 {
		reported = total / float64(n)
	}
	weight := func(c metadata.BookieInfo) float64 {
		if c.TotalDiskBytes == 0 {
			return max(reported, 1)
		}
		return max(float64(c.FreeDiskBytes), 1)
	}
	var sum float64
	for _, c := range cands {
		sum += weight(c)
	}
	x := rand.Float64() * sum
	i := 0
	for ; i < len(cands)-1; i++ {
		x -= weight(cands[i])
		if x < 0 {
			break
		}
	}
	picked := cands[i]
	return picked, slices.Delete(slices.Clone(cands), i, i+1)
}

// NewEnsemble implements PlacementPolicy.
func (RandomPlacement) NewEnsemble(size, _ int, available []metadata.BookieInfo, excluded map[string]bool) ([]string, error) {
	cands := candidates(available, excluded)
	if len(cands) < size {
		return nil, fmt.Errorf("%w: need %d, %d writable", ErrNotEnoughBookies, size, len(cands))
	}
	out := make([]string, 0, size)
	for range size {
		var b metadata.BookieInfo
		b, cands = weightedPick(cands)
		out = append(out, b.ID)
	}
	return out, nil
}

// Replace implements PlacementPolicy.
func (RandomPlacement) Replace(ensemble []string, _ int, _ int, available []metadata.BookieInfo, excluded map[string]bool) (string, error) {
	ex := withEnsemble(excluded, ensemble)
	cands := candidates(available, ex)
	if len(cands) == 0 {
		return "", fmt.Errorf("%w: no writable bookie outside the ensemble", ErrNotEnoughBookies)
	}
	b, _ := weightedPick(cands)
	return b.ID, nil
}

func withEnsemble(excluded map[string]bool, ensemble []string) map[string]bool {
	ex := make(map[string]bool, len(excluded)+len(ensemble))
	for k, v := range excluded {
		ex[k] = v
	}
	for _, b := range ensemble {
		ex[b] = true
	}
	return ex
}

// RackAwarePlacement spreads every write quorum over at least MinRacksPerWriteQuorum racks
// when the available bookies allow it, from a static bookie → rack map (bookies not in it are
// in DefaultRack). With too few racks it still places the ensemble, as BookKeeper does when
// enforceMinNumRacksPerWriteQuorum is off, over as many racks as it can.
type RackAwarePlacement struct {
	Racks                  map[string]string
	DefaultRack            string
	MinRacksPerWriteQuorum int
}

func (p RackAwarePlacement) rack(id string) string {
	if r, ok := p.Racks[id]; ok {
		return r
	}
	if p.DefaultRack != "" {
		return p.DefaultRack
	}
	return "/default-rack"
}

// spreads reports whether rack r at position i leaves every write quorum containing i able
// to span want racks (positions not filled yet count as possibly another rack).
func (p RackAwarePlacement) spreads(ensemble []string, i, writeQuorum int, r string, want int) bool {
	n := len(ensemble)
	for s := i - writeQuorum + 1; s <= i; s++ {
		racks := map[string]bool{r: true}
		empty := 0
		for k := range writeQuorum {
			j := ((s+k)%n + n) % n
			if j == i {
				continue
			}
			if ensemble[j] == "" {
				empty++
			} else {
				racks[p.rack(ensemble[j])] = true
			}
		}
		if len(racks)+empty < want {
			return false
		}
	}
	return true
}

// want is how many racks each write quorum should span.
func (p RackAwarePlacement) want(writeQuorum int) int {
	return min(max(p.MinRacksPerWriteQuorum, 2), writeQuorum)
}

// pick picks the bookie for position i among cands: one that lets the write quorums through i
// span want racks, or, where none does, as many racks as any allows (fewer racks than
// MinRacksPerWriteQuorum must not leave a write quorum on a single rack).
func (p RackAwarePlacement) pick(ensemble []string, i, writeQuorum, want int, cands []metadata.BookieInfo) (metadata.BookieInfo, []metadata.BookieInfo) {
	for ; want > 1; want-- {
		var good []metadata.BookieInfo
		for _, c := range cands {
			if p.spreads(ensemble, i, writeQuorum, p.rack(c.ID), want) {
				good = append(good, c)
			}
		}
		if len(good) > 0 {
			b, _ := weightedPick(good)
			return b, slices.DeleteFunc(slices.Clone(cands), func(c metadata.BookieInfo) bool { return c.ID == b.ID })
		}
	}
	return weightedPick(cands)
}

// rackAwareTries bounds how many random greedy placements NewEnsemble tries for one that
// spreads every write quorum over want racks, before it tries one rack fewer (down to two);
// with racks too few for any, it returns the last one.
const rackAwareTries = 64

// NewEnsemble implements PlacementPolicy.
func (p RackAwarePlacement) NewEnsemble(size, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) ([]string, error) {
	all := candidates(available, excluded)
	if len(all) < size {
		return nil, fmt.Errorf("%w: need %d, %d writable", ErrNotEnoughBookies, size, len(all))
	}
	var ensemble []string
	for want := p.want(writeQuorum); want >= min(2, writeQuorum); want-- {
		for range rackAwareTries { // the greedy choice can paint itself into a corner: try again
			ensemble = make([]string, size)
			cands := all
			for i := range size {
				var b metadata.BookieInfo
				b, cands = p.pick(ensemble, i, writeQuorum, want, cands)
				ensemble[i] = b.ID
			}
			ok := true
			for i := range size {
				if !p.spreads(ensemble, i, writeQuorum, p.rack(ensemble[i]), want) {
					ok = false
					break
				}
			}
			if ok {
				return ensemble, nil
			}
		}
	}
	return ensemble, nil
}

// Replace implements PlacementPolicy.
func (p RackAwarePlacement) Replace(ensemble []string, index, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) (string, error) {
	cands := candidates(available, withEnsemble(excluded, ensemble))
	if len(cands) == 0 {
		return "", fmt.Errorf("%w: no writable bookie outside the ensemble", ErrNotEnoughBookies)
	}
	e := slices.Clone(ensemble)
	e[index] = ""
	b, _ := p.pick(e, index, writeQuorum, p.want(writeQuorum), cands)
	return b.ID, nil
}
