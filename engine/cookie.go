package engine

import (
	"bufio"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// Cookie ties a bookie's directories to its identity, as BookKeeper's cookie does: every
// journal and ledger dir holds one in current/VERSION. A bookie refuses to start when a cookie
// is missing or different, so a wiped or swapped disk is never silently served as empty.
type Cookie struct {
	BookieID   string
	JournalDir string   // journal dirs joined by ","
	LedgerDirs []string // ledger dirs
	InstanceID string
}

const (
	cookieLayoutVersion = 5 // BookKeeper's layout version
	cookieFile          = "VERSION"
	currentDir          = "current"
)

// Encode renders the cookie in BookKeeper's text layout: the version line, then protobuf text
// fields (ledgerDirs as "<count>\t<dir>\t<dir>...").
func (c Cookie) Encode() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", cookieLayoutVersion)
	fmt.Fprintf(&b, "bookieHost: %s\n", strconv.Quote(c.BookieID))
	fmt.Fprintf(&b, "journalDir: %s\n", strconv.Quote(c.JournalDir))
	dirs := append([]string{strconv.Itoa(len(c.LedgerDirs))}, c.LedgerDirs...)
	fmt.Fprintf(&b, "ledgerDirs: %s\n", strconv.Quote(strings.Join(dirs, "\t")))
	if c.InstanceID != "" {
		fmt.Fprintf(&b, "instanceId: %s\n", strconv.Quote(c.InstanceID))
	}
	return []byte(b.String())
}

// ParseCookie parses Encode's format.
func ParseCookie(data []byte) (Cookie, error) {
	var c Cookie
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	if !sc.Scan() || strings.TrimSpace(sc.Text()) != strconv.Itoa(cookieLayoutVersion) {
		return c, fmt.Errorf("%w: unsupported cookie layout %q", ErrCookie, sc.Text())
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		key, raw, ok := strings.Cut(line, ":")
		if !ok {
			return c, fmt.Errorf("%w: malformed cookie line %q", ErrCookie, line)
		}
		val, err := strconv.Unquote(strings.TrimSpace(raw))
		if err != nil {
			return c, fmt.Errorf("%w: malformed cookie value in %q", ErrCookie, line)
		}
		switch strings.TrimSpace(key) {
		case "bookieHost":
			c.BookieID = val
		case "journalDir":
			c.JournalDir = val
		case "ledgerDirs":
			parts := strings.Split(val, "\t")
			n, err := strconv.Atoi(parts[0])
			if err != nil || n != len(parts)-1 {
				return c, fmt.Errorf("%w: malformed ledgerDirs %q", ErrCookie, val)
			}
			c.LedgerDirs = parts[1:]
		case "instanceId":
			c.InstanceID = val
		}
	}
	return c, nil
}

// Diff describes how c differs from want ("" if they match): the bookie id, the cluster instance,
// or the dirs (each spelling of a dir that names the same one matches, as the dirs' own cookies
// do). The bookie checks the metadata store's cookie with it.
func (c Cookie) Diff(want Cookie) string { return c.diff(want) }

// diff describes how c differs from want ("" if they match).
func (c Cookie) diff(want Cookie) string {
	switch {
	case c.BookieID != want.BookieID:
		return fmt.Sprintf("bookie id %q, expected %q", c.BookieID, want.BookieID)
	case c.InstanceID != want.InstanceID:
		return fmt.Sprintf("cluster instance id %q, expected %q", c.InstanceID, want.InstanceID)
	case !sameDirs(strings.Split(c.JournalDir, ","), strings.Split(want.JournalDir, ",")):
		return fmt.Sprintf("journal dirs %q, expected %q", c.JournalDir, want.JournalDir)
	case !sameDirs(c.LedgerDirs, want.LedgerDirs):
		return fmt.Sprintf("ledger dirs %q, expected %q", c.LedgerDirs, want.LedgerDirs)
	}
	return ""
}

// sameDirs reports whether a cookie's dirs name wanted ones. The bookie names its dirs by
// clean absolute paths; a cookie written before it did may hold another spelling: an absolute
// one not clean ("/data/journal/"), which matches its clean form, or a relative one, which
// matches the wanted dir it names from the working directory (the one it was written from,
// unless the bookie moved: then the cookie check refuses it, as it did then).
func sameDirs(cookie, want []string) bool {
	if len(cookie) != len(want) {
		return false
	}
	for i, d := range cookie {
		if d == want[i] {
			continue
		}
		if abs, err := filepath.Abs(d); err != nil || abs != want[i] {
			return false
		}
	}
	return true
}

// checkCookies verifies the cookie of every dir against want. With no cookie anywhere it
// writes them (a new bookie) and reports created. Any other mix is an error that says what to do.
func checkCookies(fs diskio.FS, dirs []string, want Cookie, requireExisting bool) (created bool, err error) {
	var missing, present, stale []string
	for _, dir := range dirs {
		path := filepath.Join(dir, currentDir, cookieFile)
		data, err := diskio.ReadFile(fs, path, 64<<10)
		if errors.Is(err, diskio.ErrNotExist) {
			missing = append(missing, dir)
			continue
		}
		if err != nil {
			return false, fmt.Errorf("%w: read %s: %w", ErrCookie, path, err)
		}
		c, err := ParseCookie(data)
		if err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
		if d := c.diff(want); d != "" {
			return false, fmt.Errorf("%w: %s holds %s. The directory belongs to another bookie or "+
				"configuration; point the bookie at its own directories, or clear the directory if its data "+
				"is no longer wanted", ErrCookie, path, d)
		}
		if c.JournalDir != want.JournalDir || !slices.Equal(c.LedgerDirs, want.LedgerDirs) {
			stale = append(stale, dir) // it names dirs relatively: rewritten below
		}
		present = append(present, dir)
	}
	if len(present) > 0 && len(missing) > 0 {
		return false, fmt.Errorf("%w: directories %v have no cookie while %v do. A disk was wiped, replaced "+
			"or added; the bookie refuses to serve it as empty. Restore the data, or decommission this "+
			"bookie's data (let auto-recovery re-replicate it), clear all its directories and start it as new",
			ErrCookie, missing, present)
	}
	if len(missing) == 0 {
		// Written as the bookie names its dirs now, the cookies match from any working directory.
		for _, dir := range stale {
			if err := diskio.WriteFileAtomic(fs, filepath.Join(dir, currentDir, cookieFile), want.Encode()); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	if requireExisting {
		return false, fmt.Errorf("%w: none of the directories %v has a cookie, but the metadata store holds one "+
			"for bookie %s: its disks were wiped or replaced. The bookie refuses to serve them as empty. Restore the "+
			"data, or decommission the bookie (delete its cookie from the metadata store once its ledgers are "+
			"re-replicated) and start it as new", ErrCookie, dirs, want.BookieID)
	}
	for _, dir := range dirs {
		cur := filepath.Join(dir, currentDir)
		if err := fs.MkdirAll(cur); err != nil {
			return false, err
		}
		if err := diskio.WriteFileAtomic(fs, filepath.Join(cur, cookieFile), want.Encode()); err != nil {
			return false, err
		}
	}
	return true, nil
}
