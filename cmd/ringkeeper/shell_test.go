package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestMistypedSubcommandFails: a word that is no subcommand of a command group (`shell ledger
// dleete 5`, a typo of delete) is an "unknown command" error, so a script sees it fail; so is
// an argument to a subcommand that takes none (`shell gc trigger major`, for --major). A
// group alone prints its help.
func TestMistypedSubcommandFails(t *testing.T) {
	execute := func(args ...string) (string, error) {
		// The root as main() builds it (flags and hooks aside).
		root := &cobra.Command{Use: "ringkeeper", SilenceUsage: true, SilenceErrors: true}
		root.AddCommand(benchCommand(), bookieCommand(), shellCommand(), standaloneCommand())
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		err := root.Execute()
		return out.String(), err
	}
	for _, args := range [][]string{
		{"shell", "ledger", "dleete", "5"},
		{"shell", "gc", "trgger"},
		{"shell", "bookies", "lst"},
		{"shell", "legder", "list"},
		{"bench", "jurnal"},
		{"shell", "gc", "trigger", "major"},
		{"shell", "ledger", "list", "5"},
	} {
		if out, err := execute(args...); err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("ringkeeper %s: %v, want an unknown command error (it printed %d bytes)", strings.Join(args, " "), err, len(out))
		}
	}
	if _, err := execute("shell", "ledger", "dleete", "5"); err == nil || !strings.Contains(err.Error(), "delete") {
		t.Errorf("shell ledger dleete: %v, want a suggestion of delete", err)
	}
	for _, args := range [][]string{{"shell"}, {"shell", "ledger"}} {
		if out, err := execute(args...); err != nil || !strings.Contains(out, "Available Commands") {
			t.Errorf("ringkeeper %s: %v, printed %q; want its help", strings.Join(args, " "), err, out)
		}
	}
}

// runShell runs `ringkeeper shell ARGS...` in-process with stdin.
func runShell(ctx context.Context, stdin io.Reader, args ...string) error {
	cmd := shellCommand()
	cmd.SetArgs(args)
	cmd.SetIn(stdin)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	return cmd.ExecuteContext(ctx)
}

// TestAppendFromStdinTakesLinesUpToTheLargestEntry: `shell ledger append ID` appends each line
// of stdin as an entry, lines of any size up to the largest entry the ledger takes (not only up
// to bufio.Scanner's default of 64 KiB). A longer line fails the command and nothing of that
// input is appended.
func TestAppendFromStdinTakesLinesUpToTheLargestEntry(t *testing.T) {
	c := clustertest.Start(t, 1)
	ctx := context.Background()
	cl, err := client.New(ctx, client.DefaultConfig(c.MetadataURI()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: 1, WriteQuorum: 1, AckQuorum: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(lh.ID(), 10)
	long := strings.Repeat("x", 70_000)
	if err := runShell(ctx, strings.NewReader("first\n"+long+"\r\nlast\n"), "ledger", "append", "--metadata", c.MetadataURI(), id); err != nil {
		t.Fatalf("append of 3 stdin lines (the 2nd of 70000 bytes): %v", err)
	}
	tooLong := strings.Repeat("y", lh.MaxEntrySize()+1)
	err = runShell(ctx, strings.NewReader("more\n"+tooLong+"\nlast\n"), "ledger", "append", "--metadata", c.MetadataURI(), id)
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("append of a stdin line of %d bytes, one over the largest entry: %v, want an error naming line 2", len(tooLong), err)
	}
	rh, err := cl.OpenLedger(ctx, lh.ID(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if lac := rh.LastAddConfirmed(); lac != 2 {
		t.Fatalf("after the appends the ledger's last entry is %d, want 2", lac)
	}
	es, err := rh.Read(ctx, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"first", long, "last"} {
		if string(es[i].Payload) != want {
			t.Fatalf("entry %d holds %d bytes, want %d", i, len(es[i].Payload), len(want))
		}
	}
}

// TestReadLinesUpToMax: each line may be max bytes (with "\n" or "\r\n", or none at the end);
// one byte more is an error naming the line.
func TestReadLinesUpToMax(t *testing.T) {
	lines, err := readLines(strings.NewReader("abcd\r\nefgh\nij\nklmn"), 4)
	if err != nil || strings.Join(lines, ",") != "abcd,efgh,ij,klmn" {
		t.Fatalf("lines of up to 4 bytes, max 4: %q, %v", lines, err)
	}
	for _, in := range []string{"ab\nabcde\ncd\n", "ab\nabcde", "ab\nabcde\r\n", "ab\nabcdefgh\n"} {
		if lines, err := readLines(strings.NewReader(in), 4); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q, max 4: %q, %v; want an error naming line 2", in, lines, err)
		}
	}
}

// TestShellOverTLS: the shell's --tls flags reach bookies that serve TLS and require client
// certificates: entries appended through them are in the ledger; without the client
// certificate, or with a trust store holding no certificate, the command fails.
func TestShellOverTLS(t *testing.T) {
	c, certs := clustertest.StartTLS(t, 1)
	ctx := context.Background()
	cfg := client.DefaultConfig(c.MetadataURI())
	cfg.Transport.TLS = &tls.Config{RootCAs: certs.CA.Pool, Certificates: []tls.Certificate{certs.Client}, MinVersion: tls.VersionTLS12}
	cl, err := client.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: 1, WriteQuorum: 1, AckQuorum: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(lh.ID(), 10)
	meta := []string{"--metadata", c.MetadataURI()}
	if err := runShell(ctx, nil, append([]string{"ledger", "append", id, "over tls", "--tls-trust-store", certs.CAFile,
		"--tls-certificate", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile}, meta...)...); err != nil {
		t.Fatalf("ledger append over TLS: %v", err)
	}
	if err := runShell(ctx, nil, append([]string{"ledger", "append", id, "no cert", "--tls-trust-store", certs.CAFile}, meta...)...); err == nil {
		t.Fatal("append over TLS without the client certificate the bookie requires: no error")
	}
	if err := runShell(ctx, nil, append([]string{"ledger", "append", id, "bad", "--tls-trust-store", certs.ClientKeyFile}, meta...)...); err == nil ||
		!strings.Contains(err.Error(), "--tls-trust-store") {
		t.Fatalf("a trust store with no certificate: %v, want an error naming --tls-trust-store", err)
	}
	rh, err := cl.OpenLedger(ctx, lh.ID(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if es, err := rh.Read(ctx, 0, rh.LastAddConfirmed()); err != nil || len(es) != 1 || string(es[0].Payload) != "over tls" {
		t.Fatalf("the ledger holds %d entries (%v), want the one appended over TLS", len(es), err)
	}
}

// TestBenchTLSFlagsNeedMetadata: the bench's --tls flags with --standalone, whose bookies serve
// plaintext only, fail the run with a clear error rather than a handshake failure per bookie.
func TestBenchTLSFlagsNeedMetadata(t *testing.T) {
	cmd := benchCommand()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"write", "--standalone", "--bookies", "1", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
		"--data-dir", t.TempDir(), "--duration", "1s", "--tls-trust-store", "ca.pem"})
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "need --metadata") {
		t.Fatalf("bench write --standalone --tls-trust-store: %v, want an error saying the TLS flags need --metadata", err)
	}
}
