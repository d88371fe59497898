"""Fault injection: SIGKILL a real pipeline run at random moments, resume it, and compare with an uninterrupted run.

Run (from the repository root, in the project's venv):

    python -m bench.faults                       # 5 killed runs, 2 rounds, seed 0 (about 20-35 minutes on 2 cores)
    python -m bench.faults --kills 2 --seed 3    # a quicker check
    python -m bench.faults --rounds 1 --max-kills-per-run 3 --keep
    python -m bench.faults --kills 20 --sigterms 5   # the scale check (hours on 2 cores; parts: --kills 4 --seed 1 ...)
    python -m bench.faults --kills 3 --in-step       # each kill waits for a checkpoint or finished part to exist

What it does, all under one temp folder (removed at the end unless --keep):

1. The reference: `python -m flows.cli run CONFIG` in a subprocess, uninterrupted, on configs/mini.yaml
   (rounds = --rounds), with a PREFECT_HOME of its own per run (ephemeral Prefect server, analytics off), a sqlite
   MLflow store and a runs dir in the temp folder. Its wall time T is the range of the kill moments.
2. A control (skip with --no-control): the same config uninterrupted under another run name. It tells whether CPU
   training is bit-reproducible here, so that a tensor difference after a kill can be blamed on the kill or not.
3. --kills times: the same config under another `run.name` (only the name differs, `run.seed` is the same; nothing
   in the pipeline is seeded by the run name or the run directory), SIGKILLed at a moment drawn uniformly from
   [0, T] (`random.Random(--seed)`), then rerun; each rerun is SIGKILLed again at a fresh moment if it is still
   running then, at most --max-kills-per-run kills per run, and finally rerun to completion.
   --sigterms times: the same, but sent SIGTERM once (what `timeout`, systemd and Kubernetes send): it must exit
   within 30 s with rc 143 and release its lock (docs/tracking.md, stopping), then is rerun to completion.
4. Every finished run is checked against the reference: the same shards (every column but `policy`, which holds a
   path; `policy` must name the run's own checkpoint), the same checkpoints (policy, reward_model/prm,
   reward_model/orm of every round; tensors compared with torch.equal, or the max abs difference when CPU training
   is not bit-reproducible, as the control shows), the same manifest phases, finished phases not redone after a
   kill, no leftover temp file or lock, and the same MLflow structure (one parent run of that name, one run per
   round, 4 phase runs per round, one registered version per round per RM kind and of the policy, tagged with the
   parent).

Resuming inside a phase (docs/concepts.md): the config checkpoints GRPO and the RMs every step (`save_steps: 1`)
and collects in parts of 2 prompts, so that a kill inside a phase finds work to resume from. With --in-step each
kill waits, from its moment on, until a trainer checkpoint or a finished collection part exists, and so lands
inside a phase with work saved. Every kill reports the work its resume did not redo: the step of the checkpoint
each training resumes from, the finished parts of a collection (`saved_work`).

Output: one row per kill (its moment, the phase being run when killed, read from the manifest right after the
kill: the phase whose MLflow run exists but is not recorded done, and the work a resume keeps), the verdict of its
run, and a last line `survived K of N kills` (N counts every SIGKILL, so N >= --kills when reruns are killed
again) with the steps and parts the resumes kept.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench._common import ROOT, mini_config
from pipeline.phases import PHASES

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

CHECKPOINTS = ("policy", "reward_model/prm", "reward_model/orm")
MAX_KILLS = 20
STOP_S = 30  # a SIGTERMed run must have exited by then (docs/tracking.md, stopping)
TIMING = re.compile(r"(_per_s|seconds|runtime)$")  # metrics that are timings, not results


# --- running one attempt --------------------------------------------------------------------------------


def env_for(work: Path, name: str) -> dict:
    home = work / "prefect" / name  # Prefect creates its home but not the folders above it
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING", "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    for var in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    return env


def saved_work(run_dir: Path) -> dict[str, int]:
    """What a resume of `run_dir` does not redo: per trainer scratch folder, the step of its newest whole
    checkpoint; per collection, its finished parts (`pipeline.resume`)."""
    from pipeline.rundir import last_checkpoint

    out = {}
    for scratch in sorted(run_dir.glob("round-*/**/.trainer-*")):
        if (ckpt := last_checkpoint(scratch)) is not None:
            out[f"{scratch.relative_to(run_dir)} steps"] = int(ckpt.name.split("-")[1])
    for parts in sorted(run_dir.glob("round-*/.collect-parts")):
        if n := len(list(parts.glob("part-*.json"))):
            out[f"{parts.relative_to(run_dir)}"] = n
    return out


def attempt(work: Path, name: str, config: Path, log: Path, kill_at: float | None, timeout: float,
            signum: int = signal.SIGKILL, in_step: Path | None = None) -> dict:
    """One `igrpo run`; send `signum` (SIGKILL: the fault) to its process at `kill_at` seconds if it still runs
    then (with `in_step`, a run directory: from then on, as soon as it holds work to resume, `saved_work`). A
    SIGTERM must stop it within STOP_S (`stop_seconds`); past that it is SIGKILLed. Returns what happened."""
    start = time.monotonic()
    stop_seconds = None
    with open(log, "ab") as out:
        out.write(f"\n=== attempt, {signal.Signals(signum).name} at {kill_at} ===\n".encode())
        out.flush()
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(config)], env=env_for(work, name),
                                cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        limit = kill_at if kill_at is not None else timeout
        try:
            proc.wait(timeout=limit)
            killed = False
        except subprocess.TimeoutExpired:
            while in_step is not None and proc.poll() is None and not saved_work(in_step):
                time.sleep(0.05)
            if proc.poll() is not None:  # ended on its own before any work was saved
                return {"killed": False, "timed_out": False, "rc": proc.returncode,
                        "seconds": time.monotonic() - start, "stop_seconds": None}
            proc.send_signal(signum)  # SIGKILL: the pipeline's own process, as the OOM killer would
            sent = time.monotonic()
            try:
                proc.wait(timeout=STOP_S if signum != signal.SIGKILL else None)
                stop_seconds = time.monotonic() - sent
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            killed = True
        finally:
            # Whatever it started (Prefect's ephemeral server) must not outlive it; they are ours to stop.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elapsed = time.monotonic() - start
    return {"killed": killed, "timed_out": killed and kill_at is None, "rc": proc.returncode, "seconds": elapsed,
            "stop_seconds": stop_seconds}


def read_manifest(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def manifest_mtime(run_dir: Path) -> int | None:
    try:
        return (run_dir / "manifest.json").stat().st_mtime_ns
    except OSError:
        return None


def phase_in_progress(manifest: dict | None, stale: bool) -> str:
    """The phase whose MLflow run exists but which is not recorded done (what the killed process was running)."""
    if manifest is None:
        return "startup (no manifest yet)"
    running = [k for k in manifest.get("mlflow", {}) if k.count("/") == 1 and k.split("/")[1] in PHASES
               and k not in manifest.get("phases", {})]
    done = sorted(manifest.get("phases", {}))
    if not running:
        return f"between phases (after {done[-1]})" if done else "startup (before round 0)"
    label = ", ".join(f"r{int(k[6:9])} {k.split('/')[1]}" for k in running)
    if stale:  # a rerun rewrites the manifest when its flow opens the run: this one had not got that far
        label += " (rerun still starting)"
    return label


# --- comparing a finished run with the reference --------------------------------------------------------


def compare_shards(ref_dir: Path, run_dir: Path, rounds: int) -> list[str]:
    from pipeline.replay import read_shard
    from pipeline.rundir import RunDir

    problems = []
    for r in range(rounds + 1):
        try:
            a, b = read_shard(RunDir(ref_dir).shard(r)), read_shard(RunDir(run_dir).shard(r))
        except (FileNotFoundError, ValueError) as e:
            problems.append(f"shard r{r}: {e}")
            continue
        strip = lambda rows: [{k: v for k, v in x.items() if k != "policy"} for x in rows]  # noqa: E731
        if len(a) != len(b):
            problems.append(f"shard r{r}: {len(b)} rows, reference {len(a)}")
        elif strip(a) != strip(b):
            bad = sum(x != y for x, y in zip(strip(a), strip(b)))
            problems.append(f"shard r{r}: {bad}/{len(a)} rows differ")
        own = str(run_dir / f"round-{r:03d}" / "policy")
        if {x["policy"] for x in b} != {own}:
            problems.append(f"shard r{r}: policy column {sorted({x['policy'] for x in b})} is not {own}")
    return problems


def compare_checkpoints(ref_dir: Path, run_dir: Path, rounds: int) -> tuple[list[str], list[str]]:
    """(missing or structurally different, tensor differences as 'rR kind: max |d| = x')."""
    import torch
    from safetensors.torch import load_file

    problems, diffs = [], []
    for r in range(rounds + 1):
        for kind in CHECKPOINTS:
            a, b = ref_dir / f"round-{r:03d}" / kind, run_dir / f"round-{r:03d}" / kind
            where = f"r{r} {kind}"
            if not (b / "igrpo.json").exists():
                problems.append(f"{where}: checkpoint missing or incomplete")
                continue
            fa = sorted(p.name for p in a.iterdir())
            fb = sorted(p.name for p in b.iterdir())
            if fa != fb:
                problems.append(f"{where}: files {fb}, reference {fa}")
                continue
            for f in fa:
                if f.endswith(".safetensors"):
                    ta, tb = load_file(a / f), load_file(b / f)
                    if set(ta) != set(tb):
                        problems.append(f"{where}/{f}: tensor names differ")
                        continue
                    worst = max((float((ta[k].double() - tb[k].double()).abs().max()) if ta[k].numel() else 0.0)
                                for k in ta if not torch.equal(ta[k], tb[k])) if any(
                        not torch.equal(ta[k], tb[k]) for k in ta) else None
                    if worst is not None:
                        diffs.append(f"{where}: max |d| = {worst:.3g}")
                elif (a / f).read_bytes() != (b / f).read_bytes():
                    problems.append(f"{where}/{f}: differs")
    return problems, diffs


def compare_manifests(ref: dict, run: dict, ref_dir: Path, run_dir: Path) -> tuple[list[str], list[str]]:
    """(phase set differences, phases whose recorded output differs besides paths and registry versions)."""
    problems, notes = [], []
    if set(ref["phases"]) != set(run["phases"]):
        missing = sorted(set(ref["phases"]) - set(run["phases"]))
        extra = sorted(set(run["phases"]) - set(ref["phases"]))
        problems.append(f"manifest phases: missing {missing}, extra {extra}")
    def norm(out: dict, d: Path) -> dict:  # paths made relative; no registry versions, no timings; NaN == NaN
        out = json.loads(json.dumps({k: v for k, v in out.items() if k != "versions"}).replace(str(d), "RUN"))
        out["metrics"] = {k: "nan" if isinstance(v, float) and math.isnan(v) else v
                          for k, v in out.get("metrics", {}).items() if not TIMING.search(k)}
        return out

    differ = [k for k in sorted(set(ref["phases"]) & set(run["phases"]))
              if norm(ref["phases"][k], ref_dir) != norm(run["phases"][k], run_dir)]
    if differ:
        notes.append(f"recorded outputs/metrics differ in {', '.join(differ)}")
    return problems, notes


def check_mlflow(uri: str, experiment: str, name: str, manifest: dict, rounds: int) -> list[str]:
    import mlflow
    from mlflow import MlflowClient

    from pipeline.tracking import PARENT_TAG, model_name

    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    problems = []
    parents = [r for r in runs if PARENT_TAG not in r.data.tags and r.info.run_name == name]
    if len(parents) != 1:
        problems.append(f"mlflow: {len(parents)} parent runs named {name}")
    if not parents:
        return problems
    parent = manifest["mlflow"]["parent"]
    if parent not in {p.info.run_id for p in parents}:
        problems.append("mlflow: the manifest's parent run is not among them")
    if client.get_run(parent).info.status != "FINISHED":
        problems.append(f"mlflow: parent run status {client.get_run(parent).info.status}")
    children = lambda pid: [r for r in runs if r.data.tags.get(PARENT_TAG) == pid]  # noqa: E731
    round_runs = children(parent)
    expected_rounds = [f"round-{r:03d}" for r in range(rounds + 1)]
    if sorted(r.info.run_name for r in round_runs) != expected_rounds:
        problems.append(f"mlflow: round runs {sorted(r.info.run_name for r in round_runs)}")
    for rr in round_runs:
        phases = sorted(r.info.run_name for r in children(rr.info.run_id))
        if phases != sorted(f"{rr.info.run_name}-{p}" for p in PHASES):
            problems.append(f"mlflow: {rr.info.run_name} phase runs {phases}")
        rm = [r for r in children(rr.info.run_id) if r.info.run_name.endswith("-reward_model")]
        subs = sorted(r.info.run_name for x in rm for r in children(x.info.run_id))
        if subs != sorted(f"{rr.info.run_name}-reward_model-{k}" for k in ("orm", "prm")):
            problems.append(f"mlflow: {rr.info.run_name} reward-model runs {subs}")
    for kind in ("prm", "orm", "policy"):
        versions = [v for v in client.search_model_versions(f"name='{model_name(experiment, name, kind)}'")
                    if v.tags.get("pipeline_run") == parent]
        got = sorted(v.tags.get("round") for v in versions)
        if got != [str(r) for r in range(rounds + 1)]:
            problems.append(f"mlflow: {kind} versions for rounds {got}")
    return problems


def leftovers(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob(".*"))


# --- main -----------------------------------------------------------------------------------------------


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=5, help=f"killed runs (1..{MAX_KILLS}; default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="run.rounds of the mini config (1..4; default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments (run.seed stays 0)")
    ap.add_argument("--sigterms", type=int, default=0,
                    help=f"runs SIGTERMed once at a random moment (0..{MAX_KILLS}; default 0), besides the killed ones")
    ap.add_argument("--max-kills-per-run", type=int, default=2, help="SIGKILLs at most per run (1..5; default 2)")
    ap.add_argument("--no-control", action="store_true", help="skip the second uninterrupted run")
    ap.add_argument("--in-step", action="store_true",
                    help="kill only once a trainer checkpoint or a collection part exists (inside a phase)")
    ap.add_argument("--workdir", help="folder for everything (default: a new temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args(argv)
    if not 0 <= args.kills <= MAX_KILLS or not 0 <= args.sigterms <= MAX_KILLS or args.kills + args.sigterms == 0:
        ap.error(f"--kills and --sigterms must be between 0 and {MAX_KILLS}, one of them at least 1")
    if not 1 <= args.rounds <= 4:
        ap.error("--rounds must be between 1 and 4")
    if not 1 <= args.max_kills_per_run <= 5:
        ap.error("--max-kills-per-run must be between 1 and 5")
    return args


def sigterm_problems(res: dict, run_dir: Path) -> tuple[str, list[str]]:
    """What a SIGTERMed attempt did wrong, if anything, and how it stopped (for the log line)."""
    if res["stop_seconds"] is None:
        return "", [f"SIGTERM did not stop it within {STOP_S} s"]
    problems = []
    # -15: it came before `igrpo` set its handlers up (interpreter start-up, imports), so Python's default action
    # ended it there, before anything was written: fine too.
    if res["rc"] not in (128 + signal.SIGTERM, -signal.SIGTERM):
        problems.append(f"SIGTERM: rc {res['rc']}, not {128 + signal.SIGTERM}")
    if (run_dir / ".lock").exists():
        problems.append("SIGTERM left the lock behind")
    return f" (stopped in {res['stop_seconds']:.1f}s, rc {res['rc']})", problems


def redone_after_kills(snapshots: list[tuple[str, dict | None]], final: dict) -> list[str]:
    """What was done at each kill (its manifest then) and is not kept as it was in the finished run."""
    problems = []
    for kid, snap in snapshots:
        redone = [k for k, v in (snap or {}).get("phases", {}).items() if final["phases"].get(k) != v]
        reused = [k for k, v in (snap or {}).get("mlflow", {}).items() if final["mlflow"].get(k) != v]
        if redone:
            problems.append(f"after kill {kid}: phases redone {redone}")
        if reused:
            problems.append(f"after kill {kid}: MLflow runs replaced {reused}")
    return problems


class Faults:
    """One session: the work folder, the mini config every run starts from, the uninterrupted reference run, and
    each run's kills and verdict."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.t0 = args, time.monotonic()
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="igrpo-faults-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(exist_ok=True)
        self.uri = f"sqlite:///{self.work / 'mlflow.db'}"
        base = mini_config(self.work)
        base["run"]["rounds"] = args.rounds
        base["tracking"]["tracking_uri"] = self.uri
        # Work to resume inside a phase wherever a kill lands: a checkpoint every training step, parts of 2 prompts.
        base["grpo"]["save_steps"] = 1
        base["reward_model"]["train_args"]["save_steps"] = 1
        base["collect"]["prompts_per_part"] = 2
        self.base, self.experiment = base, base["tracking"]["experiment"]
        self.runs_dir = Path(base["run"]["runs_dir"])
        self.ref_dir = self.runs_dir / "ref"
        self.seconds = self.timeout = self.ref_manifest = None  # the reference's, once it has run
        self.reproducible = None  # whether an uninterrupted rerun is bit-identical (the control), unknown without

    def config_for(self, name: str) -> Path:
        data = json.loads(json.dumps(self.base))
        data["run"]["name"] = name
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f}s] {msg}", flush=True)

    def uninterrupted(self, name: str, timeout: float) -> dict | None:
        """An uninterrupted run (the reference, the control); None, said, when it fails."""
        res = attempt(self.work, name, self.config_for(name), self.work / "logs" / f"{name}.log", None, timeout)
        if res["rc"] != 0:
            self.say(f"the {'reference' if name == 'ref' else name} run failed (rc {res['rc']}); "
                     f"see {self.work / 'logs' / f'{name}.log'}")
            return None
        return res

    def reference(self) -> bool:
        """The reference run: its wall time is the range of the kill moments."""
        if (ref := self.uninterrupted("ref", timeout=1800)) is None:
            return False
        self.seconds = ref["seconds"]
        self.say(f"reference: {self.seconds:.0f}s")
        self.ref_manifest = read_manifest(self.ref_dir)
        self.timeout = 3 * self.seconds + 300
        return True

    def control(self) -> bool:
        """The control run, and whether it is bit-identical to the reference (`reproducible`); False if it failed."""
        if (ctl := self.uninterrupted("control", self.timeout)) is None:
            return False
        lost, notes = self.verify("control", None)
        self.reproducible = not any(n.startswith("tensors differ") for n in notes) and not lost
        self.say(f"control: {ctl['seconds']:.0f}s, " + ("bit-identical to the reference" if self.reproducible else
                                                      "differs from the reference: " + "; ".join(lost + notes)))
        return True

    def verify(self, name: str, bitwise_reproducible: bool | None) -> tuple[list[str], list[str]]:
        """(what a finished run lost against the reference, notes that are no loss)."""
        run_dir, rounds = self.runs_dir / name, self.args.rounds
        manifest = read_manifest(run_dir)
        if manifest is None:
            return ["manifest missing"], []
        lost, notes = [], []
        p, n = compare_manifests(self.ref_manifest, manifest, self.ref_dir, run_dir)
        lost += p
        (lost if bitwise_reproducible else notes).extend(n)
        lost += compare_shards(self.ref_dir, run_dir, rounds)
        p, diffs = compare_checkpoints(self.ref_dir, run_dir, rounds)
        lost += p
        if diffs:
            if bitwise_reproducible:
                lost.append("tensors differ although an uninterrupted rerun is bit-identical: " + "; ".join(diffs))
            else:
                notes.append("tensors differ (" + ("CPU training not bit-reproducible here, see control"
                             if bitwise_reproducible is False else "bit-reproducibility unknown: no control")
                             + "): " + "; ".join(diffs))
        lost += check_mlflow(self.uri, self.experiment, name, manifest, rounds)
        left = leftovers(run_dir)
        if left:
            lost.append(f"left behind: {left}")
        return lost, notes

    def kill_and_resume(self, i: int, name: str, signum: int, max_kills: int, rng: random.Random, rows: list,
                        kept: list) -> tuple[list[str], list[str]]:
        """Run `name`, sending `signum` at random moments (at most `max_kills` times), rerun until it completes,
        then verify it; a row per kill goes to `rows`, the work its resume kept to `kept`. The run's verdict."""
        config, log = self.config_for(name), self.work / "logs" / f"{name}.log"
        run_dir = self.runs_dir / name
        kills, before, snapshots, lost_here = 0, None, [], []
        while True:
            kill_at = rng.uniform(0, self.seconds) if kills < max_kills else None
            res = attempt(self.work, name, config, log, kill_at, self.timeout, signum,
                          run_dir if self.args.in_step else None)
            if res["killed"] and not res["timed_out"]:
                kills += 1
                manifest, mtime = read_manifest(run_dir), manifest_mtime(run_dir)
                phase = phase_in_progress(manifest, stale=mtime is not None and mtime == before)
                saved = saved_work(run_dir)
                kept.append(saved)
                rows.append((f"{i}.{kills}", kill_at, phase + "".join(f"; kept {k} {v}" for k, v in saved.items()),
                             name))
                snapshots.append((f"{i}.{kills}", manifest))
                how = signal.Signals(signum).name
                if signum == signal.SIGTERM:
                    stopped, problems = sigterm_problems(res, run_dir)
                    how += stopped
                    lost_here += problems
                self.say(f"{name}: {how} at {kill_at:.1f}s during {phase}")
                before = mtime
                continue
            if res["timed_out"]:
                lost_here.append(f"rerun hung past {self.timeout:.0f}s")
            elif res["rc"] != 0:
                lost_here.append(f"rerun failed (rc {res['rc']}), see {log}")
            else:
                self.say(f"{name}: completed after {kills} kill(s), last attempt {res['seconds']:.0f}s")
            break
        if kills == 0:
            rows.append((f"{i}.0", None, "finished before the kill moment", name))
        if lost_here and not all(x.startswith("SIGTERM") for x in lost_here):
            return lost_here, []
        lost, notes = self.verify(name, self.reproducible)
        final = read_manifest(run_dir) or {"phases": {}, "mlflow": {}}
        return lost_here + lost + redone_after_kills(snapshots, final), notes

    def report(self, rows: list, kept: list[dict[str, int]], verdicts: dict) -> bool:
        """The table of kills and the last line; whether every kill survived."""
        a, seconds = self.args, self.seconds
        print()
        print(f"reference run: {seconds:.0f}s, {a.rounds} rounds; kill moments uniform over [0, {seconds:.0f}s], "
              f"seed {a.seed}")
        if self.reproducible is not None:
            print(f"control (uninterrupted rerun): {'bit-identical' if self.reproducible else 'NOT bit-identical'} "
                  "to the reference")
        print(f"{'kill':<6}{'moment (s)':>11}  {'phase when killed; work kept for the resume':<56}  result")
        survived = total = 0
        for kid, moment, phase, name in rows:
            lost, notes = verdicts[name]
            result = "survived" if not lost else "lost: " + "; ".join(lost)
            if notes:
                result += "  [note: " + "; ".join(notes) + "]"
            print(f"{kid:<6}{'-' if moment is None else f'{moment:.1f}':>11}  {phase:<56}  {result}")
            if moment is not None:
                total += 1
                survived += not lost
        print(f"wall time {time.monotonic() - self.t0:.0f}s; work folder {self.work}" + ("" if a.keep else " (removed)"))
        print(f"survived {survived} of {total} kills; their resumes kept "
              f"{sum(v for k in kept for key, v in k.items() if key.endswith('steps'))} training steps and "
              f"{sum(v for k in kept for key, v in k.items() if not key.endswith('steps'))} collection parts, "
              f"{sum(bool(k) for k in kept)} of {len(kept)} kills inside a phase with work saved")
        return survived == total


def main(argv=None) -> int:
    args = parse_args(argv)
    faults = Faults(args)
    faults.say(f"work folder {faults.work}")
    rng = random.Random(args.seed)
    if not faults.reference():
        return 1
    if not args.no_control and not faults.control():
        return 1
    rows = []  # (kill id, moment, phase and the work a resume keeps, run name)
    kept: list[dict[str, int]] = []  # per kill, what its resume did not redo (`saved_work`)
    plan = [(f"kill-{i}", signal.SIGKILL, args.max_kills_per_run) for i in range(1, args.kills + 1)]
    plan += [(f"term-{i}", signal.SIGTERM, 1) for i in range(1, args.sigterms + 1)]
    verdicts = {name: faults.kill_and_resume(i, name, signum, max_kills, rng, rows, kept)
                for i, (name, signum, max_kills) in enumerate(plan, start=1)}
    all_survived = faults.report(rows, kept, verdicts)
    if not args.keep and not args.workdir:
        shutil.rmtree(faults.work, ignore_errors=True)
    return 0 if all_survived else 1


if __name__ == "__main__":
    sys.exit(main())
