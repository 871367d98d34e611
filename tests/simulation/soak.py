"""Runs a range of simulation seeds, longer than CI's, and prints each failure's replay command.

python tests/simulation/soak.py --first 100000 --count 20000 --steps 1200

CI runs seeds 0-1999 at 400 steps. Longer schedules over more seeds reach rarer
interleavings: a restarted leader re-leading its own term needed 1200 steps and about
4,500 seeds (tests/simulation/test_simulation.py, RELEAD_SEED). Seeds alternate between
3- and 5-replica shards. Progress is printed every --every seeds; the exit status is 1
when any seed failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from harness import InvariantViolation, SimConfig, run_seed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=100_000, help="first seed")
    parser.add_argument("--count", type=int, default=10_000, help="how many seeds")
    parser.add_argument("--steps", type=int, default=1200, help="steps per schedule")
    parser.add_argument("--every", type=int, default=500, help="seeds between progress lines")
    args = parser.parse_args()
    if args.count < 1 or args.steps < 1 or args.every < 1:
        parser.error("--count, --steps and --every must be positive")
    # The coordinator logs every simulated election; thousands of seeds would drown the output.
    logging.disable(logging.CRITICAL)
    started = time.monotonic()
    failed = 0
    for done, seed in enumerate(range(args.first, args.first + args.count), start=1):
        config = SimConfig(seed=seed, replicas=5 if seed % 2 == 0 else 3, steps=args.steps)
        try:
            run_seed(config)
        except InvariantViolation as failure:
            failed += 1
            print(f"FAILED {failure}", flush=True)
        if done % args.every == 0 or done == args.count:
            print(
                f"{done}/{args.count} seeds, {failed} failed, {time.monotonic() - started:.0f} s",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
