#!/usr/bin/env bash
# The bookie-server figures (issue 5) with the load generator on a core of its own:
# `standalone` with one bookie on core 0 and `bench write` (64 connections) on core 1, each
# with GOMAXPROCS=1, then `bench storage` with the same 64 x 64 load on core 0, at full load
# and at half of the server's rate. On a 2-core machine the load generator otherwise takes as
# much CPU as the bookie (see BENCHMARKS.md).
#
#   scripts/server-pinned.sh /tmp/rk /path/on/the/disk
set -euo pipefail
RK=${1:?usage: server-pinned.sh BINARY DIR}
D=${2:?usage: server-pinned.sh BINARY DIR}/pinned
rm -rf "$D"
mkdir -p "$D"
trap 'rm -rf "$D"' EXIT
M=etcd://127.0.0.1:23790/ledgers
W=(bench write --metadata "$M" --ensemble 1 --write-quorum 1 --ack-quorum 1 --clients 64 --ledgers 64
   --writers 64 --in-flight 64 --duration 8s --warmup 2s --json)
ST=(bench storage --journal-dir "$D" --ledger-dir "$D" --duration 8s --warmup 2s --entry-size 1024
    --ledgers 64 --writers 64 --outstanding 64 --json)

summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); l=r['latency_us']
print(sys.argv[2], round(r['ops_per_sec']), 'adds/s, p50', round(l['p50']), 'us, p99', round(l['p99']), 'us')" "$1" "$2"; }

# bookie N ARGS...: runs bench write ARGS on core 1 against a fresh standalone bookie on core 0.
bookie() {
  local n=$1; shift
  taskset -c 0 env GOMAXPROCS=1 "$RK" standalone --bookies 1 --data-dir "$D/sa$n" --http-port 0 \
    --metadata-port 23790 --port 23181 > "$D/standalone$n.log" 2>&1 &
  local sa=$!
  for _ in $(seq 100); do grep -q ready "$D/standalone$n.log" && break; sleep 0.1; done
  taskset -c 1 env GOMAXPROCS=1 "$RK" "$@" > "$D/write$n.json"
  kill -INT $sa
  wait $sa || true
}

bookie 1 "${W[@]}"
summary "$D/write1.json" "server, full load:"
half=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['ops_per_sec']/2))" "$D/write1.json")
bookie 2 "${W[@]}" --rate "$half"
summary "$D/write2.json" "server at $half/s:"
taskset -c 0 env GOMAXPROCS=1 "$RK" "${ST[@]}" > "$D/storage1.json"
summary "$D/storage1.json" "storage, full load:"
taskset -c 0 env GOMAXPROCS=1 "$RK" "${ST[@]}" --rate "$half" > "$D/storage2.json"
summary "$D/storage2.json" "storage at $half/s:"
