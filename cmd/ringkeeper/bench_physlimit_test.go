package main

import (
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
