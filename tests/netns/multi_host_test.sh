#!/usr/bin/env bash
# Ranks on separate hosts: one network namespace per node (a veth pair each, joined by a
# bridge), the README's multi-node commands (loom-coord --bind, loom-rank --coordinator
# --address) over mutual TLS. A (2,2,1) job trains across node1 (ranks 0, 1) and node2 (ranks
# 2, 3) with the coordinator on a third host; then node2's link is cut mid-run, once by taking
# the link down and once by unplugging it from the bridge while it stays up (its packets
# vanish silently): each time every process must end within 30 s, non-zero, and the
# coordinator must name an unreachable rank of node2. Needs root (network namespaces); skips
# with a message without.
set -uo pipefail
root="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-loom}"
[[ -d $root/apps ]] || root="$PWD"
bin="$root/apps" loomc="$root/apps/loomc"
work="${TEST_TMPDIR:-$(mktemp -d)}/netns"
rm -rf "$work" && mkdir -p "$work"

# Root, namespaces, and `ip netns exec` (which remounts /: it fails in a chroot whose / is not a
# mount point) must all work, or nothing here can be tested.
if [[ $(id -u) -ne 0 ]] || ! ip netns add lm-probe 2>/dev/null; then
  echo "SKIP: network namespaces need root and CAP_SYS_ADMIN (ip netns add failed); nothing was tested"
  exit 0
fi
if ! probe=$(ip netns exec lm-probe true 2>&1); then
  ip netns del lm-probe
  echo "SKIP: ip netns exec does not work here ($probe); nothing was tested"
  exit 0
fi
ip netns del lm-probe

hosts=(coord node1 node2)
declare -A ip=([coord]=10.213.0.1 [node1]=10.213.0.11 [node2]=10.213.0.12)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for h in "${hosts[@]}"; do ip netns del "lm-$h" 2>/dev/null; ip link del "lmv-$h" 2>/dev/null; done
  ip link del lmbr0 2>/dev/null
}
trap cleanup EXIT
cleanup
ip link add lmbr0 type bridge && ip link set lmbr0 up
for h in "${hosts[@]}"; do
  ip netns add "lm-$h"
  ip link add "lmv-$h" type veth peer name eth0 netns "lm-$h"
  ip link set "lmv-$h" master lmbr0 up
  ip -n "lm-$h" addr add "${ip[$h]}/24" dev eth0
  ip -n "lm-$h" link set eth0 up
  ip -n "lm-$h" link set lo up
done

# The job's CA and one certificate for the coordinator's address, as in the README.
(cd "$work" && umask 077 &&
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=loom-ca \
    -keyout ca.key -out ca.crt 2>/dev/null &&
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=loom \
    -addext "subjectAltName=IP:${ip[coord]}" -keyout job.key -out job.csr 2>/dev/null &&
  openssl x509 -req -in job.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -copy_extensions copy \
    -out job.crt 2>/dev/null) || { echo "FAIL: openssl could not make the job's certificates"; exit 1; }
tls=(--tls-cert "$work/job.crt" --tls-key "$work/job.key" --tls-ca "$work/ca.crt")
"$loomc" compile "$root/examples/models/gpt-tiny.pbtxt" --cluster "$root/examples/clusters/cpu-4.pbtxt" \
  --out "$work/plans" --quiet || exit 1
export LOOM_TOKEN=netns-test-token OPENBLAS_NUM_THREADS=1

# start JOB STEPS: the coordinator and 4 ranks, each in its host's namespace.
start() {
  local job=$1 steps=$2
  pids=()
  ip netns exec lm-coord "$bin/loom-coord" --plans "$work/plans" --bind "${ip[coord]}" --port 29577 \
    --heartbeat-timeout 5 "${tls[@]}" >"$work/$job.coord.log" 2>&1 &
  pids+=($!)
  for r in 0 1 2 3; do
    local h=node1
    ((r >= 2)) && h=node2
    ip netns exec "lm-$h" "$bin/loom-rank" --coordinator "${ip[coord]}:29577" --rank "$r" --address "${ip[$h]}" \
      "${tls[@]}" --steps "$steps" --threads 1 >"$work/$job.rank$r.log" 2>&1 &
    pids+=($!)
  done
}

# wait_all SECONDS: waits for every process of the job; prints the exit codes; 1 if any is left.
wait_all() {
  local limit=$1 start=$SECONDS
  while ((SECONDS - start < limit)); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.2
  done
  codes=()
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then return 1; fi
    wait "$p"; codes+=($?)
  done
  return 0
}

fail=0
start train 12
if ! wait_all 120; then echo "FAIL: the job across namespaces did not finish in 120 s"; exit 1; fi
if [[ ${codes[*]} != "0 0 0 0 0" ]]; then
  echo "FAIL: the job across namespaces exited ${codes[*]}"; tail -n 3 "$work"/train.*.log; exit 1
fi
grep -h "iteration       12/      12" "$work"/train.rank*.log | head -1
echo "ok: 4 ranks on node1 and node2 trained 12 iterations with the coordinator on a third host (mutual TLS)"

for cut in down unplugged; do
  start "cut-$cut" 100000
  for _ in $(seq 300); do grep -q "iteration        3/" "$work/cut-$cut".rank*.log 2>/dev/null && break; sleep 0.1; done
  if [[ $cut == down ]]; then ip link set lmv-node2 down; else ip link set lmv-node2 nomaster; fi
  cut_at=$SECONDS
  if ! wait_all 40; then
    echo "FAIL ($cut): processes were still running 40 s after node2's link was cut"; fail=1
  else
    took=$((SECONDS - cut_at))
    msg=$(grep -h "error" "$work/cut-$cut.coord.log" | head -1)
    if ((took > 30)); then echo "FAIL ($cut): the job took ${took} s to end"; fail=1; fi
    if [[ " ${codes[*]} " == *" 0 "* ]]; then echo "FAIL ($cut): a process exited 0: ${codes[*]}"; fail=1; fi
    if ! grep -Eq "rank [23]" <<<"$msg"; then echo "FAIL ($cut): the coordinator did not name rank 2 or 3: $msg"; fail=1; fi
    echo "link $cut: the job ended ${took} s after the cut, exit codes ${codes[*]} (coordinator, ranks 0-3)"
    echo "  $msg"
  fi
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip link set lmv-node2 master lmbr0 up
done
exit $fail
