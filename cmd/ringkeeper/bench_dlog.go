package main

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ringkeeper/ringkeeper/bench"
	"github.com/ringkeeper/ringkeeper/dlog/dlogbench"
)

// benchDlogCommand is `ringkeeper bench dlog write|tail`: the distributed-log workloads.
func benchDlogCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlog",
		Short: "Distributed-log workloads: records through one log writer (write), readers following it (tail)",
	}
	cmd.AddCommand(benchDlogWriteCommand(), benchDlogTailCommand())
	return cmd
}

// dlogFlags are the flags both dlog workloads take.
func dlogFlags(f *pflag.FlagSet, o *dlogbench.Options) {
	targetFlags(f, &o.Target)
	quorumFlags(f, &o.Ensemble, &o.WriteQuorum, &o.AckQuorum)
	f.IntVar(&o.RecordSize, "record-size", o.RecordSize, "record payload size in bytes")
	f.IntVar(&o.Outstanding, "outstanding", o.Outstanding, "records written and not yet acknowledged")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "ledger entries in flight (the writer's MaxInFlightEntries; also the baseline's appends in flight)")
	f.IntVar(&o.BufferSize, "buffer-size", o.BufferSize, "writerOutputBufferSize: bytes of records per entry")
	f.DurationVar(&o.FlushInterval, "flush-interval", o.FlushInterval, "periodicFlushFrequency: longest wait of a record for its batch")
	f.BoolVar(&o.Immediate, "immediate", false, "no batching: every record is its own entry (immediateFlushEnabled)")
	f.Int64Var(&o.MaxSegmentBytes, "max-segment-bytes", o.MaxSegmentBytes, "maxLogSegmentBytes: the writer rolls to a new segment past this")
	f.Float64Var(&o.Rate, "rate", o.Rate, "records per second (0 = closed loop)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration")
	f.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured warm-up")
}

func benchDlogWriteCommand() *cobra.Command {
	o := dlogbench.DefaultWriteOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "write",
		Short: "Records per second through one log writer, with batching; latency is write to acknowledgement",
		Long: `Writes --record-size records to a new log through one writer, closed loop with --outstanding
records unacknowledged (or at --rate), batched into entries of up to --buffer-size bytes with at most
--in-flight entries in flight. With --baseline it first appends --record-size entries straight to a
ledger with --in-flight appends in flight, on the same cluster, as the result's baseline.`,
		Args: cobra.NoArgs,
		RunE: workloadRunE(&out, &o.Target.Standalone, &o.Target.DataDir, &o.Progress, func(ctx context.Context) (*bench.Result, error) {
			return dlogbench.RunWrite(ctx, o)
		}),
	}
	f := cmd.Flags()
	dlogFlags(f, &o)
	f.BoolVar(&o.Baseline, "baseline", false, "first run plain ledger appends of the same size and in-flight count, as the baseline")
	out.register(f)
	return cmd
}

func benchDlogTailCommand() *cobra.Command {
	o := dlogbench.DefaultTailOptions()
	var out output
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Readers follow a log from its tail; latency is from write to read",
		Args:  cobra.NoArgs,
		RunE: workloadRunE(&out, &o.Target.Standalone, &o.Target.DataDir, &o.Progress, func(ctx context.Context) (*bench.Result, error) {
			return dlogbench.RunTail(ctx, o)
		}),
	}
	f := cmd.Flags()
	dlogFlags(f, &o)
	f.IntVar(&o.Readers, "readers", o.Readers, "tailing readers")
	f.DurationVar(&o.PollInterval, "poll-interval", o.PollInterval, "readers' TailPollInterval: how often a caught-up reader asks for the last add confirmed")
	out.register(f)
	return cmd
}
