"""What one task report costs the ledger, by the task's distinct attempts (issue 54, point 5).

    .venv/bin/python -m bench.report_cost                           # this checkout, 50,000 attempts
    .venv/bin/python -m bench.report_cost --server-tree /work/main  # the same code path of another checkout

In a child process running the chosen tree's code: a SQLite ledger holding a task of one attempt and one of
`--attempts` distinct attempts (one row each, through the tree's own ledger batch insert, so its rollup is
there), then `BillingStore.task_report` of each, alternately, `--reads` times. Reported: the median of each
and their ratio (the many-attempt report over the one-attempt report, within the same run), which is
what a report costs per attempt whatever the machine's speed; and the rows per second the seeding wrote
(1,000-row batches, each row a new attempt: the rollup's worst case), for the write path's share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.harness import parser

# Run with the tree's PYTHONPATH: its own ledger insert and its own report.
_MEASURE = """
import json, statistics, sys, tempfile, time
from dataclasses import replace
from pathlib import Path
from billing import BillingStore, Database
from billing.ledger_sql import write_batch
from tests.billing.test_ledger import make_row
attempts, reads = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    db = Database(f"sqlite:///{Path(tmp) / 'fairserve.db'}")
    db.upgrade()
    began = time.perf_counter()
    for task, n in (("one", 1), ("many", attempts)):
        for start in range(0, n, 1000):
            rows = [replace(make_row(i), tenant_id="b", request_id=f"{task}-{i}", task_id=task, attempt=i)
                    for i in range(start, min(n, start + 1000))]
            write_batch(db.engine, rows)
    written = (attempts + 1) / (time.perf_counter() - began)
    store, took = BillingStore(db), {"one": [], "many": []}
    for _ in range(reads):
        for task in took:
            began = time.perf_counter()
            report = store.task_report("b", task_id=task)
            took[task].append(time.perf_counter() - began)
            assert report is not None
    db.dispose()
print(json.dumps({**{task: statistics.median(t) * 1e3 for task, t in took.items()}, "written": written}))
"""


def measure(tree: Path, attempts: int, reads: int) -> dict[str, float]:
    """Median milliseconds of the one-attempt and the many-attempt report, under `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-c", _MEASURE, str(attempts), str(reads)]
    out = subprocess.run(command, check=True, cwd=tree, env=env, capture_output=True, text=True).stdout
    medians: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return medians


def main(argv: list[str] | None = None) -> int:
    """Run and print the JSON report."""
    p = parser(
        __doc__,
        attempts=(50_000, "distinct attempts of the big task"),
        reads=(30, "reports of each task, alternating"),
        server_tree=(str(Path(__file__).resolve().parents[1]), "checkout whose ledger code runs"),
    )
    p.prog = "python -m bench.report_cost"
    args = p.parse_args(argv)
    tree = Path(args.server_tree).resolve()
    medians = measure(tree, args.attempts, args.reads)
    result = {
        "tree": str(tree),
        "attempts": args.attempts,
        "one_attempt_ms": round(medians["one"], 3),
        "many_attempts_ms": round(medians["many"], 3),
        "ratio": round(medians["many"] / medians["one"], 2),
        "rows_written_per_s": round(medians["written"]),  # the seeding, each row a new attempt
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
