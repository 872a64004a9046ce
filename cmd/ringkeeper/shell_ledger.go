package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// metadataFlag is the shared --metadata flag of the shell commands, with the client's TLS
// flags.
type metadataFlag struct {
	uri     string
	tls     clientTLSFlags
	timeout time.Duration
}

func (m *metadataFlag) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&m.uri, "metadata", "etcd://127.0.0.1:2379/ledgers", "metadata service URI")
	cmd.PersistentFlags().DurationVar(&m.timeout, "timeout", 30*time.Second,
		"longest wait for an answer (of the metadata service or the bookies) before the command fails (0: no limit)")
	m.tls.register(cmd.PersistentFlags())
}

// bounded runs fn with a context that ends once --timeout passes without progress (fn calls
// wd.alive on each step: an entry read or appended, a ledger listed). A metadata service that
// accepts the connection and then never answers must not hang the command; a long listing or
// read that keeps progressing must not fail.
func (m *metadataFlag) bounded(ctx context.Context, fn func(ctx context.Context, wd *watchdog) error) error {
	if m.timeout <= 0 {
		return fn(ctx, &watchdog{})
	}
	expired := fmt.Errorf("no answer within --timeout %v (is the metadata service at %s hung?)", m.timeout, m.uri)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wd := &watchdog{time.AfterFunc(m.timeout, func() { cancel(expired) }), m.timeout}
	defer wd.pause()
	err := fn(ctx, wd)
	if err != nil && context.Cause(ctx) == expired {
		return fmt.Errorf("%w: %w", expired, err)
	}
	return err
}

// watchdog is bounded's timer (t nil: no --timeout).
type watchdog struct {
	t *time.Timer
	d time.Duration
}

// alive restarts the wait: the command progressed.
func (w *watchdog) alive() {
	if w.t != nil {
		w.t.Reset(w.d)
	}
}

// pause stops the wait while the command waits on something else (stdin); alive resumes it.
func (w *watchdog) pause() {
	if w.t != nil {
		w.t.Stop()
	}
}

func (m *metadataFlag) client(ctx context.Context) (*client.Client, error) {
	cfg := client.DefaultConfig(m.uri)
	cfg.Logger, _ = newLogger("text", "error") // valid values: no error
	if err := m.tls.apply(&cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return client.New(ctx, cfg)
}

// withClient connects a client and runs fn with it, bounded by --timeout (see bounded).
func (m *metadataFlag) withClient(ctx context.Context, fn func(ctx context.Context, wd *watchdog, cl *client.Client) error) error {
	return m.bounded(ctx, func(ctx context.Context, wd *watchdog) error {
		cl, err := m.client(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		wd.alive()
		return fn(ctx, wd, cl)
	})
}

// withLedger parses the ledger id in arg, connects a client and runs fn with both, bounded
// by --timeout.
func (m *metadataFlag) withLedger(ctx context.Context, arg string, fn func(ctx context.Context, wd *watchdog, cl *client.Client, id int64) error) error {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		return fmt.Errorf("ledger id %q: %w", arg, err)
	}
	return m.withClient(ctx, func(ctx context.Context, wd *watchdog, cl *client.Client) error {
		return fn(ctx, wd, cl, id)
	})
}

// shellLedgerCommand is `ringkeeper shell ledger create|append|read|list|close|delete|metadata`.
func shellLedgerCommand() *cobra.Command {
	var md metadataFlag
	var password string
	cmd := commandGroup(&cobra.Command{Use: "ledger", Short: "Create, write, read, list and delete ledgers"})
	md.register(cmd)
	cmd.PersistentFlags().StringVar(&password, "password", "", "ledger password")

	var e, qw, qa int
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a ledger and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return md.withClient(cmd.Context(), func(ctx context.Context, _ *watchdog, cl *client.Client) error {
				lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: e, WriteQuorum: qw, AckQuorum: qa, Password: []byte(password)})
				if err != nil {
					return err
				}
				fmt.Println(lh.ID())
				return nil
			})
		},
	}
	create.Flags().IntVar(&e, "ensemble", 3, "ensemble size")
	create.Flags().IntVar(&qw, "write-quorum", 2, "write quorum")
	create.Flags().IntVar(&qa, "ack-quorum", 2, "ack quorum")

	var closeAfter bool
	appendCmd := &cobra.Command{
		Use:   "append LEDGER [ENTRY...]",
		Short: "Append entries (the arguments, or lines of stdin) to an open ledger whose writer has gone away",
		Long: `Appends each argument as one entry; with no entry arguments, each line of stdin (all of it is
read first: a line longer than the largest entry fails the command with nothing appended). The ledger
must be open (for example made by "ledger create") and its writer gone: the shell first recovers the
entries past the ledger's last add confirmed (each one found is copied to its whole write quorum, up
to the first one missing on enough bookies), then writes through a fresh handle that continues after
the last one. It fences nothing (a fenced ledger takes no more adds), so it must not be used on a
ledger another writer is still writing: both would have entries acknowledged under the same ids,
and one writer's would be lost. To end such a ledger, use "ledger read --recover".`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return md.withLedger(cmd.Context(), args[0], func(ctx context.Context, wd *watchdog, cl *client.Client, id int64) error {
				lh, err := cl.ReopenLedgerForWrite(ctx, id, []byte(password))
				if err != nil {
					return err
				}
				entries := args[1:]
				if len(entries) == 0 {
					wd.pause() // stdin may come slowly: no answer is awaited meanwhile
					if entries, err = readLines(cmd.InOrStdin(), lh.MaxEntrySize()); err != nil {
						return fmt.Errorf("stdin: %w; nothing appended", err)
					}
				}
				for _, data := range entries {
					wd.alive()
					eid, err := lh.Append(ctx, []byte(data))
					if err != nil {
						return err
					}
					fmt.Printf("ledger %d entry %d\n", id, eid)
				}
				if closeAfter {
					wd.alive()
					return lh.Close(ctx)
				}
				return nil
			})
		},
	}
	appendCmd.Flags().BoolVar(&closeAfter, "close", false, "close the ledger afterwards")

	var first, last int64
	var recover bool
	read := &cobra.Command{
		Use:   "read LEDGER",
		Short: "Print entries of a ledger (closed, or up to its last add confirmed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return md.withLedger(cmd.Context(), args[0], func(ctx context.Context, wd *watchdog, cl *client.Client, id int64) error {
				lh, err := cl.OpenLedger(ctx, id, []byte(password), recover)
				if err != nil {
					return err
				}
				end := last
				if end < 0 {
					wd.alive()
					if end, err = lh.ReadLastAddConfirmed(ctx); err != nil {
						return err
					}
				}
				if end < first {
					fmt.Fprintf(os.Stderr, "ledger %d has no entries from %d (last confirmed %d)\n", id, first, end)
					return nil
				}
				wd.alive()
				for e, err := range lh.Entries(ctx, first, end) {
					if err != nil {
						return err
					}
					wd.alive()
					fmt.Printf("%d\t%s\n", e.EntryID, printable(e.Payload))
				}
				return nil
			})
		},
	}
	read.Flags().Int64Var(&first, "first", 0, "first entry")
	read.Flags().Int64Var(&last, "last", -1, "last entry (-1: the last confirmed)")
	read.Flags().BoolVar(&recover, "recover", false, "open with recovery (fences and closes the ledger)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List ledgers with their state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return md.withClient(cmd.Context(), func(ctx context.Context, wd *watchdog, cl *client.Client) error {
				return listLedgers(ctx, wd, cl, cmd.OutOrStdout())
			})
		},
	}

	closeCmd := &cobra.Command{
		Use:   "close LEDGER",
		Short: "Recover and close a ledger",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return md.withLedger(cmd.Context(), args[0], func(ctx context.Context, _ *watchdog, cl *client.Client, id int64) error {
				lh, err := cl.OpenLedger(ctx, id, []byte(password), true)
				if err != nil {
					return err
				}
				fmt.Printf("ledger %d closed at entry %d\n", id, lh.LastAddConfirmed())
				return nil
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete LEDGER",
		Short: "Delete a ledger (bookies reclaim the space at their next garbage collection)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return md.withLedger(cmd.Context(), args[0], func(ctx context.Context, _ *watchdog, cl *client.Client, id int64) error {
				return cl.DeleteLedger(ctx, id)
			})
		},
	}
	cmd.AddCommand(create, appendCmd, read, list, closeCmd, del)
	return cmd
}

// readLines reads every line of r, each of at most max bytes (one entry each). All of r is
// read before anything is appended, so a line too long fails the whole input, not its tail.
func readLines(r io.Reader, max int) ([]string, error) {
	sc := bufio.NewScanner(r)
	// The buffer holds a line and its "\r\n"; a longer one stops the scan with ErrTooLong.
	sc.Buffer(make([]byte, 0, min(64<<10, max+2)), max+2)
	var lines []string
	for sc.Scan() {
		if len(sc.Bytes()) > max {
			return nil, fmt.Errorf("line %d is %d bytes, more than the largest entry (%d bytes)", len(lines)+1, len(sc.Bytes()), max)
		}
		lines = append(lines, sc.Text())
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return nil, fmt.Errorf("line %d is longer than the largest entry (%d bytes)", len(lines)+1, max)
	}
	return lines, sc.Err()
}

func listLedgers(ctx context.Context, wd *watchdog, cl *client.Client, w io.Writer) error {
	fmt.Fprintf(w, "%-12s %-12s %-10s %-8s %s\n", "LEDGER", "STATE", "LAST", "E/Qw/Qa", "ENSEMBLE")
	var ferr error
	err := cl.ListLedgers(ctx, func(id int64) bool {
		wd.alive()
		m, err := cl.LedgerMetadata(ctx, id)
		if err != nil {
			ferr = err
			return false
		}
		last, _ := m.LastEnsemble()
		fmt.Fprintf(w, "%-12d %-12s %-10d %d/%d/%d    %s\n", id, m.State, m.LastEntryID, m.EnsembleSize, m.WriteQuorumSize,
			m.AckQuorumSize, strings.Join(last.Bookies, ","))
		return true
	})
	if err != nil {
		return err
	}
	return ferr
}

// printable renders a payload for a terminal.
func printable(b []byte) string {
	for _, c := range b {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Sprintf("%x", b)
		}
	}
	return string(b)
}

// shellBookiesCommand is `ringkeeper shell bookies list`.
func shellBookiesCommand() *cobra.Command {
	var md metadataFlag
	cmd := commandGroup(&cobra.Command{Use: "bookies", Short: "Registered bookies"})
	md.register(cmd)
	list := &cobra.Command{
		Use:   "list",
		Short: "List registered bookies (writable and read-only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return md.bounded(cmd.Context(), func(ctx context.Context, _ *watchdog) error {
				d, err := metadata.Open(ctx, md.uri, metadata.Options{})
				if err != nil {
					return err
				}
				defer d.Close()
				bs, err := d.Bookies().List(ctx, metadata.ListAll)
				if err != nil {
					return err
				}
				fmt.Printf("%-22s %-10s %s\n", "BOOKIE", "STATE", "FREE DISK")
				for _, b := range bs {
					fmt.Printf("%-22s %-10s %.1f GiB\n", b.ID, b.State, float64(b.FreeDiskBytes)/(1<<30))
				}
				return nil
			})
		},
	}
	cmd.AddCommand(list)
	return cmd
}
