#!/usr/bin/env python3
"""Every figure of BENCHMARKS.md in one run: physlimit first (the disk's limit, same run), then
each workload, interleaved repetitions where the figure is a ratio of two workloads, then
physlimit again. Writes every JSON result under --out, collected in figures.json; the medians
and ratios in BENCHMARKS.md are taken from it.

    go build -o /tmp/rk ./cmd/ringkeeper
    scripts/bench-figures.py --dir /path/on/the/disk --binary /tmp/rk --out /tmp/figures [--reps 3]

With --ledger-dir on a second device, `bench storage` puts its entry logs and index there (the
journal stays under --dir), as BookKeeper is deployed; physlimit measures --dir.

Needs fio (apt-get install -y fio) for ../shared/tools/physlimit.
"""
import argparse, json, os, shutil, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("--dir", required=True, help="data directory on the disk being measured")
ap.add_argument("--ledger-dir", default="", help="bench storage's ledger directory (default: --dir)")
ap.add_argument("--binary", default="./ringkeeper")
ap.add_argument("--out", required=True, help="directory for the JSON results and profiles")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--only", default="", help="comma-separated sections: physlimit,journal,storage,compaction,server,client,dlog")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
only = set(args.only.split(",")) if args.only else None
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PHYSLIMIT = os.path.join(ROOT, "..", "shared", "tools", "physlimit")
results = {}


def want(section):
    return only is None or section in only


def save():
    with open(os.path.join(args.out, "figures.json"), "w") as f:
        json.dump(results, f, indent=1)


def run(name, argv):
    """Runs the binary with argv, saves and returns its JSON result (None if it failed). A
    --data-dir it was given is removed afterwards: standalone clusters preallocate."""
    cmd = [args.binary] + argv + ["--json"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if "--data-dir" in argv:
        shutil.rmtree(argv[argv.index("--data-dir") + 1], ignore_errors=True)
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        results.setdefault(name, []).append({"cmd": " ".join(cmd), "error": p.stderr[-2000:]})
        save()
        return None
    res = json.loads(p.stdout)
    results.setdefault(name, []).append({"cmd": " ".join(cmd), "result": res})
    save()
    return res


def separate_bookie(name, data_dir, bench_argv):
    """Runs bench_argv (a `bench server` without a target) against a one-bookie `standalone`
    in its own process, so that the load generator's goroutines do not queue in the bookie's
    Go scheduler (they still share the machine's cores)."""
    sa = subprocess.Popen([args.binary, "standalone", "--bookies", "1", "--data-dir", data_dir,
                           "--write-cache-mb", "512", "--http-port", "0", "--metadata-port", "23790",
                           "--port", "23181"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = sa.stdout.readline()
        if "ready" not in line:
            # Recorded like a failed run, so that no median is silently of fewer runs.
            err = f"standalone did not start: {line!r}"
            print(err, file=sys.stderr)
            results.setdefault(name, []).append({"cmd": " ".join(sa.args), "error": err})
            save()
            return None
        return run(name, bench_argv + ["--bookie", "127.0.0.1:23181"])
    finally:
        sa.send_signal(2)
        sa.wait(timeout=60)
        shutil.rmtree(data_dir, ignore_errors=True)


def physlimit(tag):
    cmd = [PHYSLIMIT, "--dir", args.dir, "--json"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    results.setdefault("physlimit", []).append({"cmd": " ".join(cmd), "tag": tag, "result": res})
    save()
    return res


def gobench(name, pkg, pattern, benchtime="3s", count=3):
    cmd = ["go", "test", "-run", "^$", "-bench", pattern, "-benchmem", "-benchtime", benchtime,
           "-count", str(count), pkg]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    results.setdefault(name, []).append({"cmd": " ".join(cmd), "result": out})
    save()
    return out


D = args.dir
L = args.ledger_dir or D
JT = ["bench", "journal", "--dir", D, "--duration", "10s", "--warmup", "3s", "--max-file-mb", "256",
      "--max-backups", "1", "--group-bytes", "1048576", "--writers", "256", "--outstanding", "16", "--entry-size", "1024"]
JL = ["bench", "journal", "--dir", D, "--duration", "5s", "--warmup", "2s", "--max-file-mb", "16",
      "--max-backups", "1", "--writers", "1", "--outstanding", "1", "--entry-size", "1024"]
ST_BASE = ["bench", "storage", "--journal-dir", D, "--ledger-dir", L, "--duration", "10s", "--warmup", "3s",
           "--entry-size", "1024"]
ST = ST_BASE + ["--writers", "256", "--outstanding", "16", "--ledgers", "256", "--group-bytes", "1048576",
                "--write-cache-mb", "256"]
ST64 = ST_BASE + ["--ledgers", "64", "--writers", "64", "--outstanding", "64"]
STANDALONE = ["--standalone", "--data-dir"]

if want("physlimit"):
    physlimit("before")

if want("journal"):
    for _ in range(args.reps):
        for eng in ("io_uring", "psync"):
            run(f"journal-throughput-{eng}", JT + ["--engine", eng])
            run(f"journal-latency-{eng}", JL + ["--engine", eng])
    run("journal-vs-pebble", JT + ["--engine", "io_uring", "--baseline", "pebble"])
    gobench("journal-allocs", "./journal/", "BenchmarkAppend", "2s", 1)

if want("storage"):
    for _ in range(args.reps):
        run("storage-journal-throughput", JT + ["--engine", "io_uring"])
        run("storage-adds", ST)
    # The reads start once the reopened engine has warmed its index (it must fit in half the
    # index cache: about 110 MB for these 13 s of adds); once more with the index left cold.
    for _ in range(args.reps):
        run("storage-read-random", ST + ["--index-cache-mb", "256", "--read", "random", "--read-outstanding", "32"])
    run("storage-read-random-cold-index", ST + ["--index-cache-mb", "256", "--cold-index", "--read", "random",
                                                "--read-outstanding", "32"])
    run("storage-read-sequential", ST + ["--index-cache-mb", "256", "--read", "sequential"])
    gobench("writecache-allocs", "./engine/", "BenchmarkWriteCachePut", "1s", 1)

if want("compaction"):
    for _ in range(args.reps):
        run("storage-compaction", ["bench", "storage", "--journal-dir", D, "--ledger-dir", L, "--compaction",
                                   "--duration", "15s", "--writers", "64", "--outstanding", "16", "--ledgers", "64"])

if want("server"):
    # One bookie over loopback, 64 raw-codec connections (`bench server`: no client library, the
    # server issue's figure), against the engine alone with the same 64 x 64 load; then the
    # client library at (1,1,1) with 1000 in flight against the same bookie setup (issue 6's
    # ratio), and the raw codec in the client's shape (one connection, 1000 in flight), so that
    # the library's own cost shows apart from the shape's; interleaved so that each set of runs
    # shares the machine's state.
    SRV = ["bench", "server", "--connections", "64", "--in-flight", "64", "--duration", "10s", "--warmup", "3s"]
    for i in range(args.reps):
        run("server-storage-adds", ST64)
        w = run("server-raw-64conns", SRV + STANDALONE + [f"{D}/srv{i}"])
        run("client-111-1000inflight", ["bench", "write"] + STANDALONE + [f"{D}/c111-{i}", "--bookies", "1",
            "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1", "--in-flight", "1000",
            "--duration", "10s", "--warmup", "3s"])
        run("server-raw-1conn-1000inflight", ["bench", "server", "--connections", "1", "--in-flight", "1000",
            "--duration", "10s", "--warmup", "3s"] + STANDALONE + [f"{D}/srv1c{i}"])
        if w is None:
            continue
        half = w["ops_per_sec"] / 2
        run("server-raw-64conns-half-load", SRV + STANDALONE + [f"{D}/srvh{i}", "--rate", f"{half:.0f}"])
        run("server-storage-half-load", ST64 + ["--rate", f"{half:.0f}"])
    # The same with the bookie in a process of its own (`standalone`, with bench storage's
    # 512 MiB write cache), so that the load generator does not share its Go scheduler.
    for i in range(args.reps):
        w = separate_bookie("server-separate-raw-64conns", f"{D}/sep{i}", SRV)
        if w is None:
            continue
        half = w["ops_per_sec"] / 2
        separate_bookie("server-separate-raw-64conns-half-load", f"{D}/seph{i}", SRV + ["--rate", f"{half:.0f}"])
        run("server-separate-storage-half-load", ST64 + ["--rate", f"{half:.0f}"])
    gobench("server-raw-codec", "./net/server/", "BenchmarkAddLoopback", "3s", 3)

if want("client"):
    for i in range(args.reps):
        run("client-332-light", ["bench", "write"] + STANDALONE + [f"{D}/c332l-{i}", "--bookies", "3",
            "--in-flight", "1", "--duration", "10s", "--warmup", "2s"])
        run("client-111-light", ["bench", "write"] + STANDALONE + [f"{D}/c111l-{i}", "--bookies", "1",
            "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1", "--in-flight", "1",
            "--duration", "10s", "--warmup", "2s"])
    run("client-332-1000inflight", ["--cpuprofile", f"{args.out}/write332.prof", "bench", "write"] + STANDALONE +
        [f"{D}/c332", "--bookies", "3", "--in-flight", "1000", "--duration", "15s", "--warmup", "3s"])
    gobench("client-raw-serial-rtt", "./net/transport/", "BenchmarkRawAddSerial", "3s", 3)
    gobench("client-transport", "./net/transport/", "BenchmarkAddPipelined", "3s", 3)

if want("dlog"):
    run("dlog-write-100B", ["bench", "dlog", "write", "--standalone", "--record-size", "100", "--baseline",
                            "--duration", "10s"])

if want("physlimit"):
    physlimit("after")

save()
print(f"wrote {args.out}/figures.json", file=sys.stderr)
