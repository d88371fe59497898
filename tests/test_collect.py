"""Collection: Math-Shepherd MC step labels (exhaustive and first-error search), agreement, prompt draws.

The completer (the policy in the pipeline) is replaced by deterministic functions whose outcome is known,
so every HE/SE label and every rollout count below can be worked out by hand. Completions are given as the
char tokenizer's ids, as the policy samples them; the completers read the prefixes' ids back as text.
"""

from __future__ import annotations

import math

import pytest

from models import char_tokenizer
from pipeline.collect import draw_prompts
from pipeline.generation import Continuation
from pipeline.mc_labels import Labels, agreement, imputed_share, label_exhaustive, label_first_error, make_request
from pipeline.problems import EmbeddedArithmetic, Problem
from pipeline.problems.arithmetic import format_prompt, format_solution
from pipeline.replay import write_shard
from pipeline.rundir import RunDir
from pipeline.steps import split_steps

N = 4  # rollouts per step prefix

ARITH = EmbeddedArithmetic(num_train=12, num_test=5, seed=1)

# 7 +5 *3 -4: values 12, 36, 32.
OPS3 = [("+", 5), ("*", 3), ("-", 4)]
P3 = Problem("p3", format_prompt(7, OPS3), "32", format_solution(7, OPS3))
# 3 +1 +1 ... (8 operations): values 4, 5, ..., 11.
OPS8 = [("+", 1)] * 8
P8 = Problem("p8", format_prompt(3, OPS8), "11", format_solution(3, OPS8))
PROBLEMS = [P3, P8]
TOK = char_tokenizer()


def request(problem: Problem, completion: str):
    """The label request of `completion` sampled as the char tokenizer's ids."""
    return make_request(ARITH, problem, TOK, TOK(completion).input_ids)


def read(c: Continuation) -> str:
    """The text a rollout continues: the prompt and the completion's prefix, from their ids."""
    return TOK.decode(list(c.prompt_ids)) + TOK.decode(list(c.completion_ids))


def split_text(text: str) -> tuple[Problem, str]:
    """The problem whose prompt starts `text`, and the prefix after it."""
    for p in PROBLEMS:
        if text.startswith(p.prompt):
            return p, text[len(p.prompt) :]
    raise AssertionError(f"unknown prompt in {text!r}")


def gold_rest(problem: Problem, prefix: str) -> str:
    """The gold solution's lines after the prefix's steps (a newline first if the prefix lacks one)."""
    rest = "\n".join(problem.solution.split("\n")[len(split_steps(prefix)) :])
    return rest if prefix.endswith("\n") or not prefix else "\n" + rest


def chain_correct(problem: Problem, prefix: str) -> bool:
    return all(ARITH.gold_step_labels(prefix, problem))


class Oracle:
    """Completes a prefix whose chain so far is correct with the gold rest, else writes 'Answer: 0'.

    Reachability is then monotone: once a step is wrong, every later prefix stays wrong. Counts its calls.
    """

    def __init__(self):
        self.calls, self.texts = 0, []

    def __call__(self, prefixes: list[Continuation], n: int) -> list[list[str]]:
        self.calls += 1
        self.texts += [read(c) for c in prefixes]
        out = []
        for c in prefixes:
            problem, prefix = split_text(read(c))
            good = chain_correct(problem, prefix)
            out.append([prefix + (gold_rest(problem, prefix) if good else "Answer: 0")] * n)  # whole completions
        return out


def k_of_n(k_by_depth: dict[int, int]):
    """A stochastic-looking completer: from a prefix of d steps, k_by_depth[d] of the n rollouts are right."""

    def completer(prefixes: list[Continuation], n: int) -> list[list[str]]:
        out = []
        for c in prefixes:
            problem, prefix = split_text(read(c))
            k = k_by_depth[len(split_steps(prefix))]
            right = gold_rest(problem, prefix)
            out.append([prefix + right] * k + [prefix + "Answer: 0"] * (n - k))
        return out

    return completer


def wrong_from(step: int, problem: Problem = P8, answer: str | None = None) -> str:
    """The gold solution of `problem` with every operation line from index `step` on off by one."""
    lines = problem.solution.split("\n")
    for i in range(step, len(lines) - 1):
        lhs, rhs = lines[i].split("=")
        lines[i] = f"{lhs}={int(rhs) + 1}"
    if answer is not None:
        lines[-1] = f"Answer: {answer}"
    elif step < len(lines) - 1:
        lines[-1] = f"Answer: {int(problem.answer) + 1}"
    return "\n".join(lines)


# --- requests -------------------------------------------------------------------------------------------


def test_make_request_settles_prefixes_that_state_an_answer():
    req = request(P3, "7+5=12\nAnswer: 12\n12*3=36")
    assert req.prefixes == ["7+5=12\n", "7+5=12\nAnswer: 12\n", "7+5=12\nAnswer: 12\n12*3=36"]
    # No answer yet -> None (needs rollouts); "Answer: 12" is wrong (gold 32), and still the last one stated
    # in the third prefix, so both later prefixes are settled False.
    assert req.settled == [None, False, False]
    assert request(P3, P3.solution).settled == [None, None, None, True]


# --- exhaustive ----------------------------------------------------------------------------------------


def test_exhaustive_with_an_oracle_completer():
    completions = [
        P3.solution,  # all right
        "7+5=12\n12*3=35\n35-4=31\nAnswer: 31",  # slip at step 2, carried forward
        "7+5=12\nAnswer: 12\n12*3=36",  # a premature (wrong) answer
        "",  # blank: no steps
        "7+5=12\n12*3=36",  # truncated: the last prefix has no answer and no newline
    ]
    reqs = [request(P3, c) for c in completions]
    oracle = Oracle()
    labels = label_exhaustive(ARITH, oracle, reqs, N)

    # Every unsettled prefix of every request goes out in ONE batched completer call.
    assert oracle.calls == 1
    # Unsettled prefixes: 3 + 3 + 1 + 0 + 2 = 9, each with N rollouts.
    assert len(oracle.texts) == 9
    assert [lab.rollouts for lab in labels] == [3 * N, 3 * N, 1 * N, 0, 2 * N]

    # All right: the three prefixes complete to the gold answer, the Answer line is settled right.
    assert labels[0].he == [1, 1, 1, 1] and labels[0].se == [1.0, 1.0, 1.0, 1.0]
    # Slip at step 2: only the first prefix can still reach 32; these equal the gold step labels.
    assert labels[1].he == [1, 0, 0, 0] and labels[1].se == [1.0, 0.0, 0.0, 0.0]
    assert labels[1].he == ARITH.gold_step_labels(completions[1], P3)
    # Premature answer: first prefix reachable; both later prefixes state 12 (wrong): settled 0, no rollouts.
    assert labels[2].he == [1, 0, 0] and labels[2].se == [1.0, 0.0, 0.0]
    assert labels[3].he == [] and labels[3].se == []
    # Truncated: both prefixes are on the gold chain, so both reach 32 (the second gets "\nAnswer: 32").
    assert labels[4].he == [1, 1] and labels[4].se == [1.0, 1.0]


def test_exhaustive_soft_labels_are_fractions():
    # From 1 step 3 of 4 rollouts are right, from 2 steps 1 of 4, from 3 steps none.
    completer = k_of_n({1: 3, 2: 1, 3: 0})
    labels = label_exhaustive(ARITH, completer, [request(P3, P3.solution)], N)[0]
    # SE = k/N; HE = 1 iff any rollout is right; the Answer line is settled by the verifier (right: 1).
    assert labels.se == [0.75, 0.25, 0.0, 1.0]
    assert labels.he == [1, 1, 0, 1]
    assert labels.rollouts == 3 * N


# --- first error (binary search) ------------------------------------------------------------------------


@pytest.mark.parametrize("error_at", range(9))
def test_first_error_matches_exhaustive_when_monotone(error_at):
    # 8 operation lines + an Answer line = 9 prefixes; lines from `error_at` on are wrong (error_at = 8:
    # all operations right but a wrong final answer).
    completion = wrong_from(error_at) if error_at < 8 else wrong_from(8, answer="12")
    req = request(P8, completion)
    assert len(req.prefixes) == 9
    exhaustive = label_exhaustive(ARITH, Oracle(), [req], N)[0]
    search = label_first_error(ARITH, Oracle(), [req], N)[0]
    # Gold: the first `error_at` prefixes reachable, the rest not.
    assert exhaustive.he == [1] * error_at + [0] * (9 - error_at)
    assert search.he == exhaustive.he
    # The oracle gives 0 or N of N right, so measured SE equals HE and unprobed SE is filled with HE.
    assert search.se == [float(h) for h in search.he]
    # Exhaustive rolls out all 8 operation prefixes; the search probes about log2(9) of them.
    assert exhaustive.rollouts == 8 * N
    assert search.rollouts <= 4 * N


def test_first_error_probe_count_worked_example():
    # Error at line 5 (prefix index 5): search over [0, 9]: probe 4 (reachable -> lo 5), probe 7 (no -> hi 7),
    # probe 6 (no -> hi 6), probe 5 (no -> hi 5): 4 probes, all unsettled operation prefixes.
    oracle = Oracle()
    req = request(P8, wrong_from(5))
    labels = label_first_error(ARITH, oracle, [req], N)[0]
    assert labels.he == [1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert labels.rollouts == 4 * N
    assert [split_text(t)[1] for t in oracle.texts] == [req.prefixes[k] for k in (4, 7, 6, 5)]


def test_first_error_right_answer_needs_no_rollouts():
    oracle = Oracle()
    labels = label_first_error(ARITH, oracle, [request(P8, P8.solution)], N)[0]
    # The completion itself reaches the gold answer, so every prefix is reachable: nothing to probe.
    assert labels.he == [1] * 9 and labels.rollouts == 0 and oracle.calls == 0
    assert labels.se == [1.0] * 9


def test_first_error_batches_requests_per_level():
    reqs = [request(P8, wrong_from(e)) for e in (0, 3, 7)] + [request(P8, "")]
    oracle = Oracle()
    labels = label_first_error(ARITH, oracle, reqs, N)
    assert [lab.he for lab in labels] == [[1] * e + [0] * (9 - e) for e in (0, 3, 7)] + [[]]
    # All requests probe together: one completer call per level of the search (4 levels for 9 prefixes),
    # not one per request per level.
    assert oracle.calls <= 4
    assert labels[3].rollouts == 0


def test_first_error_soft_labels_where_probed():
    # P3 with the last operation wrong: "7+5=12\n" (1 step), "...12*3=36\n" (2), "...36-4=33\n" (3),
    # "...Answer: 33" (settled wrong). From 1 or 2 steps 3 of 4 rollouts are right, from 3 steps none.
    completion = P3.solution.replace("36-4=32", "36-4=33").replace("Answer: 32", "Answer: 33")
    labels = label_first_error(ARITH, k_of_n({1: 3, 2: 3, 3: 0}), [request(P3, completion)], N)[0]
    # Search over [0, 4]: probe 2 (3 steps, 0/4 -> hi 2), probe 1 (2 steps, 3/4 -> lo 2): first error at 2.
    assert labels.he == [1, 1, 0, 0]
    # SE: measured where probed (0.75 at 1, 0.0 at 2), HE elsewhere (prefix 0 was never rolled out).
    assert labels.se == [1.0, 0.75, 0.0, 0.0]
    assert labels.rollouts == 2 * N
    # Prefix 0 (rolls out 3/4 right: SE 0.75 exhaustively) and the Answer line were never probed: imputed.
    assert labels.imputed == 2


def test_first_error_soft_labels_on_unprobed_steps_are_imputed_hard_ones():
    # A constructed case for `target: soft`: P8's gold solution with its last operation wrong (error at
    # prefix 7); from d steps, 3 of 4 rollouts are right for d <= 7, none after.
    completion = wrong_from(7)
    completer = k_of_n({d: 3 if d <= 7 else 0 for d in range(1, 9)})
    req = request(P8, completion)
    exhaustive = label_exhaustive(ARITH, completer, [req], N)[0]
    search = label_first_error(ARITH, completer, [req], N)[0]
    # Measured everywhere: 0.75 on the 7 reachable operation prefixes, 0 on the wrong one and the Answer line.
    assert exhaustive.se == [0.75] * 7 + [0.0, 0.0] and exhaustive.imputed == 0
    # Search over [0, 9]: probe 4 (0.75 -> lo 5), 7 (0 -> hi 7), 6 (0.75 -> lo 7): first error at 7. The
    # six prefixes never probed get SE = HE: 1.0 where a soft target would have been 0.75.
    assert search.he == exhaustive.he == [1] * 7 + [0, 0]
    assert search.se == [1.0, 1.0, 1.0, 1.0, 0.75, 1.0, 0.75, 0.0, 0.0]
    assert search.imputed == 6 and search.rollouts == 3 * N
    # The round's metric: 6 of 9 step labels imputed by the search, none by exhaustive labelling.
    assert imputed_share([search]) == pytest.approx(6 / 9)
    assert imputed_share([exhaustive]) == 0.0


def test_imputed_share_counts_steps_over_all_completions():
    # 1 + 0 imputed of 3 + 1 + 0 steps; a blank completion has no step and weighs nothing.
    labels = [Labels([1, 1, 0], [1.0, 0.5, 0.0], 8, imputed=1), Labels([1], [1.0]), Labels([], [])]
    assert imputed_share(labels) == 0.25
    assert imputed_share([Labels([], [])]) == 0.0 and imputed_share([]) == 0.0


# --- agreement -----------------------------------------------------------------------------------------


def test_agreement():
    # Steps: (1,1) agree, (0,1) disagree, (0.75 -> 1, 1) agree: 2 of 3.
    assert agreement([[1, 0], [0.75]], [[1, 1], [1]]) == pytest.approx(2 / 3)
    # Threshold 0.5 is inclusive: 0.5 counts as 1; 0.49 as 0.
    assert agreement([[0.5, 0.49]], [[1, 0]]) == 1.0
    assert agreement([[0.5]], [[1]], threshold=0.6) == 0.0
    assert math.isnan(agreement([[]], [[]]))  # no steps: NaN, not a misleading 0 or 1


def test_exhaustive_labels_agree_with_gold_on_carried_slips():
    completions = [P3.solution, "7+5=12\n12*3=35\n35-4=31\nAnswer: 31", "7+5=13\n13*3=39\n39-4=35\nAnswer: 35"]
    reqs = [request(P3, c) for c in completions]
    he = [lab.he for lab in label_exhaustive(ARITH, Oracle(), reqs, N)]
    gold = [ARITH.gold_step_labels(c, P3) for c in completions]
    assert agreement(he, gold) == 1.0


# --- prompt draws --------------------------------------------------------------------------------------


def shard_rows(problems, round_index: int) -> list[dict]:
    return [
        {
            "round": round_index, "policy": "p", "prompt_id": p.id, "prompt": p.prompt, "sample_index": 0,
            "completion": "", "answer": None, "steps": [], "outcome": 0, "he_labels": [], "se_labels": [],
            "gold_labels": None, "rollouts": 0, "num_tokens": 0,
        }
        for p in problems
    ]


def test_draw_prompts_uses_fresh_prompts_until_the_pool_runs_out(tmp_path):
    train_ids = {p.id for p in ARITH.train}
    test_ids = {p.id for p in ARITH.test}
    assert len(train_ids) == 12

    r0 = draw_prompts(ARITH, tmp_path, 0, 5, seed=0)
    assert len(r0) == 5 and len({p.id for p in r0}) == 5
    write_shard(shard_rows(r0, 0), RunDir(tmp_path).shard(0))

    r1 = draw_prompts(ARITH, tmp_path, 1, 5, seed=0)
    assert not {p.id for p in r1} & {p.id for p in r0}  # no repeat while fresh ones remain
    write_shard(shard_rows(r1, 1), RunDir(tmp_path).shard(1))

    # Round 2 wants 5 but only 12 - 10 = 2 are fresh: both fresh ones first, then 3 seen ones, no duplicates.
    r2 = draw_prompts(ARITH, tmp_path, 2, 5, seed=0)
    ids2 = [p.id for p in r2]
    fresh = train_ids - {p.id for p in r0 + r1}
    assert len(fresh) == 2 and set(ids2[:2]) == fresh
    assert len(set(ids2)) == 5

    for draw in (r0, r1, r2):
        assert {p.id for p in draw} <= train_ids and not {p.id for p in draw} & test_ids

    # Asking for more than the whole pool gives the pool once, never a test problem.
    everything = draw_prompts(ARITH, tmp_path, 2, 50, seed=0)
    assert sorted(p.id for p in everything) == sorted(train_ids)


def test_draw_prompts_is_reproducible_and_ignores_later_shards(tmp_path):
    first = draw_prompts(ARITH, tmp_path, 1, 4, seed=7)
    assert [p.id for p in draw_prompts(ARITH, tmp_path, 1, 4, seed=7)] == [p.id for p in first]
    # A resumed round 1 after its own shard was written draws the same prompts: only rounds < 1 count.
    write_shard(shard_rows(first, 1), RunDir(tmp_path).shard(1))
    assert [p.id for p in draw_prompts(ARITH, tmp_path, 1, 4, seed=7)] == [p.id for p in first]
    # Another seed draws another order.
    assert [p.id for p in draw_prompts(ARITH, tmp_path, 1, 4, seed=8)] != [p.id for p in first]


@pytest.mark.slow  # two real collections
@pytest.mark.parametrize("prover", ["policy", "round0"])
def test_the_mc_rollouts_come_from_the_chosen_prover(tmp_path, tiny_policy_dir, monkeypatch, prover):
    # `collect.prover: round0`: the samples are the round's policy's, the step labels' rollouts round 0's policy's
    # (PAV's prover, fixed across rounds); the default is Math-Shepherd's, the policy itself.
    import contextlib
    import shutil

    from pipeline import fanout
    from pipeline.collect import run_collection_phase
    from pipeline.loading import config_from_dict
    from pipeline.problems import problem_set_from_config
    from pipeline.rundir import RunDir
    from tests.helpers import mini_config

    cfg = config_from_dict(mini_config(tmp_path, collect={"prover": prover}), check_trl=False)
    run = RunDir(cfg.run_dir)
    shutil.copytree(tiny_policy_dir, run.policy(0))
    shutil.copytree(tiny_policy_dir, run.policy(1))
    calls, real = [], fanout.open_sampler

    @contextlib.contextmanager
    def recording(path, c, *args, **kwargs):
        with real(path, c, *args, **kwargs) as sample:
            yield lambda prompts, n, **kw: calls.append((path, kw.get("desc"))) or sample(prompts, n, **kw)

    monkeypatch.setattr(fanout, "open_sampler", recording)
    res = run_collection_phase(cfg, problem_set_from_config(cfg), run.policy(1), cfg.run_dir, 1)
    assert res.metrics["collect/samples"] > 0
    samples = {p for p, desc in calls if desc == "samples"}
    rollouts = {p for p, desc in calls if desc == "MC rollouts"}
    assert samples == {str(run.policy(1))}
    assert rollouts == {str(run.policy(0) if prover == "round0" else run.policy(1))}
