package client

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// racks returns a rack-aware policy over len(names) racks of perRack bookies each ("A0:3181"
// on rack /A, ...), and the bookies.
func racks(names string, perRack int) (RackAwarePlacement, []metadata.BookieInfo) {
	p := RackAwarePlacement{Racks: map[string]string{}}
	var avail []metadata.BookieInfo
	for _, r := range names {
		for i := range perRack {
			id := fmt.Sprintf("%c%d:3181", r, i)
			p.Racks[id] = "/" + string(r)
			avail = append(avail, metadata.BookieInfo{ID: id, State: metadata.BookieWritable})
		}
	}
	return p, avail
}

// oneRackQuorum returns a write quorum (qw consecutive positions, wrapping) of ens on one rack.
func oneRackQuorum(p RackAwarePlacement, ens []string, qw int) ([]string, bool) {
	n := len(ens)
	for s := range n {
		var quorum []string
		seen := map[string]bool{}
		for k := range qw {
			quorum = append(quorum, ens[(s+k)%n])
			seen[p.rack(ens[(s+k)%n])] = true
		}
		if len(seen) < 2 {
			return quorum, true
		}
	}
	return nil, false
}

// TestRackAwareNewEnsembleSpreadsEveryWriteQuorum: where the racks allow it, every write
// quorum of a new ensemble spans two racks, for every (E, Qw), and no bookie is used twice.
func TestRackAwareNewEnsembleSpreadsEveryWriteQuorum(t *testing.T) {
	for _, setup := range []struct {
		racks   string
		perRack int
	}{{"ABC", 3}, {"AB", 4}} {
		p, avail := racks(setup.racks, setup.perRack)
		for e := 2; e <= min(6, len(avail)); e++ {
			for qw := 2; qw <= e; qw++ {
				if len(setup.racks) == 2 && qw == 2 && e%2 == 1 {
					continue // an odd ring cannot alternate two racks
				}
				for range 100 {
					ens, err := p.NewEnsemble(e, qw, avail, nil)
					if err != nil {
						t.Fatal(err)
					}
					if q, bad := oneRackQuorum(p, ens, qw); bad {
						t.Fatalf("racks %s: E=%d Qw=%d: ensemble %v has the write quorum %v on one rack", setup.racks, e, qw, ens, q)
					}
					if len(slices.Compact(slices.Sorted(slices.Values(ens)))) != e {
						t.Fatalf("ensemble %v uses a bookie twice", ens)
					}
				}
			}
		}
	}
}

// TestRackAwareReplaceKeepsEveryWriteQuorumOnTwoRacks: E=3, Qw=2 on racks A, B, C: the write
// quorums are (0,1), (1,2), (2,0); replacing position 2 must keep (1,2) and (2,0) on two racks,
// which only a rack-C bookie does.
func TestRackAwareReplaceKeepsEveryWriteQuorumOnTwoRacks(t *testing.T) {
	p, avail := racks("ABC", 3)
	ens := []string{"A0:3181", "B0:3181", "C0:3181"}
	for range 200 {
		repl, err := p.Replace(ens, 2, 2, avail, map[string]bool{"C0:3181": true})
		if err != nil {
			t.Fatal(err)
		}
		if p.rack(repl) != "/C" || repl == "C0:3181" {
			t.Fatalf("replacement %s of %s: want another bookie of rack /C", repl, ens[2])
		}
	}
}

// TestRackAwareFallsBackToTwoRacks: asked for three racks per write quorum with only two,
// the policy must still keep each write quorum on two racks. E=Qw=3, ensemble [A0 A1 B0],
// B0 replaced, spares A2, B1, B2: no replacement spans three racks, and A2 would put the
// write quorum on rack A alone.
func TestRackAwareFallsBackToTwoRacks(t *testing.T) {
	p, avail := racks("AB", 3)
	p.MinRacksPerWriteQuorum = 3
	ens := []string{"A0:3181", "A1:3181", "B0:3181"}
	for range 200 {
		repl, err := p.Replace(ens, 2, 3, avail, map[string]bool{"B0:3181": true})
		if err != nil {
			t.Fatal(err)
		}
		if p.rack(repl) != "/B" || repl == "B0:3181" {
			t.Fatalf("replacement %s of %s: want another bookie of rack /B", repl, ens[2])
		}
		next, err := p.NewEnsemble(3, 3, avail, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q, bad := oneRackQuorum(p, next, 3); bad {
			t.Fatalf("new ensemble %v has the write quorum %v on one rack", next, q)
		}
	}
}

// TestPlacementHonoursAFullDisk: a bookie that reports its disk full is picked only when no
// other is left, not weighted like an average bookie.
func TestPlacementHonoursAFullDisk(t *testing.T) {
	avail := []metadata.BookieInfo{
		{ID: "full:3181", State: metadata.BookieWritable, FreeDiskBytes: 0, TotalDiskBytes: 1 << 40},
		{ID: "b:3181", State: metadata.BookieWritable, FreeDiskBytes: 1 << 40, TotalDiskBytes: 1 << 40},
		{ID: "c:3181", State: metadata.BookieWritable, FreeDiskBytes: 1 << 40, TotalDiskBytes: 1 << 40},
		{ID: "unreported:3181", State: metadata.BookieWritable},
	}
	picked := map[string]int{}
	for range 3000 {
		ens, err := RandomPlacement{}.NewEnsemble(1, 1, avail, nil)
		if err != nil {
			t.Fatal(err)
		}
		picked[ens[0]]++
	}
	if picked["full:3181"] > 0 || picked["unreported:3181"] < 500 {
		t.Fatalf("picks in 3000: %v; want none of the full bookie and about 750 of the one that reports nothing", picked)
	}
	if ens, err := (RandomPlacement{}).NewEnsemble(4, 2, avail, nil); err != nil || !slices.Contains(ens, "full:3181") {
		t.Fatalf("an ensemble of all four bookies: %v, %v", ens, err)
	}
}

// TestRackAwareReplacesSeveralBookiesOnTwoRacksPerWriteQuorum: E=4, Qw=2 on racks A, B, C,
// ensemble [A1 B1 C1 B2]; B1 and C1 fail together (one ensemble change replaces both) and the
// spares are C2 and A3. Only [A1 C2 A3 B2] keeps every write quorum on two racks. The first
// replacement must not be judged against C1, which the second replaces: taking C1's rack for
// staying ruled C2 out at position 1, and A3 put (0,1) on rack A.
func TestRackAwareReplacesSeveralBookiesOnTwoRacksPerWriteQuorum(t *testing.T) {
	p := RackAwarePlacement{Racks: map[string]string{}}
	var avail []metadata.BookieInfo
	for _, id := range []string{"A1:3181", "B1:3181", "C1:3181", "B2:3181", "C2:3181", "A3:3181"} {
		p.Racks[id] = "/" + id[:1]
		avail = append(avail, metadata.BookieInfo{ID: id, State: metadata.BookieWritable})
	}
	c := &Client{cfg: Config{Placement: p}, bookies: avail}
	failed := map[string]bool{"B1:3181": true, "C1:3181": true}
	for range 100 {
		md := &metadata.LedgerMetadata{EnsembleSize: 4, WriteQuorumSize: 2, AckQuorumSize: 2,
			Ensembles: []metadata.Ensemble{{FirstEntryID: 0, Bookies: []string{"A1:3181", "B1:3181", "C1:3181", "B2:3181"}}}}
		if err := c.replaceBookies(md, 5, failed, failed, false); err != nil {
			t.Fatal(err)
		}
		last, _ := md.LastEnsemble()
		if q, bad := oneRackQuorum(p, last.Bookies, 2); bad {
			t.Fatalf("replacing B1 and C1 gave %v, with the write quorum %v on one rack; want [A1 C2 A3 B2]", last.Bookies, q)
		}
	}
}
