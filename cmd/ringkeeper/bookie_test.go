package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
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

// TestLogFlagsRefuseBadValues: a --log-level or --log-format that is none of the values the help
// lists is an error naming the flag, before anything starts. It used to be taken silently as
// info and text (so "--log-level=warning" logged every info line).
func TestLogFlagsRefuseBadValues(t *testing.T) {
	for _, tc := range []struct {
		cmd        func() *cobra.Command
		flag, bad  string
		otherFlags func(data string) []string
	}{
		{standaloneCommand, "--log-level", "warning", func(data string) []string {
			return []string{"--data-dir", data, "--bookies", "1", "--port", strconv.Itoa(freePorts(t, 1)),
				"--metadata-port", strconv.Itoa(freePorts(t, 1)), "--http-port", "0", "--write-cache-mb", "16"}
		}},
		{bookieCommand, "--log-level", "verbose", bookieArgs},
		{bookieCommand, "--log-format", "yaml", bookieArgs},
	} {
		data := filepath.Join(t.TempDir(), "data")
		args := append(tc.otherFlags(data), tc.flag, tc.bad)
		cmd := tc.cmd()
		cmd.SetArgs(args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // if it serves, it stops
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s %s %s: %v, want an error naming %s", cmd.Name(), tc.flag, tc.bad, err, tc.flag)
		}
		if _, serr := os.Stat(data); !os.IsNotExist(serr) {
			t.Errorf("%s %s %s: refused (%v), but it wrote %s", cmd.Name(), tc.flag, tc.bad, err, data)
		}
	}
}

// bookieArgs are flags of a bookie with its directories under data and a metadata service that
// does not answer.
func bookieArgs(data string) []string {
	return []string{"--journal-dirs", filepath.Join(data, "j"), "--ledger-dirs", filepath.Join(data, "l"),
		"--port", "3181", "--http-port", "0", "--metadata", "etcd://127.0.0.1:1/ledgers"}
}
