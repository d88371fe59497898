"""Does the quickstart learn? `configs/quickstart.yaml` as `igrpo run` runs it, on several seeds, each run's figures
kept (its rounds' metrics and eval.json's per-problem figures) in `docs/experiments/quickstart-seeds/`, and the
table of docs/results.md's "The quickstart learns" (issue 47, point 1), rebuilt with the credit study's section.

The test: the last round's Maj@8 above round 0's by at least 2 paired SE, per eval problem (`paired_difference`).
The units run pinned to the AVX2 kernels at 2 threads (as every study here, experiments/runner.py); `--native`
runs on the CPU's own kernels, kept apart (`quickstart-native-s<seed>`), to show the verdict does not hang on them.

  python -m experiments.quickstart_seeds                        # seeds 0 1 2, pinned
  python -m experiments.quickstart_seeds --native --seeds 0     # the CPU's own kernels
  python -m experiments.quickstart_seeds --report-only          # the section again, from the kept files
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench._common import ROOT, table
from experiments.report import mean_se, write_region
from experiments.runner import Experiments, restart_pinned, run_figures, stoppable
from pipeline.evaluate import paired_difference
from pipeline.loading import load_config
from pipeline.rundir import read_json

FIGURES = ROOT / "docs" / "experiments" / "quickstart-seeds"
KEY = "maj@8"


class Seeds(Experiments):
    """The runner's units (experiments/runner.py): one whole quickstart run per seed."""

    def config(self, seed: int, extra: list[str]):
        return load_config(ROOT / "configs" / "quickstart.yaml", self.base(seed) + extra)

    def run(self, name: str, seed: int) -> dict:
        from flows.iterative import iterative_rl

        iterative_rl(self.config(seed, [f"run.name={name}"]).model_dump(mode="json"))
        return run_figures(self.runs_dir / name)


def section(figures: Path = FIGURES) -> list[str]:
    """The region's lines: per run, round 0's and the last round's Maj@8, the gain paired per eval problem with its
    SE, and whether it clears 2 SE; then the gains' mean ± SE over the pinned seeds."""
    units = {p.stem: read_json(p) for p in sorted(figures.glob("*.json"))}
    if not units:
        return ["Not measured yet: `python -m experiments.quickstart_seeds`."]
    rows, gains, rounds = [], [], set()
    for name, u in units.items():
        pp = {int(r): m for r, m in u["per_problem"].items()}
        first, last = min(pp), max(pp)
        rounds.add((first, last))
        gain, se = paired_difference(pp[first][KEY], pp[last][KEY])
        if "native" not in name:
            gains.append(gain)
        kernels = re.search(r"(\w+) kernels", u["machine"])[1] + (" (native)" if "native" in u["machine"] else "")
        maj = [u["rounds"][str(r)][f"eval/{KEY}"] for r in (first, last)]
        rows.append([f"`{name}`", kernels, f"{maj[0]:.3f}", f"{maj[1]:.3f}", f"{gain:+.3f}", f"{se:.3f}",
                     f"{gain / se:+.1f}" if se else "-", "yes" if gain >= 2 * se and gain > 0 else "**no**",
                     f"{u['seconds'] / 60:.1f}"])
    (first, last), = rounds  # every run the same rounds
    commits = sorted({u["commit"] for u in units.values()})
    machines = sorted({u["machine"] for u in units.values()})
    n = len(next(iter(units.values()))["per_problem"][str(first)][KEY])
    spread = "{:+.3f} ± {:.3f} SE".format(*mean_se(gains)) if len(gains) > 1 else "one seed: no SE"
    return [f"Command: `python -m experiments.quickstart_seeds` (`igrpo run configs/quickstart.yaml` per seed), from "
            f"{', '.join(f'`{c}`' for c in commits)} on {'; '.join(machines)}. Maj@8 over the {n} eval problems; the "
            f"gain is round {last}'s minus round {first}'s, paired per problem, with its SE (the SD of the per-problem "
            "differences / sqrt(n)); minutes: the run's wall time, the machine's load included.", "",
            table(["run", "kernels", f"round {first}", f"round {last}", "gain", "paired SE", "gain / SE", ">= 2 SE",
                   "minutes"], rows), "",
            f"Gain over the {len(gains)} pinned seeds: {spread} (SE over seeds)."]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    restart_pinned("experiments.quickstart_seeds", argv)
    ap = argparse.ArgumentParser(prog="python -m experiments.quickstart_seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs-dir", default="runs/quickstart-seeds")
    ap.add_argument("--native", action="store_true", help="the CPU's own kernels and threads (units kept apart)")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    if not a.report_only:
        ex = Seeds(argparse.Namespace(runs_dir=a.runs_dir, figures=str(FIGURES), smoke=False,
                                      experiment="quickstart-seeds", tracking_uri=None))

        def work():
            for seed in a.seeds:
                name = f"quickstart-{'native-' if a.native else ''}s{seed}"
                ex.unit(name, lambda: ex.run(name, seed))

        stoppable("experiments.quickstart_seeds", work)
    results = ROOT / "docs" / "results.md"  # the region sits in the credit study's section, which remakes it too
    write_region(results, "quickstart-learns", "\n".join(section()) + "\n")
    print(f"report: {results}")


if __name__ == "__main__":
    main()
