package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bench storage quotes the adds (journal-bound: "MB/s vs sync1m", "p50 vs sync4k") against the
// disk's limit: --physlimit must measure the journal's disk, not the first --ledger-dir, which
// may be another device (as BookKeeper is deployed, and as scripts/bench-figures.py
// --ledger-dir runs it).
func TestBenchStoragePhysLimitMeasuresTheJournalDisk(t *testing.T) {
	root := t.TempDir()
	tools := filepath.Join(root, "shared", "tools")
	work := filepath.Join(root, "work")
	for _, d := range []string{tools, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	argsLog := filepath.Join(root, "physlimit.args")
	// A stand-in for ../shared/tools/physlimit that records its arguments.
	script := "#!/bin/sh\necho \"$@\" >> " + argsLog + "\necho '{\"sync4k\":{\"ops_per_sec\":1,\"mb_per_sec\":1,\"p50_us\":1,\"p99_us\":1}}'\n"
	if err := os.WriteFile(filepath.Join(tools, "physlimit"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work) // the command looks for ../shared/tools/physlimit

	jdir, ldir := filepath.Join(root, "journal-disk"), filepath.Join(root, "ledger-disk")
	cmd := benchStorageCommand()
	cmd.SetArgs([]string{"--journal-dir", jdir, "--ledger-dir", ldir, "--physlimit", "--duration", "200ms",
		"--write-cache-mb", "16", "--max-file-mb", "16", "--json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(argsLog)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.TrimSpace(string(b))
	t.Logf("physlimit ran with: %s", args)
	if !strings.Contains(args, "--dir "+jdir+" ") {
		t.Fatalf("the add figures are quoted against the disk of %q, not the journal's %q: physlimit %s", ldir, jdir, args)
	}
}

// Against bookies the run did not start (bench server --bookie, the client workloads with
// --metadata) the bookies' disk is not known here: --physlimit measured this machine's
// temporary directory instead and quoted the bookies' figures against that disk. It needs
// --physlimit-dir, a directory on the bookies' disk, and measures that.
func TestBenchPhysLimitAgainstARunningClusterNeedsItsDisk(t *testing.T) {
	root := t.TempDir()
	tools := filepath.Join(root, "shared", "tools")
	work := filepath.Join(root, "work")
	for _, d := range []string{tools, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	argsLog := filepath.Join(root, "physlimit.args")
	script := "#!/bin/sh\necho \"$@\" >> " + argsLog + "\necho '{\"sync4k\":{\"ops_per_sec\":1,\"mb_per_sec\":1,\"p50_us\":1,\"p99_us\":1}}'\n"
	if err := os.WriteFile(filepath.Join(tools, "physlimit"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	bookieDisk := filepath.Join(root, "bookie-disk")
	for _, args := range [][]string{
		{"server", "--bookie", "127.0.0.1:1"},
		{"write", "--metadata", "etcd://127.0.0.1:1/ledgers"},
	} {
		os.Remove(argsLog)
		cmd := benchCommand()
		cmd.SetArgs(append(args, "--physlimit", "--duration", "1ms"))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		ran, _ := os.ReadFile(argsLog)
		if len(ran) > 0 || err == nil || !strings.Contains(err.Error(), "--physlimit-dir") {
			t.Fatalf("%v: physlimit ran with %q, error %v: want no measurement of an unrelated disk and an error naming --physlimit-dir",
				args, ran, err)
		}
		cmd = benchCommand()
		cmd.SetArgs(append(args, "--physlimit", "--physlimit-dir", bookieDisk, "--duration", "1ms"))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.Execute() // the workload fails: nothing listens there
		ran, _ = os.ReadFile(argsLog)
		if !strings.Contains(string(ran), "--dir "+bookieDisk+" ") {
			t.Fatalf("%v --physlimit-dir %s: physlimit ran with %q", args, bookieDisk, ran)
		}
	}
}
