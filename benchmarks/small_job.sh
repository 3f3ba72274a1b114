#!/usr/bin/env bash
# Where the time of a small job goes: a 1k-change incremental backup on a warm engine.
#
#     bash benchmarks/small_job.sh [PORT]
#     DCPTOOL="python -m dcptool" bash benchmarks/small_job.sh     # the tree on PYTHONPATH
#
# A reference node (1,024 vbuckets, 20,000 documents) on 127.0.0.1:PORT (default 12410), a
# `dcptool engine`, a full backup on it, then three incrementals of 1,000 new documents each
# and two with no change, each timed as a whole command; `dcptool --version` for the
# interpreter's start-up; and one incremental and one no-change backup under pyinstrument
# (its reports are left in the work directory, printed at the end); then a chain of ~20
# backups, a no-change and a 1k-change incremental timed on it. DCPTOOL names the command
# (default `dcptool`, the installed entry point).
set -u
PORT=${1:-12410}
# the command to time (word-split): `dcptool` by default
DCPTOOL=${DCPTOOL:-dcptool}
D=$(mktemp -d -t dcptool-small-job-XXXXXX)
export DCPTOOL_PASSWORD=password DCPTOOL_USERNAME=Administrator DCPTOOL_ENGINE_DIR=$D/eng
C=127.0.0.1:$PORT
$DCPTOOL node start --data "$D/node" --port "$PORT" --vbuckets 1024 > "$D/node.log" 2>&1 &
NODE=$!
trap '$DCPTOOL engine stop -q 2>/dev/null; kill $NODE 2>/dev/null' EXIT
sleep 3
$DCPTOOL doc load --count 20000 -c "$C" -q
$DCPTOOL engine start -q
$DCPTOOL backup -c "$C" -b default "$D/arch" --json > "$D/full.json"
for r in 1 2 3; do
  $DCPTOOL doc load --count 1000 --prefix "chg$r::" -c "$C" -q
  /usr/bin/time -f "incremental $r: %e s wall, %U s user, %S s sys" \
    $DCPTOOL backup -c "$C" -b default "$D/arch" --json > "$D/inc$r.json"
done
for r in 1 2; do
  /usr/bin/time -f "no change $r: %e s wall, %U s user, %S s sys" \
    $DCPTOOL backup -c "$C" -b default "$D/arch" --json > "$D/none$r.json"
done
/usr/bin/time -f "dcptool --version: %e s wall, %U s user, %S s sys" $DCPTOOL --version >/dev/null
$DCPTOOL doc load --count 1000 --prefix "chgp::" -c "$C" -q
python -m pyinstrument -o "$D/incremental.txt" -m dcptool backup -c "$C" -b default "$D/arch" --json >/dev/null
python -m pyinstrument -o "$D/no-change.txt" -m dcptool backup -c "$C" -b default "$D/arch" --json >/dev/null
# a chain of ~20 backups: more small incrementals, then a no-change and a 1k-change one timed
for r in $(seq 1 12); do
  $DCPTOOL doc load --count 50 --prefix "chain$r::" -c "$C" -q
  $DCPTOOL backup -c "$C" -b default "$D/arch" -q > /dev/null
done
/usr/bin/time -f "chain of ~20, no change: %e s wall, %U s user, %S s sys" \
  $DCPTOOL backup -c "$C" -b default "$D/arch" --json > /dev/null
$DCPTOOL doc load --count 1000 --prefix "chgc::" -c "$C" -q
/usr/bin/time -f "chain of ~20, incremental: %e s wall, %U s user, %S s sys" \
  $DCPTOOL backup -c "$C" -b default "$D/arch" --json > /dev/null
python - "$D" <<'PY'
import json, sys
d = sys.argv[1]
for f in ("inc1", "inc2", "inc3", "none1", "none2"):
    r = json.load(open(f"{d}/{f}.json"))
    print(f"{f}: {r['type']}, {r['mutations']} mutations, the run's own seconds "
          f"{r['seconds']} (attaching to the engine {r['spark_startup_seconds']})")
print(f"profiles: {d}/incremental.txt, {d}/no-change.txt")
PY
