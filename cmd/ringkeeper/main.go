// Command ringkeeper is the single binary: bookie, standalone, bench and shell.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	setProcs()
	ctx, stop := signalContext()
	defer stop()
	if err := execute(ctx, rootCommand(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ringkeeper:", err)
		os.Exit(1)
	}
}

// rootCommand is `ringkeeper` with its subcommands and the flags they all take.
func rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "ringkeeper",
		Short:         "Apache BookKeeper rebuilt in Go for NVMe-era hardware",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var cpuProfile, traceFile string
	root.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile to this file")
	root.PersistentFlags().StringVar(&traceFile, "trace", "", "write a runtime execution trace to this file (go tool trace)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if err := startProfile(cpuProfile, pprof.StartCPUProfile); err != nil {
			return err
		}
		return startProfile(traceFile, trace.Start)
	}
	root.AddCommand(benchCommand(), bookieCommand(), shellCommand(), standaloneCommand())
	return root
}

// execute runs root with args, then stops the profiles of --cpuprofile and --trace, whatever
// the outcome: cobra runs no post-run hook after a command fails, and a profile not stopped is
// never written.
func execute(ctx context.Context, root *cobra.Command, args []string) error {
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	pprof.StopCPUProfile()
	trace.Stop()
	return err
}

// signalContext is cancelled by the first SIGINT or SIGTERM: the commands stop gracefully.
// The signals get their default effect back first, so a second one ends the process at once,
// when a graceful stop hangs (signal.NotifyContext keeps catching them until its stop is
// called).
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-c:
		case <-ctx.Done():
		}
		signal.Stop(c) // before cancel: whoever sees ctx done, a second signal kills
		cancel()
	}()
	return ctx, cancel
}

// startProfile creates path and starts a profile writing to it; nothing if path is empty.
func startProfile(path string, start func(io.Writer) error) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return start(f)
}

// procsPerCPU is how many Ps (GOMAXPROCS) the process runs per CPU the runtime would use by
// default. ringkeeper's I/O goroutines block in raw system calls that keep their P: gnet's
// event loops in epoll_wait, journal and entry-log owners in io_uring_enter, pebble in file
// I/O. The runtime takes such a P back only when its monitor notices (20 µs to 10 ms later),
// and until then a goroutine made runnable meanwhile (a journal completion, a response to
// write, a client's reader) waits even though a core is idle. Extra Ps let it run at once.
// Measured on 2 cores (BENCHMARKS.md): (3,3,2) light-load p50 668 → 464 µs, the bookie's
// p99 at half load 42 → 17 ms. The cost: with load generators competing for the same cores
// (the slow-client flood), the bookie took about a quarter fewer adds.
const procsPerCPU = 2

// setProcs sets GOMAXPROCS to procsPerCPU times its default, unless the user set GOMAXPROCS.
func setProcs() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	runtime.GOMAXPROCS(procsPerCPU * runtime.GOMAXPROCS(0))
}

// memoryHeadroom is what the process may use beyond its bookies' memory budgets (caches and
// unwritten read responses): connections, queues, journal and entry-log buffers, metadata
// (and the embedded etcd in standalone).
const memoryHeadroom = 256 << 20

// setMemoryLimit makes the garbage collector keep the heap near the bookies' memory budget
// (bookie.Config.MemoryBudget) plus memoryHeadroom (a soft limit: the GC works harder near it,
// nothing fails), unless the user set GOMEMLIMIT. Without it the heap may grow to twice what
// is live before a collection, and a bookie under a flood of adds held almost twice its
// caches in garbage.
func setMemoryLimit(budget int64, log interface{ Info(string, ...any) }) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := budget + memoryHeadroom
	debug.SetMemoryLimit(limit)
	log.Info("memory limit for the garbage collector", "bytes", limit, "budget", budget)
}
