package engine

import (
	"path/filepath"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestCookieNamingDirsRelativelyIsTheBookies: a cookie written before the bookie named its
// dirs absolutely holds them as spelt then, relative to the working directory. From that
// directory it is the bookie's own, and it is rewritten with the absolute dirs, so it stays
// the bookie's own from any other.
func TestCookieNamingDirsRelativelyIsTheBookies(t *testing.T) {
	fs := diskio.NewMem(4096)
	abs := func(d string) string {
		a, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	want := Cookie{BookieID: "127.0.0.1:3181", InstanceID: "i", JournalDir: abs("data/journal"),
		LedgerDirs: []string{abs("data/l1"), abs("data/l2")}}
	old := want
	old.JournalDir, old.LedgerDirs = "data/journal", []string{"data/l1", "./data/l2"}
	dirs := []string{want.JournalDir, want.LedgerDirs[0], want.LedgerDirs[1]}
	for _, d := range dirs {
		if err := fs.MkdirAll(filepath.Join(d, currentDir)); err != nil {
			t.Fatal(err)
		}
		if err := diskio.WriteFileAtomic(fs, filepath.Join(d, currentDir, cookieFile), old.Encode()); err != nil {
			t.Fatal(err)
		}
	}
	if created, err := checkCookies(fs, dirs, want, true); err != nil || created {
		t.Fatalf("cookies naming the same dirs relatively: created %v, %v", created, err)
	}
	for _, d := range dirs {
		data, err := diskio.ReadFile(fs, filepath.Join(d, currentDir, cookieFile), 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != string(want.Encode()) {
			t.Fatalf("%s's cookie after the check:\n%s\nwant\n%s", d, data, want.Encode())
		}
	}

	// Another directory's relative name is not this one.
	other := old
	other.LedgerDirs = []string{"data/l1", "elsewhere/l2"}
	if d := other.diff(want); d == "" {
		t.Fatal("a cookie naming another ledger dir relatively matched")
	}
}
