package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ringkeeper/ringkeeper/bench"
	"github.com/ringkeeper/ringkeeper/client"
)

// targetFlags are the flags of the workloads that run against a cluster.
func targetFlags(f *pflag.FlagSet, t *bench.Target) {
	f.StringVar(&t.MetadataURI, "metadata", "", "metadata service URI of an existing cluster, e.g. etcd://127.0.0.1:2379/ledgers")
	f.BoolVar(&t.Standalone, "standalone", false, "start an in-process cluster (embedded etcd and --bookies bookies) for the run")
	f.IntVar(&t.Bookies, "bookies", t.Bookies, "bookies of the --standalone cluster")
	f.StringVar(&t.DataDir, "data-dir", "", "data directory of the --standalone cluster (default: a temporary one)")
	tf := &clientTLSFlags{}
	tf.register(f)
	t.Client = func(cfg *client.Config) error {
		if t.Standalone && tf.enabled() {
			return errors.New("the --tls flags need --metadata: --standalone bookies serve plaintext only")
		}
		return tf.apply(cfg)
	}
}

// quorumFlags are a workload's ledger quorums: ensemble size, write and ack quorum.
func quorumFlags(f *pflag.FlagSet, ensemble, writeQuorum, ackQuorum *int) {
	f.IntVar(ensemble, "ensemble", *ensemble, "ensemble size")
	f.IntVar(writeQuorum, "write-quorum", *writeQuorum, "write quorum")
	f.IntVar(ackQuorum, "ack-quorum", *ackQuorum, "ack quorum")
}

// physlimitDir is where --physlimit measures the disk: the data dir of bookies the run starts
// (standalone), or the temporary directory that such a run without one uses; "" when the
// bookies run elsewhere, whose disk only --physlimit-dir can name.
func physlimitDir(standalone bool, dataDir string) string {
	switch {
	case !standalone:
		return ""
	case dataDir != "":
		return dataDir
	}
	return os.TempDir()
}

// workloadRunE is the RunE of a workload command: --physlimit measures the disk of the
// bookies under test (physlimitDir of *standalone and *dataDir, read once the flags are
// parsed), then workload runs and its result is printed.
func workloadRunE(out *output, standalone *bool, dataDir *string, progress *io.Writer, workload func(context.Context) (*bench.Result, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		_, err := out.run(cmd.Context(), physlimitDir(*standalone, *dataDir), progress, workload)
		return err
	}
}

func benchWriteCommand() *cobra.Command {
	o := bench.DefaultWriteOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "write",
		Short: "Clients append to ledgers over the network",
		Args:  cobra.NoArgs,
		RunE: workloadRunE(&out, &o.Target.Standalone, &o.Target.DataDir, &o.Progress, func(ctx context.Context) (*bench.Result, error) {
			return bench.RunWrite(ctx, o)
		}),
	}
	f := cmd.Flags()
	targetFlags(f, &o.Target)
	quorumFlags(f, &o.Ensemble, &o.WriteQuorum, &o.AckQuorum)
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes")
	f.IntVar(&o.Ledgers, "ledgers", o.Ledgers, "ledgers written (round-robin)")
	f.IntVar(&o.Clients, "clients", o.Clients, "client instances, each with its own connection to every bookie (ledger i uses client i mod clients)")
	f.IntVar(&o.Writers, "writers", o.Writers, "writer goroutines")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "appends in flight per writer")
	f.Float64Var(&o.Rate, "rate", o.Rate, "total appends per second (0 = closed loop)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration")
	f.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured warm-up")
	out.register(f)
	return cmd
}

func benchServerCommand() *cobra.Command {
	o := bench.DefaultServerOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Raw v2-protocol connections pipeline adds to one bookie (no client library)",
		Args:  cobra.NoArgs,
		RunE: workloadRunE(&out, &o.Standalone, &o.DataDir, &o.Progress, func(ctx context.Context) (*bench.Result, error) {
			return bench.RunServer(ctx, o)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Bookie, "bookie", "", "address of a running bookie (host:port)")
	f.BoolVar(&o.Standalone, "standalone", false, "start a one-bookie cluster in this process for the run")
	f.StringVar(&o.DataDir, "data-dir", "", "data directory of the --standalone bookie (default: a temporary one)")
	f.IntVar(&o.Connections, "connections", o.Connections, "connections, each writing its own ledger")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "adds in flight per connection")
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes")
	f.Float64Var(&o.Rate, "rate", o.Rate, "total adds per second (0 = closed loop)")
	f.DurationVar(&o.PaceInterval, "pace-interval", o.PaceInterval, "with --rate: how often the adds that came due are sent (latency counts from each add's scheduled time)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration")
	f.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured warm-up")
	out.register(f)
	return cmd
}

func benchReadCommand() *cobra.Command {
	o := bench.DefaultReadOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "read",
		Short: "Catch-up reads of ledgers written first (sequential or random)",
		Args:  cobra.NoArgs,
		RunE: workloadRunE(&out, &o.Target.Standalone, &o.Target.DataDir, &o.Progress, func(ctx context.Context) (*bench.Result, error) {
			return bench.RunRead(ctx, o)
		}),
	}
	f := cmd.Flags()
	targetFlags(f, &o.Target)
	f.StringVar(&o.Mode, "mode", o.Mode, "sequential or random")
	f.IntVar(&o.Ledgers, "ledgers", o.Ledgers, "ledgers written first")
	f.IntVar(&o.Entries, "entries", o.Entries, "entries per ledger")
	quorumFlags(f, &o.Ensemble, &o.WriteQuorum, &o.AckQuorum)
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes")
	f.IntVar(&o.Readers, "readers", o.Readers, "reader goroutines")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "entries each sequential reader reads at once")
	f.BoolVar(&o.Cold, "cold", false, "restart the standalone bookies after writing, so their caches are empty")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration")
	out.register(f)
	return cmd
}

func benchTailCommand() *cobra.Command {
	o := bench.DefaultTailOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Readers follow writers; latency is from append to read",
		Args:  cobra.NoArgs,
		RunE: workloadRunE(&out, &o.Target.Standalone, &o.Target.DataDir, &o.Progress, func(ctx context.Context) (*bench.Result, error) {
			return bench.RunTail(ctx, o)
		}),
	}
	f := cmd.Flags()
	targetFlags(f, &o.Target)
	quorumFlags(f, &o.Ensemble, &o.WriteQuorum, &o.AckQuorum)
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes (at least 8)")
	f.IntVar(&o.Ledgers, "ledgers", o.Ledgers, "ledgers, one writer and one tailing reader each")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "appends in flight per writer")
	f.Float64Var(&o.Rate, "rate", o.Rate, "total appends per second")
	f.DurationVar(&o.PollInterval, "poll-interval", o.PollInterval, "how often a caught-up reader asks for the LAC")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration")
	out.register(f)
	return cmd
}

func benchStressCommand() *cobra.Command {
	o := bench.DefaultStressOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "stress",
		Short: "Long mixed workload (create, write, read, close, delete); verifies every acknowledged entry at the end",
		Long: `Workers create ledgers, write them, read them back, close and delete them. With
--kill-bookies (needs --standalone) bookies are stopped and restarted at random. At the end every
acknowledged entry of every ledger that was not deleted is recovered and read back; any loss is an
error and the command fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := out.run(cmd.Context(), physlimitDir(o.Standalone, o.DataDir), &o.Progress, func(ctx context.Context) (*bench.Result, error) {
				return bench.RunStress(ctx, o)
			})
			// Its errors are ledgers, not operations: its own message.
			if errors.As(err, new(errFailedOps)) {
				err = errStressLoss(res.Errors)
			}
			return err
		},
	}
	f := cmd.Flags()
	targetFlags(f, &o.Target)
	f.IntVar(&o.Workers, "workers", o.Workers, "worker goroutines")
	f.IntVar(&o.MaxEntries, "max-entries", o.MaxEntries, "most entries written to one ledger")
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "appends in flight per worker")
	f.BoolVar(&o.KillBookies, "kill-bookies", false, "stop and restart standalone bookies at random")
	f.DurationVar(&o.KillEvery, "kill-every", o.KillEvery, "time between bookie restarts")
	f.DurationVar(&o.Duration, "duration", o.Duration, "duration of the mixed workload")
	out.register(f)
	return cmd
}

type errStressLoss int64

func (e errStressLoss) Error() string {
	return fmt.Sprintf("stress: %d ledgers lost acknowledged entries or could not be verified", int64(e))
}
