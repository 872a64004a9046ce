package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ringkeeper/ringkeeper/bench"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
)

func benchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run a benchmark workload",
	}
	cmd.AddCommand(benchJournalCommand())
	return cmd
}

// output prints progress to stdout, or to stderr when --json keeps stdout for the result.
type output struct{ json bool }

func (o *output) progress() io.Writer {
	if o.json {
		return os.Stderr
	}
	return os.Stdout
}

func (o *output) result(res *bench.Result) error {
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		return enc.Encode(res)
	}
	bench.Summary(os.Stdout, res)
	return nil
}

func benchJournalCommand() *cobra.Command {
	o := bench.DefaultJournalOptions()
	var out output
	var engine, prealloc string
	var maxFileMB int64
	cmd := &cobra.Command{
		Use:   "journal",
		Short: "Durable appends straight into the journal (like bkperf journal append)",
		Long: `Appends entries to one journal per --dir from --writers goroutines, each with
--outstanding appends in flight, and reports durable throughput and add latency.
MB means 10^6 bytes of entry payload.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Engine, err = diskio.ParseEngine(engine); err != nil {
				return err
			}
			if o.Prealloc, err = journal.ParsePreallocMode(prealloc); err != nil {
				return err
			}
			o.MaxFileSize = maxFileMB << 20
			o.Progress = out.progress()
			res, err := bench.RunJournal(cmd.Context(), o)
			if err != nil {
				return err
			}
			return out.result(res)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.Dirs, "dir", o.Dirs, "journal directory (repeat for several journals)")
	f.IntVar(&o.Writers, "writers", o.Writers, "writer goroutines")
	f.IntVar(&o.Outstanding, "outstanding", o.Outstanding, "appends in flight per writer")
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes")
	f.IntVar(&o.Ledgers, "ledgers", o.Ledgers, "number of ledgers")
	f.Float64Var(&o.Rate, "rate", o.Rate, "total appends per second (0 = closed loop)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration")
	f.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured warm-up before the measured duration")
	f.BoolVar(&o.Sync, "sync", o.Sync, "fdatasync before acknowledging (journalSyncData)")
	f.DurationVar(&o.GroupWait, "group-wait", o.GroupWait, "journalMaxGroupWaitMSec")
	f.IntVar(&o.GroupBytes, "group-bytes", o.GroupBytes, "journalBufferedWritesThreshold")
	f.IntVar(&o.PipelineDepth, "pipeline-depth", o.PipelineDepth, "groups written and synced at once")
	f.StringVar(&engine, "engine", "auto", "I/O engine: auto, io_uring or psync (journalIOEngine)")
	f.StringVar(&prealloc, "prealloc", o.Prealloc.String(), "space preparation: fallocate, zero or none")
	f.BoolVar(&o.ReuseFiles, "reuse-files", o.ReuseFiles, "reuse old journal files (journalReuseFiles)")
	f.Int64Var(&maxFileMB, "max-file-mb", o.MaxFileSize>>20, "journalMaxSizeMB")
	f.IntVar(&o.MaxBackups, "max-backups", o.MaxBackups, "journalMaxBackups: old files kept behind the mark")
	f.IntVar(&o.MaxRecycled, "max-recycled", o.MaxRecycled, "old files kept for reuse")
	f.BoolVar(&out.json, "json", false, "print one JSON result object on stdout (progress goes to stderr)")
	_ = time.Second
	return cmd
}

var _ = fmt.Sprint
