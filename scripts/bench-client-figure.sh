#!/bin/bash
# bench-client-figure.sh RK DIR OUT: issue 6's figures on one machine, interleaved: physlimit,
# three rounds of (client (1,1,1) 1000 in flight, raw codec 1 x 1000, raw codec 64 x 64), the
# light-load runs three times each, physlimit again. One JSON file per run under OUT.
#   go build -o /tmp/rk ./cmd/ringkeeper && scripts/bench-client-figure.sh /tmp/rk /path/on/disk /tmp/figT
set -eu
RK=$1 D=$2 O=$3
PHYS=$(dirname "$0")/../../shared/tools/physlimit
mkdir -p "$D" "$O"
"$PHYS" --dir "$D" --json > "$O/physlimit-before.json"
one() { # name, args...
  local name=$1; shift
  rm -rf "$D/x"
  "$RK" "$@" --standalone --data-dir "$D/x" --json > "$O/$name.json" 2>/dev/null
}
for i in 1 2 3; do
  one client111-$i bench write --bookies 1 --ensemble 1 --write-quorum 1 --ack-quorum 1 --in-flight 1000 --duration 10s --warmup 3s
  one raw1-$i bench server --connections 1 --in-flight 1000 --duration 10s --warmup 3s
  one raw64-$i bench server --duration 10s --warmup 3s
done
for i in 1 2 3; do
  one light111-$i bench write --bookies 1 --ensemble 1 --write-quorum 1 --ack-quorum 1 --in-flight 1 --duration 10s --warmup 2s
  one light332-$i bench write --bookies 3 --in-flight 1 --duration 10s --warmup 2s
done
rm -rf "$D/x"
"$PHYS" --dir "$D" --json > "$O/physlimit-after.json"
