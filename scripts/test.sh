#!/usr/bin/env bash
# Installs quorumstore with its test dependencies and runs every test tier, fastest first:
# static checks (mypy, ruff, import layering), unit, integration (in-process servers), the
# fresh install of a built wheel, deterministic simulation, process (real servers on
# loopback), multihost (network-namespace hosts and a Spark standalone cluster; root), Spark
# (local mode).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[test]"
if ! command -v etcd >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # The etcd peer's tests need Debian's etcd; install it where we may.
  apt-get update -qq >/dev/null && apt-get install -y -qq etcd-server etcd-client >/dev/null
fi
if ! command -v iptables-legacy >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # The multi-host tier's partition and delay helpers need iptables.
  apt-get update -qq >/dev/null && apt-get install -y -qq iptables >/dev/null
fi
if ! command -v mkfs.ext4 >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # The disk nemesis (tests/process/test_disk_nemesis.py) puts nodes on small ext4 disks.
  apt-get update -qq >/dev/null && apt-get install -y -qq e2fsprogs >/dev/null
fi
if ! command -v azurite-blob >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # The metadata lease's tests on Azure Blob Storage run against Azurite, its emulator.
  if ! command -v npm >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && apt-get install -y -qq npm >/dev/null
  fi
  npm install --global --silent azurite@3.35.0 >/dev/null  # 3.36 and later need Node 21+
fi
export PYSPARK_PYTHON="$(python -c 'import sys; print(sys.executable)')"
export PYSPARK_DRIVER_PYTHON="$PYSPARK_PYTHON"

# Every tier runs even when an earlier one fails, so one run reports every failure;
# the script fails at the end if any tier did.
failed=()
run_tier() {  # run_tier NAME COMMAND...
  local name=$1; shift
  echo "=== $name ==="
  local start=$SECONDS status=0
  "$@" || status=$?
  echo "=== $name: $((SECONDS - start)) s, exit $status ==="
  if [ "$status" -ne 0 ]; then failed+=("$name"); fi
}

run_pytest() { python -m pytest -q -p no:cacheprovider "$@"; }
py_dirs=(python tests bench examples coordinator_driver executor_node)
# Type hints of the package (it ships py.typed) and the benchmarks, lint, formatting, and
# the import layering contracts of .importlinter.
static_checks() {
  python -m mypy && python -m ruff check "${py_dirs[@]}" && python -m ruff format --check "${py_dirs[@]}" \
    && lint-imports --no-cache
}

run_tier static static_checks
run_tier unit run_pytest tests/unit
run_tier integration run_pytest tests/integration
# A wheel installed into an empty virtual environment, run from outside the checkout.
run_tier "fresh install" bash scripts/fresh-install.sh
run_tier simulation run_pytest tests/simulation
# Its campaigns (test_nemesis, test_disk_nemesis) run 20 s each, with a random seed.
run_tier process run_pytest tests/process
# Each module that starts Spark runs in its own pytest process, so each gets a fresh
# JVM: the state-store provider's jar reaches the driver's class path only when its JVM
# starts.
for module in tests/multihost/test_*.py; do
  run_tier "multihost $(basename "$module" .py)" run_pytest "$module"
done
for module in tests/spark/test_*.py; do
  run_tier "spark $(basename "$module" .py)" run_pytest "$module"
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED tiers: ${failed[*]}"
  exit 1
fi
echo "all tiers passed"
