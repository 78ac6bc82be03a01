"""When did each tune first come within 3% of its final (benchmarked) time?

    python benchmarks/tuning_time.py RESULTS_DIR

RESULTS_DIR holds bench.json and the Optuna studies of the tunes (nochecks.db, checks.db,
SQLite, as written by `tune --storage sqlite:///...`). For each shape and mode: the
benchmarked time of the cached kernel, the search's best, and the first trial (with its
time from the study's start) whose timing was within 3% of the benchmarked one; "only
after re-timing" when the search timed the winner slow and the finalists' second look
found it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:])[0])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bench = {r["shape"]: r for r in json.loads((folder / "bench.json").read_text())["rows"]}
    for mode in ("nochecks", "checks"):
        url = f"sqlite:///{folder / (mode + '.db')}"
        for summary in optuna.get_all_study_summaries(url):
            study = optuna.load_study(study_name=summary.study_name, storage=url)
            shape = summary.study_name.split(":")[2]
            final = bench[shape][mode]["seconds"]
            trials = sorted(
                (t for t in study.trials if t.datetime_start), key=lambda t: t.datetime_start
            )
            start = trials[0].datetime_start
            best = min(t.value for t in trials if t.value)
            hit = next((t for t in trials if t.value and t.value <= 1.03 * final), None)
            when = (
                f"trial {hit.number} at {(hit.datetime_complete - start).total_seconds():.1f} s"
                if hit
                else "only after re-timing"
            )
            print(
                f"{mode:8} {shape:16} final {final * 1e3:7.3f} ms, search best "
                f"{best * 1e3:7.3f} ms, within 3%: {when}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
