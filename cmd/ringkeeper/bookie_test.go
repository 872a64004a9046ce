package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/spf13/pflag"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// TestBookieSettingsLayers: `ringkeeper bookie` takes --conf, then --set, then the other
// flags, a later layer winning; journalDirectories, from any layer, wins over the deprecated
// journalDirectory, as in BookKeeper.
func TestBookieSettingsLayers(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "bk_server.conf")
	if err := os.WriteFile(conf, []byte("journalDirectories=/file/j\nledgerDirectories=/file/l\nbookiePort=3999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args     []string
		journals string
		port     int
	}{
		{[]string{"--set", "journalDirectory=/set/old", "--journal-dirs", "/flag/j"}, "/flag/j", 3181},
		{[]string{"--conf", conf, "--set", "journalDirectory=/set/old"}, "/file/j", 3999},
		{[]string{"--conf", conf, "--set", "journalDirectories=/set/j", "--set", "bookiePort=4000"}, "/set/j", 4000},
		{[]string{"--conf", conf, "--set", "bookiePort=4000", "--port", "4001", "--journal-dirs", "/flag/j"}, "/flag/j", 4001},
		{[]string{"--set", "journalDirectory=/set/old"}, "/set/old", 3181},
	} {
		var flags bookieFlags
		f := pflag.NewFlagSet("bookie", pflag.ContinueOnError)
		flags.register(f)
		if err := f.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, _, err := flags.config(f)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := cfg.Engine.JournalDirs; len(got) != 1 || got[0] != tc.journals || cfg.BookiePort != tc.port {
			t.Errorf("%q: journal dirs %q, port %d; want [%s], %d", tc.args, got, cfg.BookiePort, tc.journals, tc.port)
		}
	}
}

// TestBookieWithUnreachableMetadataFails: `ringkeeper bookie` whose metadata service does not
// answer fails with an error that says so. It panicked (a nil pointer in bookie.Start's
// clean-up): the etcd driver's Open returned its nil *Driver as a non-nil metadata.Driver.
func TestBookieWithUnreachableMetadataFails(t *testing.T) {
	dir := t.TempDir()
	cmd := bookieCommand()
	cmd.SetArgs([]string{"--journal-dirs", filepath.Join(dir, "j"), "--ledger-dirs", filepath.Join(dir, "l"),
		"--port", strconv.Itoa(freePorts(t, 1)), "--http-port", "0", "--metadata", "etcd://127.0.0.1:1/ledgers", "--log-level", "error"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return cmd.ExecuteContext(context.Background())
	}()
	if err == nil || !errors.Is(err, metadata.ErrUnreachable) {
		t.Fatalf("bookie with metadata etcd://127.0.0.1:1: %v, want metadata.ErrUnreachable", err)
	}
}
