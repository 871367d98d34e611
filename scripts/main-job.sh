#!/usr/bin/env bash
# Installs quorumstore with Spark support and runs the main job (`quorumstore demo`,
# quorumstore/spark/demo.py): a quorumstore cluster inside a local Spark session, a
# stateful streaming query whose state lives in quorumstore, and a DataFrame read of the
# committed state. The install is editable, as for development: the state-store jar is
# compiled on first use with the Scala compiler inside pyspark (a wheel carries it built);
# nothing from the test extra is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[spark]"
export PYSPARK_PYTHON="$(python -c 'import sys; print(sys.executable)')"
export PYSPARK_DRIVER_PYTHON="$PYSPARK_PYTHON"
exec "$(dirname "$PYSPARK_PYTHON")/quorumstore" demo "$@"
