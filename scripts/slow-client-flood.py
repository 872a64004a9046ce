#!/usr/bin/env python3
"""Bookie memory under a flood of slow clients (BENCHMARKS.md, server section).

Starts `ringkeeper standalone` with one bookie, opens --clients connections that send 1 KiB adds
(v2 protocol) as fast as the socket takes them and never read a response, and samples the
process's RSS. Meanwhile one well-behaved connection adds and reads back an entry every 100 ms,
to show that everyone else is still served. Reports the peak RSS against the configured caches
(write cache + read-ahead cache + index block cache) + 256 MiB; the process also holds the embedded etcd, so the
figure is an upper bound for the bookie alone.

    scripts/slow-client-flood.py --binary /tmp/rk --dir /path/on/disk [--clients 64] [--seconds 30]
"""
import argparse, os, shutil, socket, struct, subprocess, sys, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--binary", default="./ringkeeper")
ap.add_argument("--dir", required=True)
ap.add_argument("--clients", type=int, default=64)
ap.add_argument("--seconds", type=int, default=30)
ap.add_argument("--write-cache-mb", type=int, default=256)
ap.add_argument("--port", type=int, default=3381)
args = ap.parse_args()
# standalone has no flags for these two caches: its bookie runs with the defaults
# (dbStorage_readAheadCacheMaxSizeMb, dbStorage_rocksDB_blockCacheSize for its one ledger dir).
READ_CACHE_MB, INDEX_CACHE_MB = 256, 128

ADD, READ, VERSION = 1, 2, 2
KEY = b"k" * 20


def add_frame(ledger, entry, payload):
    stored = struct.pack(">qqqq", ledger, entry, entry - 1, len(payload)) + b"\0\0\0\0" + payload
    body = struct.pack(">i", VERSION << 24 | ADD << 16) + KEY + stored
    return struct.pack(">i", len(body)) + body


def read_frame(ledger, entry):
    body = struct.pack(">iqq", VERSION << 24 | READ << 16, ledger, entry)
    return struct.pack(">i", len(body)) + body


def recv_frame(s):
    def exact(n):
        b = b""
        while len(b) < n:
            chunk = s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("closed")
            b += chunk
        return b
    n = struct.unpack(">i", exact(4))[0]
    return exact(n)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


data = os.path.join(args.dir, "flood")
shutil.rmtree(data, ignore_errors=True)
cmd = [args.binary, "standalone", "--bookies", "1", "--data-dir", data, "--port", str(args.port),
       "--metadata-port", str(args.port + 100), "--http-port", "0", "--write-cache-mb", str(args.write_cache_mb)]
print("+", " ".join(cmd), file=sys.stderr, flush=True)
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
line = proc.stdout.readline()
if "ready" not in line:
    raise SystemExit(f"standalone did not start: {line}")
addr = ("127.0.0.1", args.port)
stop = threading.Event()
sent = [0] * args.clients
reconnects = [0] * args.clients


def flooder(i):
    payload = os.urandom(1024)
    ledger, entry = 1000 + i, 0
    while not stop.is_set():
        try:
            s = socket.create_connection(addr)
            s.settimeout(1.0)
            while not stop.is_set():
                batch = b"".join(add_frame(ledger, entry + k, payload) for k in range(32))
                try:
                    s.sendall(batch)
                except socket.timeout:
                    continue  # the bookie stopped reading this connection: keep pushing
                entry += 32
                sent[i] += 32
        except OSError:
            reconnects[i] += 1
            time.sleep(0.05)


samples, probe_lat, probe_err = [], [], []


def prober():
    s = socket.create_connection(addr)
    s.settimeout(10)
    e = 0
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            s.sendall(add_frame(7, e, b"probe"))
            rc_add = struct.unpack(">i", recv_frame(s)[4:8])[0]
            s.sendall(read_frame(7, e))
            rc_read = struct.unpack(">i", recv_frame(s)[4:8])[0]
            if rc_add != 0 or rc_read != 0:
                probe_err.append((e, rc_add, rc_read))
            probe_lat.append(time.monotonic() - t0)
        except OSError as err:
            if stop.is_set():
                break  # the bookie is being stopped: not an error of the run
            probe_err.append((e, str(err)))
            s = socket.create_connection(addr)
            s.settimeout(10)
        e += 1
        time.sleep(0.1)


base = rss_mib(proc.pid)
threads = [threading.Thread(target=flooder, args=(i,), daemon=True) for i in range(args.clients)]
threads.append(threading.Thread(target=prober, daemon=True))
for t in threads:
    t.start()
end = time.monotonic() + args.seconds
while time.monotonic() < end:
    samples.append(rss_mib(proc.pid))
    time.sleep(0.2)
stop.set()
proc.terminate()
proc.wait(timeout=30)
shutil.rmtree(data, ignore_errors=True)

limit = args.write_cache_mb + READ_CACHE_MB + INDEX_CACHE_MB + 256
peak = max(samples)
probe_lat.sort()
p = lambda q: probe_lat[min(len(probe_lat) - 1, int(q * len(probe_lat)))] * 1e3 if probe_lat else float("nan")
print(f"slow clients: {args.clients}, adds pushed: {sum(sent)}, reconnects after the bookie closed a connection: {sum(reconnects)}")
print(f"RSS: before the flood {base:.0f} MiB, peak {peak:.0f} MiB, at the end {samples[-1]:.0f} MiB; "
      f"limit (write cache {args.write_cache_mb} + read cache {READ_CACHE_MB} + index cache "
      f"{INDEX_CACHE_MB} + 256) {limit} MiB: "
      f"peak/limit {peak / limit:.2f}")
print(f"well-behaved client during the flood: {len(probe_lat)} add+read round trips, p50 {p(0.5):.1f} ms, "
      f"p99 {p(0.99):.1f} ms, errors {len(probe_err)} {probe_err[:3]}")
sys.exit(0 if peak <= limit and not probe_err else 1)
