"""`igrpo compare`: Pass@K / Maj@K / greedy and best-of-N per round of several pipeline runs, and a Fig. 7-style
plot."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.evaluate import paired_difference, plot_pass_maj
from pipeline.rundir import read_json


def rounds_from_run_dir(run_dir: Path) -> dict[int, dict[str, float]]:
    """round -> eval metrics (`greedy`, `pass@K`, `maj@K`, best-of-N's `bon/<what>@N`) from each round's eval.json."""
    out = {}
    for path in sorted(run_dir.glob("round-*/eval.json")):
        try:
            data = read_json(path)
            bon = {k: v for k, v in data["metrics"].items() if k.startswith("bon/")}
            out[int(data["round"])] = {"greedy": data["metrics"]["eval/greedy"], **data["curve"], **bon}
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, or not an eval phase's JSON
            raise ValueError(f"{path}: damaged ({type(e).__name__}: {e}); restore it, or redo that eval phase: "
                             f"`igrpo run CONFIG --redo {path.parent.name}/eval`") from None
    if not out:
        raise FileNotFoundError(f"{run_dir}: no round-*/eval.json: not a run directory, or no round evaluated yet")
    return out


def round_gain(run_dir: Path, label: str, metric: str = "maj@8") -> str:
    """One line: the last round's `metric` (Maj@8, else the largest Maj@K evaluated) against the first round's,
    paired per eval problem: the mean gain and its SE (`paired_difference`). Empty with one round, or where an
    eval.json has no per-problem figures (written before they were kept)."""
    found = {}
    for path in run_dir.glob("round-*/eval.json"):
        data = read_json(path)
        if isinstance(data, dict) and isinstance(data.get("per_problem"), dict):
            found[int(data["round"])] = data["per_problem"]
    if len(found) < 2:
        return ""
    first, last = found[min(found)], found[max(found)]
    if metric not in first or metric not in last:
        majs = sorted((int(k.split("@")[1]) for k in first if k.startswith("maj@") and k in last), reverse=True)
        if not majs:
            return ""
        metric = f"maj@{majs[0]}"
    gain, se = paired_difference(first[metric], last[metric])
    ratio = f" ({gain / se:+.1f} SE)" if se else ""  # no spread: every problem moved alike (often not at all)
    return (f"{label}: {metric} round {max(found)} - round {min(found)} = {gain:+.3f}, paired SE {se:.3f} over "
            f"{len(first[metric])} eval problems{ratio}")


_RUN_ID = re.compile(r"[0-9a-f]{32}")  # MLflow's run ids: uuid4 hex
# The metrics of the parent run that `rounds_from_run_dir` reads, by their keys (`tracking.metric_key` of MLflow's
# names: '@' is spelled `_at_` there, and the headline figures have a section of their own).
_COMPARED = re.compile(r"eval/(greedy|pass@\d+|maj@\d+)|(bon/\w+@\d+)")


def rounds_from_mlflow(run_id: str, tracking_uri: str | None) -> dict[int, dict[str, float]]:
    """round -> eval metrics from the cross-round metrics of an MLflow parent run."""
    import mlflow
    from mlflow import MlflowClient

    from pipeline import tracking

    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"{run_id!r} is neither a run directory (no such path) nor an MLflow run id (32 hex digits)")
    uri = tracking_uri or mlflow.get_tracking_uri()
    tracking.probe(uri, "", must_exist=True)  # a missing store is an error, not a new empty one
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except mlflow.exceptions.MlflowException as e:
        raise ValueError(f"MLflow run {run_id} not found at {uri} ({e.message.splitlines()[0]}); "
                         "give --tracking-uri where it was logged") from None
    out: dict[int, dict[str, float]] = {}
    for name in run.data.metrics:
        m = _COMPARED.fullmatch(tracking.metric_key(name))
        if m:
            for point in client.get_metric_history(run_id, name):
                out.setdefault(point.step, {})[m.group(1) or m.group(2)] = point.value
    if not out:
        raise ValueError(f"MLflow run {run_id} has no eval/* metrics: is it a pipeline (parent) run?")
    return out


def _ks(metrics: dict[str, float]) -> list[int]:
    return sorted(int(k.split("@")[1]) for k in metrics if k.startswith("pass@"))


def compare(runs: list[str], out: str | Path = "compare.png", tracking_uri: str | None = None) -> tuple[str, Path]:
    """The text tables (`tables_text`) and a plot of round 0 against the last round of each run."""
    tables, curves, gains = [], {}, []
    for ref in runs:
        path = Path(ref)
        per_round = rounds_from_run_dir(path) if path.exists() else rounds_from_mlflow(ref, tracking_uri)
        label = path.name if path.exists() else ref[:8]
        tables.append((label, per_round))
        gains.append(round_gain(path, label) if path.exists() else "")
        first, last = min(per_round), max(per_round)
        for r in sorted({first, last}):
            curves[f"{label} round {r}"] = {k: v for k, v in per_round[r].items() if k.startswith(("pass@", "maj@"))}
    return "\n\n".join([tables_text(tables), *filter(None, gains)]), plot_pass_maj(curves, out)


def tables_text(tables: list[tuple[str, dict[int, dict[str, float]]]]) -> str:
    """`rounds_table`, then `best_of_n_table` where any round has best-of-N figures."""
    bon = best_of_n_table(tables)
    return rounds_table(tables) + (f"\n\n{bon}" if bon else "")


def _aligned(header: list[str], rows: list[list[str]], widths: list[int]) -> list[str]:
    """Text lines of `header` and `rows`: the first column left-aligned, the others right-aligned, each at least its
    `widths` entry and one character wider than its longest cell, so that no two cells run together."""
    widths = [max(w, *(len(c) + 1 for c in col)) for w, col in zip(widths, zip(header, *rows))]
    return [row[0].ljust(widths[0]) + "".join(c.rjust(w) for c, w in zip(row[1:], widths[1:]))
            for row in [header, *rows]]


def rounds_table(tables: list[tuple[str, dict[int, dict[str, float]]]]) -> str:
    """One row per (run label, round): greedy, then Pass@K and Maj@K for every K any run has ('-' where absent)."""
    ks = sorted({k for _, pr in tables for m in pr.values() for k in _ks(m)})
    cols = ["greedy"] + [f"{m}@{k}" for k in ks for m in ("pass", "maj")]
    rows = [[label, str(r), *(f"{m[c]:.3f}" if c in m else "-" for c in cols)]
            for label, per_round in tables for r, m in sorted(per_round.items())]
    return "\n".join(_aligned(["run", "round", *cols], rows, [24, 6] + [10] * len(cols)))


_BASELINES = ("majority", "random")  # best-of-N's picks that use no RM: after the RMs' columns


def best_of_n_table(tables: list[tuple[str, dict[int, dict[str, float]]]]) -> str:
    """One row per (run label, round, N): each RM's best-of-N and weighted vote, majority, random ('-' where absent).

    Empty when no round has a `bon/<what>@N` figure. The RMs' columns are sorted by kind, each pick before its
    `_vote`, so a run directory and its MLflow run (whose metrics come back in any order) print alike.
    """
    found = {tuple(k.removeprefix("bon/").split("@")) for _, pr in tables for m in pr.values() for k in m
             if k.startswith("bon/")}
    if not found:
        return ""
    what = sorted({w for w, _ in found}, key=lambda w: (_BASELINES.index(w) + 1 if w in _BASELINES else 0,
                                                        w.removesuffix("_vote"), w.endswith("_vote")))
    ns = sorted({int(n) for _, n in found})
    rows = []
    for label, per_round in tables:
        for r, m in sorted(per_round.items()):
            for n in ns:
                cells = [m.get(f"bon/{w}@{n}") for w in what]
                if any(c is not None for c in cells):
                    rows.append([label, str(r), str(n), *("-" if c is None else f"{c:.3f}" for c in cells)])
    return "\n".join(["best-of-N among the first N samples (<kind>: the RM's top pick; <kind>_vote: its weighted vote)",
                      *_aligned(["run", "round", "N", *what], rows, [24, 6, 5] + [10] * len(what))])
