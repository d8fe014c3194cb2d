#!/usr/bin/env bash
# Slurm: start a one-node cluster (munged, slurmctld, slurmd) with tools/slurm/local_cluster.sh,
# take the sbatch script out of the README exactly as it is written there, and submit it for a
# job directory holding the binaries and plans for 4 ranks of gpt-tiny (t, p, d) = (2, 2, 1).
# Passes when the job completes, every rank logged its 100th iteration with a finite loss, and
# the coordinator reports all 4 ranks finished. Skips (saying why) without root or Slurm.
set -uo pipefail
root="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-loom}"
[[ -d $root/apps ]] || root="$PWD"
work="${TEST_TMPDIR:-$(mktemp -d)}/slurm"
rm -rf "$work" && mkdir -p "$work"

if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: the one-node Slurm needs root (slurmd); nothing was tested"
  exit 0
fi
for b in munged slurmctld slurmd sbatch openssl xxd; do
  if ! command -v "$b" >/dev/null; then
    echo "SKIP: $b is not installed (./loom test installs Slurm, munge, openssl and xxd); nothing was tested"
    exit 0
  fi
done
# Slurm, and the README's script (the coordinator's certificate and address), name nodes by
# host name: a root without one that resolves (a bare chroot's /etc/hosts) cannot run it.
if ! getent hosts "$(hostname -s)" >/dev/null; then
  echo "SKIP: this machine's name '$(hostname -s)' does not resolve (getent hosts); nothing was tested"
  exit 0
fi

# A short path: munged's socket path must fit in 108 bytes (Bazel's test directories do not).
cluster=$(mktemp -d /tmp/loom-slurm.XXXXXX)
cleanup() {
  "$root/tools/slurm/local_cluster.sh" stop "$cluster"
  cp "$cluster"/*.log "$work/" 2>/dev/null
  rm -rf "$cluster"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # a timeout (Bazel sends TERM) still stops the daemons, through EXIT
"$root/tools/slurm/local_cluster.sh" start "$cluster" || { echo "FAIL: the one-node Slurm did not start"; exit 1; }
export SLURM_CONF=$cluster/slurm.conf

# The job directory: what the README's script expects to find (bazel-bin/, plans/).
job="$work/job"
mkdir -p "$job/bazel-bin/apps"
ln -s "$root/apps/loom-coord" "$root/apps/loom-rank" "$job/bazel-bin/apps/"
"$root/apps/loomc" compile "$root/examples/models/gpt-tiny.pbtxt" --cluster "$root/examples/clusters/cpu-4.pbtxt" \
  --out "$job/plans" --quiet || { echo "FAIL: loomc compile"; exit 1; }

# The README's block: the first ```sh fence after "With Slurm".
awk '/^With Slurm/ {found=1} found && /^```sh$/ {inblock=1; next} inblock && /^```$/ {exit} inblock {print}' \
  "$root/README.md" > "$job/train.sbatch"
grep -q '^#SBATCH' "$job/train.sbatch" || { echo "FAIL: no sbatch script found in README.md"; exit 1; }

out="$job/slurm.out"
id=$(timeout 30 sbatch --parsable --chdir="$job" --output="$out" --time=10 "$job/train.sbatch") ||
  { echo "FAIL: sbatch refused the README's script"; exit 1; }
echo "submitted job $id"
state=""
deadline=$((SECONDS + 180))  # the job takes about 30 s here; the test's own limit is 300 s
while ((SECONDS < deadline)); do
  state=$(timeout 10 scontrol show job "$id" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  [[ $state =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]] && break
  sleep 0.5
done
[[ $state =~ ^(PENDING|RUNNING|COMPLETING)$ ]] && timeout 10 scancel "$id"
echo "job $id: $state"
status=0
if [[ $state != COMPLETED ]]; then
  echo "FAIL: the job ended $state"
  status=1
fi
finished=$(grep -c "iteration *100/ *100" "$out")
if [[ $finished -lt 1 ]] || grep -qiE "lm loss: *[-+]?(nan|inf)" "$out"; then
  echo "FAIL: no rank logged iteration 100 with a finite loss"
  status=1
fi
grep -q "loom-coord: all 4 ranks finished" "$out" || { echo "FAIL: the coordinator did not see 4 ranks finish"; status=1; }
echo "--- the job's output (last lines)"
tail -n 15 "$out"
exit $status
