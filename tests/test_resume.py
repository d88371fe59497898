"""Resuming inside a phase (`pipeline/resume.py`): a training killed (SIGKILL) or stopped (SIGINT) at a seeded step
resumes from its last checkpoint and ends with the weights of a training never stopped, tensor by tensor; a
checkpoint of other work is never resumed from; half-written ones are dropped.

The killed trainings run in a subprocess (`KILLED`: a callback SIGKILLs its process, or sends it SIGINT under
`flows.signals.stop_on_signals`, as a step begins); the reference and the resume run in this process. Both at one
thread (`torch.set_num_threads(1)`, OMP_NUM_THREADS=1): CPU kernels are bitwise reproducible only at a fixed count.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.loading import config_from_dict
from pipeline.resume import StopAtStepBoundary, claim, fingerprint, generation_cycle, stop_at_step_boundary
from pipeline.rundir import STOP, keep_resumable, last_checkpoint, scratch_dir
from tests.helpers import SIZES, child_env, mini_config

# Runs one training (GRPO, or the PRM's) and kills or signals itself as step `at` + 1 begins (`at` steps done).
KILLED = """
import json, os, signal, sys, time
import torch
torch.set_num_threads(1)
from transformers import TrainerCallback
from flows.signals import stop_on_signals
from pipeline.loading import config_from_dict
what, config, args, at, signum = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
grace, slow = float(args.get("grace", 20)), float(args.get("step_seconds", 0))  # a step made to take `slow` s
class Kill(TrainerCallback):
    def on_step_begin(self, a, state, control, **kwargs):
        if state.global_step == at:
            os.kill(os.getpid(), signum)
        time.sleep(slow)
cfg = config_from_dict(json.loads(open(config).read()))
with stop_on_signals(grace) as stopper:
    try:
        if what == "grpo":
            from pipeline.policy import run_policy_phase
            from pipeline.problems import problem_set_from_config
            run_policy_phase(cfg, problem_set_from_config(cfg), args["policy"], args["out"], 1, args["rms"],
                             callbacks=[Kill()])
        else:
            from pipeline.reward_model import train_reward_model
            rows = json.loads(open(args["rows"]).read())
            train_reward_model(cfg, "prm", rows, args["policy"], args["out"], False, callbacks=[Kill()], round_index=0)
    except BaseException as e:
        sys.exit(stopper.exit_code(e))
"""


@contextlib.contextmanager
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    with _one_torch_thread():
        yield


def _killed(tmp_path, what: str, data: dict, args: dict, at: int, signum: int) -> subprocess.CompletedProcess:
    config = tmp_path / f"{what}.json"
    config.write_text(json.dumps(data))
    return subprocess.run([sys.executable, "-c", KILLED, what, str(config), json.dumps(args), str(at), str(signum)],
                          env=child_env(OMP_NUM_THREADS="1", TQDM_DISABLE="1"), capture_output=True, text=True,
                          timeout=300)


def _assert_same_weights(a: Path, b: Path) -> None:
    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert set(ta) == set(tb)
    differ = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert differ == [], f"tensors differ: {differ}"


def _grpo_config(tmp_path) -> dict:
    # 4 steps; a generation batch lasts 2 of them (steps_per_generation 2): a checkpoint is saved every step
    # (save_steps 1) but only at the end of a generation batch, so a kill as step 4 begins resumes from step 2.
    # Process supervision from an untrained PRM: its scores differ by step, so every step has advantages (the
    # untrained policy is never right: with the verifier alone every advantage is 0 and no weight would move).
    return mini_config(tmp_path, policy={"tiny": dict(SIZES["tiny"])}, supervision={"mode": "process"},
                       grpo={"learning_rate": 1e-3, "num_generations": 4, "per_device_train_batch_size": 8,
                             "steps_per_generation": 2, "max_steps": 4, "max_completion_length": 12,
                             "logging_steps": 1, "save_steps": 1})


@pytest.fixture(scope="module")
def grpo_reference(tmp_path_factory, tiny_dirs):
    """The uninterrupted GRPO training of `_grpo_config` (at one thread, as the killed ones), shared by the kills."""
    from pipeline.policy import run_policy_phase
    from pipeline.problems import problem_set_from_config

    where = tmp_path_factory.mktemp("grpo-reference")
    cfg = config_from_dict(_grpo_config(where))
    with _one_torch_thread():
        ref = run_policy_phase(cfg, problem_set_from_config(cfg), tiny_dirs / "policy", where / "ref" / "policy", 1,
                               {"prm": str(tiny_dirs / "prm")})
    with pytest.raises(AssertionError):  # it trained: the comparisons with it can fail
        _assert_same_weights(tiny_dirs / "policy", ref.policy_path)
    return ref


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "at", "resumed_from"), [(signal.SIGKILL, 3, 2), (signal.SIGINT, 1, 2), (signal.SIGINT, 3, 4)],
                         ids=["SIGKILL", "SIGINT", "SIGINT-last-step"])
def test_grpo_killed_at_a_step_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, tiny_dirs, grpo_reference,
                                                                             one_thread, signum, at, resumed_from):
    """SIGKILL as step 4 begins: the checkpoint of step 2 is resumed (step 3's was not saved: inside a generation
    batch). SIGINT as step 2 begins: the step ends, a generation batch with it, and there the run saves and exits
    130; the resume starts at step 3 on a fresh generation batch, as the uninterrupted run did. SIGINT in the last
    step: its checkpoint is saved, and the resume only saves the model."""
    from pipeline.policy import run_policy_phase
    from pipeline.problems import problem_set_from_config

    data = _grpo_config(tmp_path)
    cfg = config_from_dict(data)
    ps = problem_set_from_config(cfg)
    policy, rms, ref = tiny_dirs / "policy", {"prm": str(tiny_dirs / "prm")}, grpo_reference
    out = tmp_path / "run" / "policy"
    proc = _killed(tmp_path, "grpo", data, {"policy": str(policy), "out": str(out), "rms": rms}, at, signum)
    assert proc.returncode == (-signum if signum == signal.SIGKILL else 128 + signum), proc.stderr[-3000:]
    assert last_checkpoint(scratch_dir(out)).name == f"checkpoint-{resumed_from}"
    assert not out.exists()
    res = run_policy_phase(cfg, ps, policy, out, 1, rms)
    _assert_same_weights(ref.policy_path, res.policy_path)
    assert res.metrics == ref.metrics  # read from the log history, which the checkpoint carries
    assert not scratch_dir(out).exists()


def _prime_config(tmp_path) -> dict:
    # `_grpo_config` under PRIME's credit (issue 57's repro, shrunk to the kills' size): the implicit PRM updated online
    # on every generation batch (lr 1e-2: it moves at once), its token rewards and the verifier as the advantages.
    return {**_grpo_config(tmp_path), "collect": {"rollouts_per_step": 0},
            "supervision": {"mode": "process", "process_reward_model": "implicit", "process_reward": "prime"},
            "reward_model": {"kinds": ["implicit"], "implicit": {"online_lr": 1e-2}}}


@pytest.mark.slow  # two GRPO phases of 4 steps, one killed
def test_grpo_under_prime_killed_at_a_step_resumes_to_the_policy_and_prm_of_an_uninterrupted_run(tmp_path, tiny_dirs,
                                                                                               one_thread):
    """The online-updated PRM is in GRPO's checkpoints and saved with the phase: SIGKILL as step 4 begins, the resume
    from step 2's checkpoint ends with every tensor of the uninterrupted run's policy and PRM (before, the PRM restarted
    un-updated, and it was not saved at all)."""
    from models import char_tokenizer, load_policy
    from pipeline.policy import run_policy_phase
    from pipeline.problems import problem_set_from_config
    from pipeline.rm_kinds.loading import save_reward_model

    prm, _ = load_policy(str(tiny_dirs / "policy"))  # pi_phi = pi_ref at the start, as the RM phase makes it
    implicit = save_reward_model(prm, char_tokenizer(), tmp_path / "implicit", "implicit",
                                 meta={"reference": str(tiny_dirs / "policy"), "beta": 0.05})
    data = _prime_config(tmp_path)
    cfg = config_from_dict(data)
    ps, policy, rms = problem_set_from_config(cfg), tiny_dirs / "policy", {"implicit": str(implicit)}
    ref = run_policy_phase(cfg, ps, policy, tmp_path / "ref" / "policy", 1, rms)
    assert set(ref.online_reward_models) == {"implicit"}
    with pytest.raises(AssertionError):  # the PRM was updated: the comparison below can fail
        _assert_same_weights(implicit, ref.online_reward_models["implicit"])

    out = tmp_path / "run" / "policy"
    proc = _killed(tmp_path, "grpo", data, {"policy": str(policy), "out": str(out), "rms": rms}, 3, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    checkpoint = last_checkpoint(scratch_dir(out))
    assert checkpoint.name == "checkpoint-2" and (checkpoint / "online_scorer.safetensors").is_file()
    res = run_policy_phase(cfg, ps, policy, out, 1, rms)
    _assert_same_weights(ref.policy_path, res.policy_path)
    _assert_same_weights(ref.online_reward_models["implicit"], res.online_reward_models["implicit"])
    assert res.online_reward_models["implicit"] == out.parent / "policy-online-implicit"
    assert res.metrics == ref.metrics


def _prm_rows(cfg) -> list[dict]:
    from pipeline.problems import problem_set_from_config
    from pipeline.problems.arithmetic import answer_slip

    ps = problem_set_from_config(cfg)
    rows = []
    for p in ps.train[:12]:
        for j, text in enumerate([p.solution, answer_slip(p.solution)]):
            gold = ps.gold_step_labels(text, p)
            rows.append({"round": 0, "prompt_id": p.id, "prompt": p.prompt, "sample_index": j, "completion": text,
                         "outcome": int(ps.is_correct(text, p)), "he_labels": gold,
                         "se_labels": [float(g) for g in gold], "steps": text.split("\n")})
    return rows


@pytest.mark.slow
def test_rm_training_killed_at_a_step_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, tiny_policy_dir,
                                                                                   one_thread):
    """24 rows, 4 a step: 6 steps, a checkpoint every 2; SIGKILL as step 6 begins resumes from step 4."""
    from pipeline.reward_model import train_reward_model

    data = mini_config(tmp_path, policy={"tiny": dict(SIZES["tiny"])}, reward_model={"train_args": {
        "learning_rate": 1e-3, "num_train_epochs": 1, "per_device_train_batch_size": 4, "save_steps": 2}})
    cfg = config_from_dict(data)
    rows = _prm_rows(cfg)
    ref = train_reward_model(cfg, "prm", rows, tiny_policy_dir, tmp_path / "ref" / "prm", False, round_index=0)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    out = tmp_path / "run" / "prm"
    proc = _killed(tmp_path, "prm", data, {"policy": str(tiny_policy_dir), "out": str(out),
                                          "rows": str(tmp_path / "rows.json")}, 5, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert last_checkpoint(scratch_dir(out)).name == "checkpoint-4"
    path = train_reward_model(cfg, "prm", rows, tiny_policy_dir, out, False, round_index=0)
    _assert_same_weights(ref, path)
    assert not scratch_dir(out).exists()


@pytest.mark.slow
def test_a_stop_in_a_step_longer_than_the_grace_still_saves_that_steps_checkpoint(tmp_path, tiny_policy_dir,
                                                                                  one_thread):
    """A real model's step on a CPU outlasts the stop's grace (SmolLM2's GRPO: ~20 s a step, 20 s of grace): the
    SIGTERM comes as step 3 begins, each step takes 1.5 s, the grace is 1 s. The step still ends and saves its
    checkpoint, and the process exits on its own, 128 + the signal; it used to exit at once, `grace` after the
    signal, and the resume started from the periodic checkpoint of step 2, a step lost (every step since the
    last periodic save, on a real run)."""
    data = mini_config(tmp_path, policy={"tiny": dict(SIZES["tiny"])}, reward_model={"train_args": {
        "learning_rate": 1e-3, "num_train_epochs": 1, "per_device_train_batch_size": 4, "save_steps": 2}})
    rows = _prm_rows(config_from_dict(data))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    out = tmp_path / "run" / "prm"
    proc = _killed(tmp_path, "prm", data, {"policy": str(tiny_policy_dir), "out": str(out),
                                          "rows": str(tmp_path / "rows.json"), "grace": 1.0, "step_seconds": 1.5},
                   2, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "stopped at once" not in proc.stderr, proc.stderr[-3000:]
    assert "the training step in flight ends and saves a checkpoint first" in proc.stderr
    assert last_checkpoint(scratch_dir(out)).name == "checkpoint-3"


# --------------------------------------------------------------------------------------- without training


def test_a_checkpoint_of_other_work_is_deleted_not_resumed(tmp_path, caplog):
    cfg = config_from_dict(mini_config(tmp_path), check_trl=False)
    scratch = tmp_path / ".trainer-policy"
    mine = fingerprint(cfg, "policy", 1, policy="p")
    assert claim(scratch, mine) is False  # new
    (scratch / "checkpoint-3").mkdir()
    (scratch / "checkpoint-3" / "trainer_state.json").write_text("{}")
    assert claim(scratch, mine) is True and last_checkpoint(scratch).name == "checkpoint-3"
    other = config_from_dict(mini_config(tmp_path, grpo={"learning_rate": 1.0}), check_trl=False)
    for theirs in (fingerprint(other, "policy", 1, policy="p"), fingerprint(cfg, "policy", 2, policy="p"),
                   fingerprint(cfg, "collect", 1, policy="p")):
        assert theirs != mine
    with caplog.at_level("WARNING", logger="pipeline.resume"):
        assert claim(scratch, fingerprint(cfg, "policy", 2, policy="p")) is False
    assert last_checkpoint(scratch) is None and "deleted, not resumed" in caplog.text
    # Fields that change nothing a phase computes (more rounds, the tracking store) keep its checkpoints.
    same = config_from_dict(mini_config(tmp_path, run={"rounds": 7}, tracking={"experiment": "x"}), check_trl=False)
    assert fingerprint(same, "policy", 1, policy="p") == mine


def test_half_written_checkpoints_and_empty_scratch_are_dropped(tmp_path):
    round_dir = tmp_path / "round-001"
    whole, half, empty = round_dir / ".trainer-policy", round_dir / "reward_model" / ".trainer-prm", round_dir / ".trainer-x"
    for path in (whole / "checkpoint-2", whole / "checkpoint-4", half / "checkpoint-1", empty):
        path.mkdir(parents=True)
    (whole / "checkpoint-2" / "trainer_state.json").write_text("{}")  # checkpoint-4: killed while saving it
    keep_resumable(round_dir)
    assert last_checkpoint(whole).name == "checkpoint-2" and not (whole / "checkpoint-4").exists()
    assert not half.exists() and not empty.exists()


def test_a_checkpoint_cut_before_a_checkpointed_state_was_saved_is_not_resumed(tmp_path, caplog):
    """transformers writes a checkpoint's trainer state, then `on_save` runs: a kill between them leaves a checkpoint
    whole to `last_checkpoint` but without what a `CheckpointedState` (PRIME's online PRM) writes. It is deleted, and
    the one before it, whole, is resumed; with none, the phase starts over rather than resume an un-updated PRM."""
    from pipeline.resume import CheckpointedState, resumable_checkpoint

    class Prm(CheckpointedState):
        name = "online_scorer.safetensors"

    scratch = tmp_path / ".trainer-policy"
    for step in (2, 4):
        (scratch / f"checkpoint-{step}").mkdir(parents=True)
        (scratch / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (scratch / "checkpoint-2" / "online_scorer.safetensors").write_bytes(b"")  # checkpoint-4: cut before on_save
    with caplog.at_level("WARNING", logger="pipeline.resume"):
        assert resumable_checkpoint(scratch, [Prm()]).name == "checkpoint-2"
    assert not (scratch / "checkpoint-4").exists() and "without online_scorer.safetensors" in caplog.text
    (scratch / "checkpoint-2" / "online_scorer.safetensors").unlink()
    assert resumable_checkpoint(scratch, [Prm()]) is None and last_checkpoint(scratch) is None
    (scratch / "checkpoint-6").mkdir()
    (scratch / "checkpoint-6" / "trainer_state.json").write_text("{}")
    assert resumable_checkpoint(scratch, []).name == "checkpoint-6"  # no such state: transformers' own checkpoints


class _State:
    def __init__(self, step, max_steps=10):
        self.global_step, self.max_steps = step, max_steps


class _Control:
    should_save = should_training_stop = False


@pytest.mark.parametrize(("step", "stop", "saves", "stops"), [
    (4, False, True, False),  # a periodic save at the end of a generation batch
    (3, False, False, False),  # inside one: skipped
    (3, True, False, False),  # told to stop inside one: goes on to its end
    (4, True, True, True),  # and there saves and stops
    (10, False, False, False),  # the last step: the phase saves the model itself
    (10, True, True, True),  # unless told to stop there: the resume then only saves the model
])
def test_saves_and_stops_only_at_a_generation_batch_boundary(step, stop, saves, stops):
    control = _Control()
    control.should_save = True  # as transformers' flow callback set it
    try:
        if stop:
            STOP.set()
        StopAtStepBoundary(cycle=2).on_step_end(None, _State(step), control)
    finally:
        STOP.clear()
    assert (control.should_save, control.should_training_stop) == (saves, stops)


class _Bridged(BaseException):
    """What the handler before raises (Prefect's SIGTERM bridge: TerminationSignal)."""


def test_a_signal_deferred_to_the_step_boundary_then_reaches_its_own_handler():
    # Prefect's bridge raises TerminationSignal, which a worker's cancel needs for the flow run to end CANCELLED (the
    # KeyboardInterrupt raised in its place before ended it CRASHED: tests/test_stack.py's cancel in round 1's GRPO).
    def bridge(signum, frame):
        raise _Bridged(signum)

    previous = signal.signal(signal.SIGTERM, bridge)
    try:
        with pytest.raises(_Bridged), stop_at_step_boundary():
            signal.raise_signal(signal.SIGTERM)
            assert STOP.is_set()  # deferred: the trainer goes on to its step's end and saves there
        assert signal.getsignal(signal.SIGTERM) is bridge
    finally:
        signal.signal(signal.SIGTERM, previous)
        STOP.clear()


def test_generation_cycle_in_optimizer_steps():
    from types import SimpleNamespace as A

    assert generation_cycle(A(gradient_accumulation_steps=4)) == 1  # not GRPO
    assert generation_cycle(A(steps_per_generation=4, num_iterations=1, gradient_accumulation_steps=4)) == 1
    assert generation_cycle(A(steps_per_generation=2, num_iterations=2, gradient_accumulation_steps=1)) == 4
    assert generation_cycle(A(steps_per_generation=4, num_iterations=1, gradient_accumulation_steps=6)) == 2


@pytest.mark.slow  # three collections of 2-3 parts
def test_a_collection_stopped_after_a_part_resumes_after_it_to_the_same_shard(tmp_path, tiny_policy_dir,
                                                                            monkeypatch):
    """6 prompts in parts of 2: stopped while labelling part 2, the resume reads part 1 back and collects parts 2
    and 3 only, to the shard of a collection never stopped (each part seeded by its index, not by its turn)."""
    from pipeline import collect
    from pipeline.problems import problem_set_from_config
    from pipeline.replay import read_shard
    from pipeline.rundir import RunDir

    cfg = config_from_dict(mini_config(tmp_path, collect={"prompts_per_part": 2}), check_trl=False)
    ps = problem_set_from_config(cfg)
    ref = collect.run_collection_phase(cfg, ps, tiny_policy_dir, tmp_path / "ref", 1)
    real, calls = collect.collect_part, []

    def stopped_in_part_2(*args, **kwargs):
        calls.append(args[-1])  # its seed
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(collect, "collect_part", stopped_in_part_2)
    run = RunDir(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        collect.run_collection_phase(cfg, ps, tiny_policy_dir, run.root, 1)
    assert sorted(p.name for p in run.collect_parts(1).iterdir()) == ["igrpo-fingerprint.json", "part-00000.json"]
    assert not run.shard(1).exists()
    res = collect.run_collection_phase(cfg, ps, tiny_policy_dir, run.root, 1)
    assert calls[2:] == calls[1:2] + [calls[1] + collect.PART_SEED_STRIDE]  # parts 2 (again) and 3, not part 1
    assert read_shard(res.shard_path) == read_shard(ref.shard_path)
    timings = ("_per_s",)
    assert ({k: v for k, v in res.metrics.items() if not k.endswith(timings)}
            == {k: v for k, v in ref.metrics.items() if not k.endswith(timings)})
    assert not run.collect_parts(1).exists()


def test_the_rms_checkpoint_once_an_epoch_unless_save_steps_is_given(tmp_path):
    """Every 25 short RM steps cost the quickstart's RM phase 8% of its time: the RMs save once an epoch by default,
    every `save_steps` where the config gives it; GRPO keeps its every 25 steps."""
    from pipeline.loading import config_from_dict
    from pipeline.passthrough import grpo_config, rm_training_config

    cfg = config_from_dict({}, check_trl=False)
    assert str(rm_training_config(cfg, str(tmp_path)).save_strategy) in ("epoch", "SaveStrategy.EPOCH")
    assert grpo_config(cfg, str(tmp_path)).save_steps == 25
    cfg = config_from_dict({"reward_model": {"train_args": {"save_steps": 7}}}, check_trl=False)
    args = rm_training_config(cfg, str(tmp_path))
    assert str(args.save_strategy) in ("steps", "SaveStrategy.STEPS") and args.save_steps == 7


def test_a_phase_stopped_under_the_release_before_resumes_its_checkpoints_after_the_upgrade():
    # Pinned: the fingerprints 573db0d wrote into scratch folders (before the RM kinds' sections and PRIME's fields).
    # A field added to the config changes them unless it joins pipeline.resume._ADDED: a stopped phase's checkpoints
    # would be deleted as another config's.
    from pipeline.config import PipelineConfig
    from pipeline.loading import load_config

    root = Path(__file__).resolve().parent.parent / "configs"
    assert fingerprint(PipelineConfig(), "policy", 1, policy="p") == "536aa3c000cb1a1badf4"
    quickstart = load_config(root / "quickstart.yaml", ["supervision.mode=process"])  # 573db0d's quickstart
    assert fingerprint(quickstart, "policy", 1, policy="p") == "8f65449d6d58935b2ac6"
    arith = load_config(root / "smollm2-arith.yaml", [  # 573db0d's budgets and dtype (issue 58 changed them)
        "policy.dtype=float32", "reward_model.dtype=float32", "bootstrap.sft_args.max_steps=30",
        "supervision.prompts_per_round=48", "grpo.max_steps=24", "collect.prompts_per_round=24",
        "reward_model.train_args.num_train_epochs=2"])
    assert fingerprint(arith, "reward_model", 2, policy="p") == "3ce622b2d97ee26f7d5f"
    # What a kind's section or a new field holds still counts, where it is set.
    base = fingerprint(PipelineConfig(), "policy", 1, policy="p")
    assert fingerprint(PipelineConfig(reward_model={"orm": {"loss": "pairwise"}}), "policy", 1, policy="p") != base
    from pipeline.resume import _as_fingerprinted

    kept = _as_fingerprinted({"supervision": {"prime_outcome_coef": 1.0, "prime_process_coef": 5.0}})
    assert kept["supervision"] == {"prime_outcome_coef": 1.0}
    online_mc = {"oracle": "mc", "mc_rollouts": 4}  # K at its default is left out, as the older release had no K
    assert _as_fingerprinted({"reward_model": online_mc})["reward_model"] == {"oracle": "mc"}
    assert fingerprint(PipelineConfig(reward_model={**online_mc, "mc_rollouts": 8}), "policy", 1, policy="p") != \
        fingerprint(PipelineConfig(reward_model=online_mc), "policy", 1, policy="p")
