#!/usr/bin/env python3
"""Journal figures for BENCHMARKS.md: physlimit, then each configuration REPS times, interleaved,
then physlimit again; prints medians and ratios to the disk limit measured in the same run.

    scripts/bench-journal.py --dir /path/on/nvme [--reps 3] [--seconds 10] [--out results.json]
"""
import argparse, json, statistics, subprocess, sys, os

ap = argparse.ArgumentParser()
ap.add_argument("--dir", required=True)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--seconds", type=int, default=10)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--binary", default="./ringkeeper")
ap.add_argument("--out", default="")
ap.add_argument("--only", default="", help="comma-separated config names")
args = ap.parse_args()

THROUGHPUT = ["--writers", "256", "--outstanding", "16", "--group-bytes", "1048576"]
LATENCY = ["--writers", "1", "--outstanding", "1"]
COMMON = ["--max-file-mb", "512"]
configs = {
    # name: flags
    "tput-io_uring-reuse": THROUGHPUT + ["--engine", "io_uring"],
    "tput-psync-reuse": THROUGHPUT + ["--engine", "psync"],
    "tput-io_uring-fallocate-noreuse": THROUGHPUT + ["--engine", "io_uring", "--reuse-files=false"],
    "tput-io_uring-zero-noreuse": THROUGHPUT + ["--engine", "io_uring", "--reuse-files=false", "--prealloc", "zero"],
    "tput-io_uring-none-noreuse": THROUGHPUT + ["--engine", "io_uring", "--reuse-files=false", "--prealloc", "none"],
    "lat-io_uring-reuse": LATENCY + ["--engine", "io_uring"],
    "lat-psync-reuse": LATENCY + ["--engine", "psync"],
    "lat-io_uring-fallocate-noreuse": LATENCY + ["--engine", "io_uring", "--reuse-files=false"],
    "lat-io_uring-zero-noreuse": LATENCY + ["--engine", "io_uring", "--reuse-files=false", "--prealloc", "zero"],
}
if args.only:
    configs = {k: v for k, v in configs.items() if k in args.only.split(",")}

def physlimit():
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tools", "physlimit")
    out = subprocess.run([tool, "--dir", args.dir, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)

def run(flags):
    # Latency runs write little, so shrink files to reach reuse during the warm-up.
    extra = ["--max-file-mb", "16", "--max-backups", "1"] if "--writers" in flags and flags[flags.index("--writers") + 1] == "1" else COMMON
    cmd = [args.binary, "bench", "journal", "--dir", args.dir, "--json", "--duration", f"{args.seconds}s",
           "--warmup", f"{args.warmup}s"] + extra + flags
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)

results = {"physlimit_before": physlimit(), "runs": {k: [] for k in configs}}
for rep in range(args.reps):
    for name, flags in configs.items():
        results["runs"][name].append(run(flags))
results["physlimit_after"] = physlimit()

pb, pa = results["physlimit_before"], results["physlimit_after"]
def lim(job, key):
    return statistics.mean([pb[job][key], pa[job][key]])
print(f"physlimit before/after: sync1m {pb['sync1m']['mb_per_sec']}/{pa['sync1m']['mb_per_sec']} MB/s, "
      f"sync4k p50 {pb['sync4k']['p50_us']}/{pa['sync4k']['p50_us']} us, seq1m {pb['seq1m']['mb_per_sec']}/{pa['seq1m']['mb_per_sec']} MB/s")
for name, runs in results["runs"].items():
    mb = statistics.median(r["mb_per_sec"] for r in runs)
    ops = statistics.median(r["ops_per_sec"] for r in runs)
    p50 = statistics.median(r["latency_us"]["p50"] for r in runs)
    p99 = statistics.median(r["latency_us"]["p99"] for r in runs)
    line = f"{name:34s} median of {len(runs)}: {ops:10.0f} ops/s {mb:8.1f} MB/s p50 {p50:8.1f} us p99 {p99:8.1f} us"
    if name.startswith("tput"):
        line += f"  MB/s / sync1m = {mb / lim('sync1m', 'mb_per_sec'):.2f}"
    else:
        line += f"  p50 / sync4k p50 = {p50 / lim('sync4k', 'p50_us'):.2f}"
    # Failed appends are part of the figure: a median of runs that failed must say so.
    errs = [r["errors"] for r in runs]
    line += f"  errors {sum(errs)} (in {sum(1 for e in errs if e)} of {len(runs)} runs)"
    print(line)
if args.out:
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
