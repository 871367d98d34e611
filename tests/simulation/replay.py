"""Replays one simulation seed, printing every event: the command a failure prints.

python tests/simulation/replay.py --seed 1234 --replicas 5 --steps 400
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from harness import InvariantViolation, SimConfig, run_seed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--quiet", action="store_true", help="print only the outcome")
    args = parser.parse_args()
    config = SimConfig(seed=args.seed, replicas=args.replicas, steps=args.steps)
    try:
        result = run_seed(config, trace=None if args.quiet else print)
    except InvariantViolation as failure:
        print(f"FAILED: {failure}")
        return 1
    print(
        f"ok: seed {result.seed}, {result.steps} steps, {result.writes} writes, committed {result.committed}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
