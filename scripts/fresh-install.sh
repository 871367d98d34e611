#!/usr/bin/env bash
# Installs quorumstore as a user gets it and runs it with no checkout in sight: builds the
# wheel (the state-store jar included), installs it with the `spark` extra only into an
# empty virtual environment, then, from a temporary directory, runs the main job
# (`quorumstore demo`) and a DataFrame write and read, a change-feed readStream and a
# writeStream through the `quorumstore` format, relying on its automatic registration
# (no quorumstore import), against a
# `quorumstore standalone` server. Fails on any undeclared dependency or any file taken
# from the checkout.
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
work="$(mktemp -d "${TMPDIR:-/tmp}/quorumstore-fresh-install.XXXXXX")"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
step() { echo "--- $*"; }

# The wheel is built from a copy of the checkout's files (tracked or not, minus what git
# ignores): an in-tree build would reuse build/lib, which keeps modules since moved away.
step "copying the checkout's files to $work/src"
git -C "$checkout" ls-files -z -co --exclude-standard | "$python" -c '
import shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for name in filter(None, sys.stdin.buffer.read().decode().split("\0")):
    if (src / name).is_file():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, dst / name)
' "$checkout" "$work/src"
step "building the wheel (compiles the state-store jar with pyspark's Scala compiler)"
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/dist" "$work/src"
wheel="$(ls "$work"/dist/quorumstore-*.whl)"
echo "built $(basename "$wheel"):"
"$python" -m zipfile -l "$wheel" | grep -E "pyspark_quorumstore.py|spark/node_task.py|spark/demo.py|\.jar" | sed 's/^/  /'

step "installing it with the spark extra into an empty virtual environment ($work/venv)"
"$python" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install --quiet --disable-pip-version-check "${wheel}[spark]"
"$venv_python" -m pip check

# From here on: outside the checkout, with nothing but the virtual environment.
mkdir "$work/run"
cd "$work/run"
unset PYTHONPATH
export PATH="$work/venv/bin:$PATH" PYSPARK_PYTHON="$venv_python" PYSPARK_DRIVER_PYTHON="$venv_python"
echo "running in $PWD with $(command -v quorumstore)"

step "checking that nothing comes from the checkout"
QUORUMSTORE_CHECKOUT="$checkout" "$venv_python" - <<'EOF'
import importlib.metadata
import os
import sys
from pathlib import Path

import pyspark_quorumstore
import quorumstore
from quorumstore.spark import jar_build, node_task
from quorumstore.spark.state_store import state_store_jar

checkout = Path(os.environ["QUORUMSTORE_CHECKOUT"]).resolve()
venv = Path(sys.prefix).resolve()
on_path = [p for p in sys.path if p and Path(p).resolve().is_relative_to(checkout)]
assert not on_path, f"the checkout is on sys.path: {on_path}"
for module in (quorumstore, pyspark_quorumstore, node_task):
    path = Path(module.__file__).resolve()
    assert path.is_relative_to(venv), f"{module.__name__} comes from {path}, not {venv}"
    print(f"{module.__name__}: {path}")
assert not jar_build.have_sources(), "the installed package sees Scala sources"
jar = state_store_jar()
assert jar.is_relative_to(venv), f"state-store jar outside the venv: {jar}"
print(f"state-store jar: {jar} ({jar.stat().st_size} bytes)")
version = importlib.metadata.version("quorumstore")
assert version == quorumstore.__version__, (version, quorumstore.__version__)
EOF
quorumstore --version

free_ports() {  # free_ports N: the first of N consecutive free loopback ports
  "$venv_python" - "$1" <<'EOF'
import random
import socket
import sys

count = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(20000, 40000)
    try:
        for port in range(base, base + count):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(base)
    break
else:
    sys.exit("no free ports")
EOF
}

step "quorumstore demo (the main job)"
quorumstore demo --base-port "$(free_ports 3)" --work-dir "$work/demo" 2>"$work/demo.log" | tee "$work/demo.out" || {
  tail -40 "$work/demo.log"; exit 1; }
grep -q "streaming query finished: 3 micro-batches, state kept in quorumstore" "$work/demo.out"
grep -qE '^\|/clicks/ada *\|3 ' "$work/demo.out"

step "format(\"quorumstore\") with no quorumstore import (read, write, readStream, writeStream), against quorumstore standalone"
port="$(free_ports 1)"
quorumstore standalone --shards 2 --port "$port" --data-dir "$work/standalone" >"$work/standalone.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do
  grep -q "listening on" "$work/standalone.log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/standalone.log"; exit 1; }
  sleep 0.2
done
head -2 "$work/standalone.log"
cat > read_back.py <<'EOF'
"""A user's session: no quorumstore import; the format is found by PySpark's lookup."""

import sys

from pyspark.sql import SparkSession

address = sys.argv[1]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
rows = [("/fresh/a", "1"), ("/fresh/b", "2"), ("/fresh/c", "3")]
people = spark.createDataFrame(rows, "key string, value string")
people.write.format("quorumstore").option("address", address).option(
    "valueFormat", "string"
).mode("append").save()
read = (
    spark.read.format("quorumstore")
    .option("address", address)
    .option("valueFormat", "string")
    .load()
    .select("key", "value")
    .orderBy("key")
)
read.show()
assert [tuple(r) for r in read.collect()] == rows, read.collect()
print(f"read {len(rows)} rows back through format('quorumstore')")

# The change feed (readStream) and a streaming sink (writeStream), still with no import.
feed = (
    spark.readStream.format("quorumstore")
    .option("address", address)
    .option("startingOffsets", "earliest")
    .load()
    .writeStream.format("memory")
    .queryName("feed")
    .option("checkpointLocation", "checkpoints/feed")
    .trigger(availableNow=True)
    .start()
)
feed.awaitTermination(300)
changes = spark.sql("select key from feed where key like '/fresh/%'").count()
assert changes == len(rows), changes
print(f"readStream: {changes} changes from the change feed")
(
    spark.createDataFrame([(f"/streamed/{i}", str(i)) for i in range(4)], "key string, value string")
    .write.format("parquet")
    .save("streamed-input")
)
query = (
    spark.readStream.schema("key string, value string")
    .parquet("streamed-input")
    .writeStream.format("quorumstore")
    .option("address", address)
    .option("valueFormat", "string")
    .option("checkpointLocation", "checkpoints/sink")
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination(300)
streamed = (
    spark.read.format("quorumstore").option("address", address).load()
    .where("key like '/streamed/%'").count()
)
assert streamed == 4, streamed
print(f"writeStream: {streamed} rows written through the streaming sink")
spark.stop()
EOF
"$venv_python" read_back.py "127.0.0.1:$port" 2>"$work/read_back.log" || { tail -40 "$work/read_back.log"; exit 1; }
echo "fresh install: ok"
