package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/bench"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
)

func benchCommand() *cobra.Command {
	cmd := commandGroup(&cobra.Command{
		Use:   "bench",
		Short: "Run a benchmark workload",
	})
	cmd.AddCommand(benchJournalCommand(), benchStorageCommand(), benchServerCommand(), benchWriteCommand(), benchReadCommand(),
		benchTailCommand(), benchStressCommand())
	cmd.AddCommand(benchDlogCommand())
	return cmd
}

// output holds the flags every workload shares: where progress and the result go, and the
// disk-limit measurement.
type output struct {
	json             bool
	report           string
	physlimit        bool
	physlimitSeconds int
	physlimitJobs    []string
	physlimitDir     string
}

func (o *output) register(f *pflag.FlagSet) {
	f.BoolVar(&o.json, "json", false, "print one JSON result object on stdout (progress goes to stderr)")
	f.StringVar(&o.report, "report", "", "also write a self-contained HTML report (throughput over time, latency percentiles) to this file")
	f.BoolVar(&o.physlimit, "physlimit", false, "measure the disk's limit with ../shared/tools/physlimit (fio) on the data dir first and quote ratios")
	f.IntVar(&o.physlimitSeconds, "physlimit-seconds", 5, "seconds per physlimit job")
	f.StringSliceVar(&o.physlimitJobs, "physlimit-jobs", nil, "physlimit jobs to run (default: all)")
	f.StringVar(&o.physlimitDir, "physlimit-dir", "", "a directory on the disk --physlimit measures (default: the run's own data dir; required against bookies the run does not start)")
}

func (o *output) progress() io.Writer {
	if o.json {
		return os.Stderr
	}
	return os.Stdout
}

// run is the body of a workload's command: progress goes to the right stream, the disk's limit
// is measured in dir first (--physlimit), then the workload runs and its result is printed. A
// run whose operations failed still prints its result, then fails (errFailedOps): a script must
// not take its figures for a clean run's.
func (o *output) run(ctx context.Context, dir string, progress *io.Writer, workload func(context.Context) (*bench.Result, error)) (*bench.Result, error) {
	*progress = o.progress()
	phys, err := o.measure(ctx, dir)
	if err != nil {
		return nil, err
	}
	res, err := workload(ctx)
	if err != nil {
		return nil, err
	}
	failed := failedOps(res)
	if err := o.result(res, phys); err != nil {
		return res, err
	}
	if failed > 0 {
		return res, errFailedOps{res.Workload, failed}
	}
	return res, nil
}

// failedOps counts the failed operations of res (nil: none), its reads and its baseline.
func failedOps(res *bench.Result) int64 {
	if res == nil {
		return 0
	}
	return res.Errors + failedOps(res.Reads) + failedOps(res.Baseline)
}

// errFailedOps is the error of a run whose result counts failed operations.
type errFailedOps struct {
	workload string
	n        int64
}

func (e errFailedOps) Error() string {
	return fmt.Sprintf("bench %s: %d operations failed (the result counts them as errors)", e.workload, e.n)
}

// measure runs the disk-limit measurement on dir (--physlimit-dir if given; "": the disk is
// not known here) when --physlimit is set.
func (o *output) measure(ctx context.Context, dir string) (map[string]bench.PhysLimitJob, error) {
	if !o.physlimit {
		return nil, nil
	}
	if o.physlimitDir != "" {
		dir = o.physlimitDir
	}
	if dir == "" {
		return nil, errors.New("bench: --physlimit against bookies this run does not start needs --physlimit-dir, a directory on their disk (this machine's temporary directory may be another disk)")
	}
	return bench.RunPhysLimit(ctx, bench.PhysLimitOptions{Dir: dir, Seconds: o.physlimitSeconds, Jobs: o.physlimitJobs}, o.progress())
}

func (o *output) result(res *bench.Result, phys map[string]bench.PhysLimitJob) error {
	if phys != nil {
		res.PhysLimit = phys
		res.Ratios = bench.PhysRatios(res)
	}
	if o.report != "" {
		f, err := os.Create(o.report)
		if err != nil {
			return err
		}
		if err := bench.WriteReport(f, res); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if o.json {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	bench.Summary(os.Stdout, res)
	return nil
}

func benchJournalCommand() *cobra.Command {
	o := bench.DefaultJournalOptions()
	var out output
	var engine, prealloc, baseline string
	var maxFileMB int64
	cmd := &cobra.Command{
		Use:   "journal",
		Short: "Durable appends straight into the journal (like bkperf journal append)",
		Long: `Appends entries to one journal per --dir from --writers goroutines, each with
--outstanding appends in flight, and reports durable throughput and add latency.
MB means 10^6 bytes of entry payload.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(o.Dirs) == 0 {
				return errors.New("bench journal: --dir must name a directory")
			}
			var err error
			if o.Engine, err = diskio.ParseEngine(engine); err != nil {
				return err
			}
			if o.Prealloc, err = journal.ParsePreallocMode(prealloc); err != nil {
				return err
			}
			o.MaxFileSize = maxFileMB << 20
			_, err = out.run(cmd.Context(), o.Dirs[0], &o.Progress, func(ctx context.Context) (*bench.Result, error) {
				res, err := bench.RunJournal(ctx, o)
				if err != nil {
					return nil, err
				}
				switch baseline {
				case "":
				case "pebble":
					fmt.Fprintln(out.progress(), "baseline: the same appends through pebble's synced batch commit")
					if res.Baseline, err = bench.RunPebbleBaseline(ctx, o); err != nil {
						return nil, err
					}
				default:
					return nil, fmt.Errorf("--baseline %q: the only baseline is pebble", baseline)
				}
				return res, nil
			})
			return err
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
	f.StringVar(&baseline, "baseline", "", "also run the same workload through a peer for comparison: pebble (its synced batch commit)")
	out.register(f)
	return cmd
}

func benchStorageCommand() *cobra.Command {
	o := bench.DefaultStorageOptions()
	var out output
	var engine, prealloc string
	var maxFileMB, cacheMB, indexCacheMB, entryLogMB int64
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "Adds through the whole storage engine (journal, write cache, checkpoints), then cold reads",
		Long: `Adds entries through the storage engine with journal, write cache and checkpoints running
(entries flushed to entry logs and the index), with the same flags as bench journal. With --read,
it then closes and reopens the engine, so that no cache holds an entry, and reads entries back from
the entry logs (O_DIRECT) with --read-outstanding reads in flight. The reads start once the engine
has warmed the index into its block cache (indexWarmOnStart; only an index that takes at most half
of --index-cache-mb is warmed); --cold-index keeps it cold too.

With --compaction, the adds run twice in the same run, --duration each: first without garbage
collection, then with major compaction running back to back at --compaction-rate. In both phases
ledgers roll over every --ledger-entries entries and --delete-fraction of the full ledgers are
deleted once flushed, so entry logs fill with garbage. The result is the phase with compaction;
its baseline is the phase without, and its extra figures give the throughput and p99 ratios, the
compaction rate (MB/s copied and read) and the space reclaimed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(o.JournalDirs) == 0 || len(o.LedgerDirs) == 0 {
				return errors.New("bench storage: --journal-dir and --ledger-dir must each name a directory")
			}
			var err error
			if o.Engine, err = diskio.ParseEngine(engine); err != nil {
				return err
			}
			if o.Prealloc, err = journal.ParsePreallocMode(prealloc); err != nil {
				return err
			}
			o.MaxFileSize = maxFileMB << 20
			o.WriteCacheSize = cacheMB << 20
			o.IndexCacheSize = indexCacheMB << 20
			o.EntryLogSize = entryLogMB << 20
			o.Progress = out.progress()
			// The adds wait for the journal's syncs and the reads for the entry logs: each is
			// quoted against its own disk (measured once when both are on one device, or when
			// --physlimit-dir names the one disk to measure).
			phys, err := out.measure(cmd.Context(), o.JournalDirs[0])
			if err != nil {
				return err
			}
			readPhys := phys
			if phys != nil && o.Read != "" && out.physlimitDir == "" && !sameDevice(o.JournalDirs[0], o.LedgerDirs[0]) {
				if readPhys, err = out.measure(cmd.Context(), o.LedgerDirs[0]); err != nil {
					return err
				}
			}
			adds, reads, err := bench.RunStorage(cmd.Context(), o)
			if err != nil {
				return err
			}
			return out.storageResult(adds, reads, phys, readPhys)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.JournalDirs, "journal-dir", o.JournalDirs, "journal directory (repeatable)")
	f.StringSliceVar(&o.LedgerDirs, "ledger-dir", o.LedgerDirs, "ledger directory (repeatable)")
	f.IntVar(&o.Writers, "writers", o.Writers, "writer goroutines")
	f.IntVar(&o.Outstanding, "outstanding", o.Outstanding, "adds in flight per writer")
	f.IntVar(&o.EntrySize, "entry-size", o.EntrySize, "entry payload size in bytes")
	f.IntVar(&o.Ledgers, "ledgers", o.Ledgers, "number of ledgers")
	f.Float64Var(&o.Rate, "rate", o.Rate, "total adds per second (0 = closed loop)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured duration of the adds")
	f.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured warm-up")
	f.BoolVar(&o.Sync, "sync", o.Sync, "journalSyncData")
	f.DurationVar(&o.GroupWait, "group-wait", o.GroupWait, "journalMaxGroupWaitMSec")
	f.IntVar(&o.GroupBytes, "group-bytes", o.GroupBytes, "journalBufferedWritesThreshold")
	f.IntVar(&o.PipelineDepth, "pipeline-depth", o.PipelineDepth, "journal groups written and synced at once")
	f.StringVar(&prealloc, "prealloc", o.Prealloc.String(), "journalPreallocMode: zero, fallocate or none")
	f.StringVar(&engine, "engine", "auto", "I/O engine: auto, io_uring or psync")
	f.Int64Var(&maxFileMB, "max-file-mb", o.MaxFileSize>>20, "journalMaxSizeMB")
	f.Int64Var(&cacheMB, "write-cache-mb", o.WriteCacheSize>>20, "dbStorage_writeCacheMaxSizeMb")
	f.Int64Var(&indexCacheMB, "index-cache-mb", o.IndexCacheSize>>20, "dbStorage_rocksDB_blockCacheSize in MiB")
	f.DurationVar(&o.FlushInterval, "flush-interval", o.FlushInterval, "flushInterval (checkpoint period)")
	f.StringVar(&o.Read, "read", "", "after the adds, cold reads: random or sequential")
	f.IntVar(&o.ReadOutstanding, "read-outstanding", o.ReadOutstanding, "reads in flight")
	f.BoolVar(&o.ColdIndex, "cold-index", false, "keep the reopened index cold for the reads (by default they start once it is warmed)")
	f.DurationVar(&o.ReadDuration, "read-duration", o.ReadDuration, "measured duration of the reads")
	f.BoolVar(&o.Compaction, "compaction", false, "run the adds without, then with major compaction running (see above)")
	f.Int64Var(&o.CompactionRate, "compaction-rate", o.CompactionRate, "compactionRateByBytes: bytes/s compaction may read, and write (0 = unlimited)")
	f.Int64Var(&entryLogMB, "entry-log-mb", 0, "logSizeLimit in MiB (0: the engine's default, 64 with --compaction)")
	f.Int64Var(&o.LedgerEntries, "ledger-entries", o.LedgerEntries, "with --compaction: entries per ledger before a writer moves to a new ledger")
	f.Float64Var(&o.DeleteFraction, "delete-fraction", o.DeleteFraction, "with --compaction: fraction of the full ledgers deleted")
	out.register(f)
	return cmd
}

// storageResult prints bench storage's adds and its reads (nil: none), each with the disk
// limit measured for it.
func (o *output) storageResult(adds, reads *bench.Result, phys, readPhys map[string]bench.PhysLimitJob) error {
	if err := o.printStorage(adds, reads, phys, readPhys); err != nil {
		return err
	}
	if n := failedOps(adds) + failedOps(reads); n > 0 {
		return errFailedOps{adds.Workload, n}
	}
	return nil
}

func (o *output) printStorage(adds, reads *bench.Result, phys, readPhys map[string]bench.PhysLimitJob) error {
	if reads == nil {
		return o.result(adds, phys)
	}
	if !o.json {
		if err := o.result(adds, phys); err != nil {
			return err
		}
		return o.result(reads, readPhys)
	}
	// One JSON object: the adds, with the reads as a nested result.
	if readPhys != nil {
		reads.PhysLimit = readPhys
		reads.Ratios = bench.PhysRatios(reads)
	}
	adds.Reads = reads
	return o.result(adds, phys)
}

// sameDevice reports whether two directories (created if missing) are on one file system.
func sameDevice(a, b string) bool {
	var sa, sb unix.Stat_t
	return os.MkdirAll(a, 0o755) == nil && os.MkdirAll(b, 0o755) == nil &&
		unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}
