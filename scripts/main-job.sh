#!/usr/bin/env bash
# Installs quorumstore with Spark support and runs the main job (examples/main_job.py):
# a quorumstore cluster inside a local Spark session, a stateful streaming query whose
# state lives in quorumstore, and a DataFrame read of the committed state.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[spark]"
export PYSPARK_PYTHON="$(python -c 'import sys; print(sys.executable)')"
export PYSPARK_DRIVER_PYTHON="$PYSPARK_PYTHON"
exec python examples/main_job.py "$@"
