"""`igrpo stack up` cold: the seconds from nothing (a new directory: initdb, both servers' migrations, a worker) to
every service answering; then `up` again (all running) and `down`. Issue 48's goal: cold <= 30 s.

Each repeat runs in a new temporary directory on free ports, as a user runs it (`python -m flows.cli stack up` in
a subprocess), and is stopped and removed afterwards. Needs the `[stack]` extra.

  python -m bench.stack_up               # one cold start
  python -m bench.stack_up --repeats 3   # the median and the spread
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(*args: str) -> float:
    """Wall seconds of `igrpo stack ARGS...`; its output shown only if it fails."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.cli", "stack", *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"igrpo stack {args[0]} failed:\n{done.stderr}")
    return time.perf_counter() - t0


def once() -> tuple[float, float, float]:
    """(cold up, up again, down) seconds in a new directory."""
    # Not under a folder only its owner may enter: as root, PostgreSQL runs as a user of its own.
    root = Path(tempfile.mkdtemp(prefix="igrpo-stack-bench-")) / "stack"
    ports = [f"--{name}-port={free_port()}" for name in ("postgres", "prefect", "mlflow")]
    try:
        cold = timed("up", "--dir", str(root), *ports)
        warm = timed("up", "--dir", str(root))
    finally:
        down = timed("down", "--dir", str(root))
        shutil.rmtree(root.parent)
    return cold, warm, down


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    runs = [once() for _ in range(args.repeats)]
    for i, (cold, warm, down) in enumerate(runs, 1):
        print(f"run {i}: stack up cold {cold:.1f} s, up again {warm:.1f} s, down {down:.1f} s")
    colds = [r[0] for r in runs]
    print(f"stack up cold: median {statistics.median(colds):.1f} s (min {min(colds):.1f}, max {max(colds):.1f}; "
          f"goal <= 30 s)")


if __name__ == "__main__":
    main()
