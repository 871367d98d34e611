"""The main job, as `quorumstore demo` runs it from the installed package.

    python examples/main_job.py [--base-port 6648] [--work-dir DIR]

Its code is quorumstore/spark/demo.py: a hosted cluster (`quorumstore.spark.start`), the
state store (`quorumstore.spark.state_store.spark_confs`) and the `quorumstore` format.
"""

import sys

from quorumstore.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
