"""Process-mode GRPO on the real trainer, on any tokenizer (issue 15, points 2-5).

TRL's rollout hook (`rollout_func`) hands `ProcessGRPOTrainer` designed completions, so every advantage
can be worked out by a plain loop (`tests/tokenizer_cases.py`): step ends on the policy's own tokens for the
char tokenizer, SmolLM2's byte-level BPE and a SentencePiece-style one (point 2), a truncated completion
masked by `mask_truncated_completions` out of its group (3), the eos credited (4), `scale_rewards`
honoured and the advantages used logged (5). Hybrid mode (issue 16, point 1): TRL's outcome advantages plus
the weighted process advantages, min credit included, and the PRM term's share of their variance logged.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from pipeline.scorers import PrmScorer
from pipeline.steps import scored_step_ends
from tests.helpers import run_grpo
from tests.tokenizer_cases import (
    KINDS,
    PROMPT,
    PROMPT_B,
    TEXTS,
    encode,
    id_variants,
    policy_and_prm,
    reference_pieces,
    reference_prm_positions,
    reference_token_of,
    tokenizer_of,
)

# Group A: four finished completions (eos appended). Group B: three identical finished ones and one that
# was cut (no eos): with mask_truncated_completions TRL zeroes its mask.
GROUP_A = TEXTS
GROUP_B = ["Answer: 72"] * 3 + ["Answer: 7"]
SCALE = {"char": "none", "bpe": "group", "metaspace": "batch"}  # each scale_rewards once, over the kinds


def rollout_ids(tok) -> list[list[int]]:
    rows = [ids for text in GROUP_A for ids in [id_variants(tok, text)[-1]]]
    rows += [encode(tok, t) + [tok.eos_token_id] for t in GROUP_B[:3]] + [encode(tok, GROUP_B[3])]
    return rows


def reference_steps(tok, prm, prompt: str, row: list[int]) -> list[tuple[int, float]]:
    """(end token, PRM score) of each step of a finished completion, by plain loops: steps ending on one
    token keep the last one's score; the last step runs to the eos."""
    text, pieces = reference_pieces(tok, row)
    ends = [reference_token_of(pieces, c) for c in scored_step_ends(text)] if text else [len(row) - 1]
    input_ids, positions = reference_prm_positions(tok, prompt, text)
    with torch.inference_mode():
        probs = torch.sigmoid(prm(torch.tensor([input_ids])).logits[0, :, 0]).tolist()
    by_end = {}
    for e, p in zip(ends, positions):
        by_end[e] = probs[p]
    out = list(by_end.items())
    out[-1] = (len(row) - 1, out[-1][1])
    return out


def reference_advantages(tok, prm, rows: list[list[int]], scale: str, credit: str = "sum",
                         baseline: str = "group") -> list[list[float]]:
    """Normalised per group (or batch; with the position baseline, among the group's steps at the same index)
    and summed (or, min credit, their minimum) over the steps ending at or after each token, 0 where none is;
    a cut (masked) completion has no steps."""
    prompts = [PROMPT] * 4 + [PROMPT_B] * 4
    steps = [reference_steps(tok, prm, p, row) if row[-1] == tok.eos_token_id else [] for p, row in zip(prompts, rows)]
    every = [s for row in steps for _, s in row]
    width = max(map(len, rows))
    out = []
    for i, row in enumerate(steps):
        peers = steps[4 * (i // 4) : 4 * (i // 4) + 4]  # the group's completions, each a list of (end, score)
        norm = []
        for j, (e, s) in enumerate(row):
            if baseline == "position":
                group = [r[j][1] for r in peers if j < len(r)]
            else:
                group = [x for r in peers for _, x in r]
            mean = statistics.fmean(group)
            std = {"group": statistics.stdev(group) if len(group) > 1 else 0.0, "batch": statistics.stdev(every),
                   "none": None}[scale]
            norm.append((e, s - mean if std is None else (s - mean) / (std + 1e-4)))
        ahead = [[r for e, r in norm if e >= t] for t in range(width)]
        out.append([sum(a) if credit == "sum" else min(a, default=0.0) for a in ahead])
    return out


def reference_outcome(rewards: list[float], scale: str) -> list[float]:
    """TRL's outcome advantages by a plain loop: centred on the group's mean (groups of 4), divided by the
    group's (or the batch's) unbiased std + 1e-4, or not divided ("none")."""
    out = []
    for g in range(0, len(rewards), 4):
        group = rewards[g : g + 4]
        mean = statistics.fmean(group)
        std = {"group": statistics.stdev(group), "batch": statistics.stdev(rewards), "none": None}[scale]
        out += [r - mean if std is None else (r - mean) / (std + 1e-4) for r in group]
    return out


# The tests on `grpo_run` and `hybrid_runs` are marked slow: the fixtures run real GRPO steps (~10 s in all).
@pytest.fixture(scope="module", params=KINDS)
def grpo_run(request, tmp_path_factory):
    """One real process-mode GRPO step on the designed completions, per tokenizer: what the loss saw, the logs."""
    from pipeline.rm_kinds.loading import load_reward_model

    kind, tok = request.param, tokenizer_of(request.param)
    prm_dir = policy_and_prm(tok, tmp_path_factory.mktemp("prm"))
    prm, prm_tok, _ = load_reward_model(prm_dir / "prm", expect="prm")
    scorer, scored = PrmScorer(prm, prm_tok), []
    step_scores = scorer.step_scores

    def recording(prompts, completions):  # a spy: the PRM scores as it would, the texts are kept
        scored.extend(completions)
        return step_scores(prompts, completions)

    scorer.step_scores = recording
    rows = rollout_ids(tok)
    run = run_grpo(tok, prm_dir / "policy", tmp_path_factory.mktemp("grpo"), rows, "process", scorer, SCALE[kind])
    return {**run, "tok": tok, "rows": rows, "prm": prm, "scale": SCALE[kind], "scored": scored}


@pytest.mark.slow
def test_grpo_prm_scores_the_text_trl_decoded(grpo_run):
    """Point 2: the PRM reads the completion TRL decoded (and the verifier judged), spaces and emoji intact."""
    tok = grpo_run["tok"]
    rows = grpo_run["rows"]
    assert grpo_run["decoded"] == [tok.decode(r, skip_special_tokens=True) for r in rows]
    # Every finished completion, once; the masked one (row 7) is not scored at all.
    assert sorted(grpo_run["scored"]) == sorted(grpo_run["decoded"][:7])


@pytest.mark.slow
def test_grpo_advantages_equal_the_plain_loop_on_the_policys_tokens(grpo_run):
    """Points 2, 4, 5: step ends on the policy's own tokens, the eos credited, scale_rewards honoured."""
    tok = grpo_run["tok"]
    adv = grpo_run["advantages"]  # (B, T)
    want = reference_advantages(tok, grpo_run["prm"], grpo_run["rows"], grpo_run["scale"])
    assert adv.shape == (8, len(want[0]))
    assert adv.tolist() == [pytest.approx(w, abs=1e-5) for w in want]


@pytest.mark.slow
def test_grpo_eos_carries_the_last_steps_reward(grpo_run):
    tok = grpo_run["tok"]
    adv, rows = grpo_run["advantages"], grpo_run["rows"]
    for i in range(4):  # group A: finished, varied, so the group has spread
        text, pieces = reference_pieces(tok, rows[i])
        last = reference_token_of(pieces, scored_step_ends(text)[-1])
        eos = len(rows[i]) - 1
        assert adv[i, eos].item() != 0.0
        # From the last step's end to the eos, every token carries the last step's normalised reward.
        assert adv[i, last : eos + 1].tolist() == pytest.approx([adv[i, eos].item()] * (eos + 1 - last), abs=1e-6)


@pytest.mark.slow
def test_grpo_masked_truncated_completion_has_no_steps_and_leaves_the_group_alone(grpo_run):
    """Point 3: three identically scored finished completions and one cut, masked one: all advantages 0."""
    assert grpo_run["mask"][7].sum().item() == 0  # TRL masked the cut completion
    adv = grpo_run["advantages"][4:]  # group B
    # The three finished ones read one identical step each: with the masked one out, the group has no spread.
    assert adv.abs().max().item() == 0.0


@pytest.mark.slow
def test_grpo_logs_the_advantages_it_used(grpo_run):
    tok = grpo_run["tok"]
    adv, mask = grpo_run["advantages"], grpo_run["mask"].bool()
    used = adv[mask].double()
    logged = next(h for h in grpo_run["logs"] if "process/advantage_mean" in h)
    assert logged["process/advantage_mean"] == pytest.approx(used.mean().item(), abs=1e-5)
    assert logged["process/advantage_std"] == pytest.approx(used.std().item(), abs=1e-5)
    assert logged["process/advantage_min"] == pytest.approx(used.min().item(), abs=1e-5)
    assert logged["process/advantage_max"] == pytest.approx(used.max().item(), abs=1e-5)
    # TRL's completions table (log_completions) shows each completion's first-token advantage, not the verifier's.
    assert grpo_run["table"] == pytest.approx(adv[:, 0].tolist(), abs=1e-6)
    # Seven completions with steps: 4 in group A, 3 in group B (the masked one is left out).
    prompts = [PROMPT] * 4 + [PROMPT_B] * 3
    counts = [len(reference_steps(tok, grpo_run["prm"], p, r)) for p, r in zip(prompts, grpo_run["rows"])]
    assert logged["process/steps_per_completion"] == pytest.approx(sum(counts) / 7, abs=1e-6)




def test_rft_logs_the_advantages_it_used(tmp_path):
    """Point 5 in rft mode: TRL logs the verifier's group-normalised advantages; the 0/1 used are logged."""
    tok = tokenizer_of("char")
    rows = rollout_ids(tok)
    run = run_grpo(tok, policy_and_prm(tok, tmp_path) / "policy", tmp_path / "grpo", rows, "rft")
    adv, mask = run["advantages"], run["mask"]
    # Per completion, the verifier's 0/1 ("72" in it): rows 0, 4, 5, 6 (and the cut row 7 has "7" only).
    assert adv.tolist() == [float("72" in tok.decode(r, skip_special_tokens=True)) for r in rows]
    lengths = mask.sum(1)
    used = torch.repeat_interleave(adv.double(), lengths)  # every token in the loss carries its row's 0/1
    logged = next(h for h in run["logs"] if "rft/advantage_mean" in h)
    assert logged["rft/advantage_mean"] == pytest.approx(used.mean().item(), abs=1e-6)
    assert logged["rft/advantage_std"] == pytest.approx(used.std().item(), abs=1e-6)
    assert (logged["rft/advantage_min"], logged["rft/advantage_max"]) == (0.0, 1.0)
    assert run["table"] == adv.tolist()  # TRL's completions table: the 0/1 used, not group-normalised


# --- passk: PKPO's pass@k rewards, then outcome mode's baseline (issue 59) ------------------------------------


@pytest.mark.parametrize("scale", ["group", "none"])
def test_passk_at_k_1_trains_on_outcome_modes_advantages_and_larger_k_reweighs_each_group(tmp_path, scale):
    """The same designed completions through the real trainer in outcome mode and in passk mode: at k = 1 the loss
    sees exactly TRL's own advantages; at k = 2 each group's are w(c) = k C(n-1-c, k-1) / C(n-1, k-1) times them."""
    from pipeline.config import SupervisionConfig

    tok = tokenizer_of("char")
    rows = rollout_ids(tok)
    policy = policy_and_prm(tok, tmp_path) / "policy"
    outcome = run_grpo(tok, policy, tmp_path / "outcome", rows, "outcome", scale=scale)
    runs = {k: run_grpo(tok, policy, tmp_path / f"k{k}", rows, SupervisionConfig(mode="passk", passk={"k": k}),
                        scale=scale) for k in (1, 2)}
    assert torch.equal(runs[1]["advantages"], outcome["advantages"])
    # Verifier rewards [1, 0, 0, 0] and [1, 1, 1, 0] (the cut row is scored, then masked): group A, c = 1 of 4, gets
    # w = 2 * C(2, 1) / C(3, 1) = 4/3; group B, c = 3, w = 2 * C(0, 1) / C(3, 1) = 0, since any pair holding its
    # wrong sample passes through the other. The advantages are w(c) times outcome mode's.
    want = [4 / 3 * a for a in outcome["advantages"][:4].tolist()] + [0.0] * 4
    assert runs[2]["advantages"].tolist() == pytest.approx(want, abs=1e-6)
    logged = next(h for h in runs[2]["logs"] if "passk/k" in h)
    # pass@2 of group A: 1 - C(3, 2) / C(4, 2) = 0.5; of group B: 1 - C(1, 2) / C(4, 2) = 1; beside TRL's reward.
    assert (logged["passk/k"], logged["passk/reward"]) == (2.0, pytest.approx(0.75))
    assert logged["reward"] == pytest.approx(4 / 8)


def test_passk_schedule_over_steps_is_logged_to_mlflow_every_step_beside_trls_reward(tmp_path, mlflow_tmp,
                                                                                     tiny_policy_dir):
    """A real tiny GRPO run of 3 steps annealing k over [3, 2, 1]: MLflow's phase run holds passk/k 3, 2, 1 and
    passk/reward at every step, beside TRL's reward; at k = 1 the pass@k reward is TRL's reward (pass@1)."""
    import mlflow
    from datasets import Dataset

    from models import char_tokenizer
    from pipeline.loading import config_from_dict
    from pipeline.passthrough import grpo_config
    from pipeline.grpo_trainer import ProcessGRPOTrainer
    from tests.helpers import mini_config

    tok = char_tokenizer()
    cfg = config_from_dict(mini_config(tmp_path, supervision={"mode": "passk", "passk": {"schedule": [3, 2, 1]}},
                                       grpo={"max_steps": 3, "per_device_train_batch_size": 4, "num_generations": 4,
                                             "max_completion_length": 6, "logging_steps": 1}))

    def verifier(completions, **kwargs):  # one right sample a group: pass@k = k/4
        return [float(i % 4 == 0) for i in range(len(completions))]

    trainer = ProcessGRPOTrainer(
        model=str(tiny_policy_dir), reward_funcs=[verifier], processing_class=tok,
        args=grpo_config(cfg, str(tmp_path / "scratch"), reward_weights=[1.0], report_to="mlflow"),
        train_dataset=Dataset.from_list([{"prompt": "7 +5\n"}] * 12), supervision=cfg.supervision,
    )
    with mlflow.start_run() as run:
        trainer.train()
    client = mlflow.MlflowClient()
    history = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
               for key in ("passk/k", "passk/reward", "reward")}
    assert history["passk/k"] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert history["passk/reward"] == [(s, pytest.approx(k / 4)) for s, k in ((1, 3), (2, 2), (3, 1))]
    assert history["reward"] == [(s, pytest.approx(0.25)) for s in (1, 2, 3)]


# --- hybrid: TRL's outcome advantage + w x the process advantage (issue 16, point 1) ----------------------


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory):
    """Real GRPO steps on the designed completions (char tokenizer): hybrid with min credit at w = 0.5 and
    batch scale, hybrid at w = 0, process mode with the per-position baseline, and outcome mode, one PRM."""
    from pipeline.rm_kinds.loading import load_reward_model

    tok = tokenizer_of("char")
    root = policy_and_prm(tok, tmp_path_factory.mktemp("hybrid"))
    prm, prm_tok, _ = load_reward_model(root / "prm", expect="prm")
    scorer, rows = PrmScorer(prm, prm_tok), rollout_ids(tok)
    runs = {name: run_grpo(tok, root / "policy", tmp_path_factory.mktemp(name), rows, mode, scorer, scale, **kw)
            for name, mode, scale, kw in (
                ("min", "hybrid", "batch", {"process_credit": "min", "process_weight": 0.5}),
                ("w0", "hybrid", None, {"process_weight": 0.0}),
                ("position", "process", None, {"process_baseline": "position"}),
                ("centred", "process", None, {"process_centring": "group"}),
                ("progress", "hybrid", None, {"process_reward": "progress", "process_credit": "step"}),
                ("outcome", "outcome", None, {}))}
    # PRIME's credit from an implicit PRM: the policy as pi_phi against another random reference, so r_t != 0.
    implicit = prime_scorer(tok, root / "policy")
    runs["prime"] = run_grpo(tok, root / "policy", tmp_path_factory.mktemp("prime"), rows, "process", implicit,
                             process_reward="prime")
    rewards = [float("72" in tok.decode(r, skip_special_tokens=True)) for r in rows]  # [1, 0, 0, 0, 1, 1, 1, 0]
    return {**runs, "tok": tok, "rows": rows, "prm": prm, "rewards": rewards, "implicit": implicit}


def prime_scorer(tok, policy_dir):
    from models import load_policy, tiny_policy
    from pipeline.rm_kinds.implicit import ImplicitPrmScorer
    from tests.helpers import SIZES

    return ImplicitPrmScorer(load_policy(str(policy_dir))[0], tiny_policy(tok, **SIZES["tiny"], seed=1), tok, beta=0.5)


@pytest.mark.slow
def test_hybrid_advantages_are_trls_outcome_plus_weighted_process(hybrid_runs):
    """A = A_outcome + w * A_process, each recomputed by a plain loop: TRL's outcome advantage of the verifier
    (batch scale) on every token, the min-credit process advantage (batch scale, eos credited, the cut
    completion without steps)."""
    run, tok, rows = hybrid_runs["min"], hybrid_runs["tok"], hybrid_runs["rows"]
    outcome = reference_outcome(hybrid_runs["rewards"], "batch")
    process = reference_advantages(tok, hybrid_runs["prm"], rows, "batch", credit="min")
    want = [[o + 0.5 * p for p in row] for o, row in zip(outcome, process)]
    adv = run["advantages"]  # (B, T)
    assert adv.shape == (8, len(want[0]))
    assert adv.tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    # Both terms have signal here: group A's verifier spread and its PRM spread (group B's PRM has none).
    assert max(abs(o) for o in outcome) > 0.1 and max(abs(p) for r in process[:4] for p in r) > 0.1
    # TRL's completions table shows the hybrid advantage of each completion's first token.
    assert run["table"] == pytest.approx(adv[:, 0].tolist(), abs=1e-6)


@pytest.mark.slow
def test_process_position_baseline_normalises_each_step_with_the_groups_steps_at_its_index(hybrid_runs):
    """`supervision.process_baseline: position` reaches the trainer: the advantages are the plain loop's with
    each step normalised among the group's steps at the same index, not the pooled DeepSeekMath ones."""
    run, tok, rows = hybrid_runs["position"], hybrid_runs["tok"], hybrid_runs["rows"]
    want = reference_advantages(tok, hybrid_runs["prm"], rows, "group", baseline="position")
    pooled = reference_advantages(tok, hybrid_runs["prm"], rows, "group")
    assert run["advantages"].tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    assert max(abs(a - b) for w, p in zip(want, pooled) for a, b in zip(w, p)) > 0.1


@pytest.mark.slow
def test_process_centring_reaches_the_trainer(hybrid_runs):
    """`supervision.process_centring: group`: the plain loop's DeepSeekMath advantages with each group's mean over
    its tokens in the loss removed; the masked completion stays 0, and each group's loss tokens sum to zero."""
    run, tok, rows = hybrid_runs["centred"], hybrid_runs["tok"], hybrid_runs["rows"]
    pooled = reference_advantages(tok, hybrid_runs["prm"], rows, "group")
    lengths = [int(n) for n in run["mask"].sum(1).tolist()]
    want = []
    for i, row in enumerate(pooled):
        group = range(4 * (i // 4), 4 * (i // 4) + 4)
        cells = [pooled[k][t] for k in group for t in range(lengths[k])]
        want.append([a - sum(cells) / len(cells) if t < lengths[i] else 0.0 for t, a in enumerate(row)])
    assert run["advantages"].tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    for g in (0, 4):
        assert sum(run["advantages"][k, :lengths[k]].sum().item() for k in range(g, g + 4)) == pytest.approx(0, abs=1e-4)


@pytest.mark.slow
def test_progress_credit_reaches_the_trainer(hybrid_runs):
    """`process_reward: progress` with step credit in hybrid mode: TRL's outcome advantage plus, on each token, its
    own step's progress, the PRM's score at the step's end minus the one before it, from the mean verifier reward of
    the group's other outputs before the first step to the output's own outcome after the last (PAV's anchors), by
    plain loops; the masked completion gets its outcome advantage alone."""
    run, tok, rows, rewards = hybrid_runs["progress"], hybrid_runs["tok"], hybrid_runs["rows"], hybrid_runs["rewards"]
    outcome = reference_outcome(rewards, "group")
    prompts = [PROMPT] * 4 + [PROMPT_B] * 4
    width = run["advantages"].shape[1]
    want = []
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        steps = reference_steps(tok, hybrid_runs["prm"], prompt, row) if row[-1] == tok.eos_token_id else []
        others = [r for k, r in enumerate(rewards[4 * (i // 4) : 4 * (i // 4) + 4]) if k != i % 4]
        before = statistics.fmean(others)
        progress, ends = [], []
        for j, (end, value) in enumerate(steps):
            value = rewards[i] if j == len(steps) - 1 else value  # the last step's value: the verifier's outcome
            progress.append(value - before)
            ends.append(end)
            before = value
        own = [next((d for d, e in zip(progress, ends) if e >= t), 0.0) for t in range(width)]
        want.append([outcome[i] + d for d in own])
    assert run["advantages"].tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    # Both groups are mixed ([1, 0, 0, 0] and [1, 1, 1, 0]): no all-correct or all-wrong group to average over.
    assert not any(k.startswith("process/progress_mean_") for h in run["logs"] for k in h)


@pytest.mark.slow
def test_prime_credit_reaches_the_trainer(hybrid_runs):
    """`process_reward: prime`: the implicit PRM's token rewards, by a plain loop over one unpadded forward of each
    model, land on the policy's tokens holding their characters (an unknown character's token, which TRL's decoded
    text drops, the eos and the masked completion get none) and with the verifier's outcomes make
    `prime_advantages`' (PRIME's) advantages."""
    from pipeline.advantages import prime_advantages

    run, tok, rows, implicit = hybrid_runs["prime"], hybrid_runs["tok"], hybrid_runs["rows"], hybrid_runs["implicit"]
    lengths = [int(n) for n in run["mask"].sum(1).tolist()]
    rewards = torch.zeros(run["advantages"].shape)  # (B, T)
    for i, (prompt, row) in enumerate(zip([PROMPT] * 4 + [PROMPT_B] * 4, rows)):
        if not lengths[i]:
            continue
        ids = tok(prompt + tok.decode(row, skip_special_tokens=True)).input_ids  # the char tokenizer: one a character
        with torch.no_grad():
            phi, ref = (torch.log_softmax(m(torch.tensor([ids])).logits[0].double(), -1)
                        for m in (implicit.model, implicit.reference))
        holders = [k for k, x in enumerate(row) if tok.decode([x], skip_special_tokens=True)]  # one per character
        start = len(tok(prompt).input_ids)
        for t in range(start, len(ids)):
            rewards[i, holders[t - start]] = 0.5 * float(phi[t - 1, ids[t]] - ref[t - 1, ids[t]])
    assert rewards.abs().max() > 1e-3  # two different models
    want = prime_advantages(rewards, torch.tensor(hybrid_runs["rewards"]), lengths, 4)
    assert run["advantages"].tolist() == [pytest.approx(w, abs=1e-5) for w in want.tolist()]


@pytest.mark.slow
def test_hybrid_logs_its_advantages_and_the_prm_share_of_their_variance(hybrid_runs):
    run = hybrid_runs["min"]
    adv, mask = run["advantages"], run["mask"].bool()
    outcome = torch.tensor(reference_outcome(hybrid_runs["rewards"], "batch"), dtype=torch.float64)
    o = outcome.unsqueeze(1).expand_as(adv)[mask]  # every token in the loss carries its completion's outcome
    p = (adv.double() - outcome.unsqueeze(1))[mask]  # what is left is w * A_process
    share = p.var(correction=0) / (o.var(correction=0) + p.var(correction=0))
    logged = next(h for h in run["logs"] if "hybrid/process_variance_share" in h)
    assert 0.01 < share.item() < 0.99
    assert logged["hybrid/process_variance_share"] == pytest.approx(share.item(), abs=1e-5)
    used = adv[mask].double()
    assert logged["hybrid/advantage_mean"] == pytest.approx(used.mean().item(), abs=1e-5)
    assert logged["hybrid/advantage_std"] == pytest.approx(used.std().item(), abs=1e-5)
    assert (logged["hybrid/advantage_min"], logged["hybrid/advantage_max"]) == pytest.approx(
        (used.min().item(), used.max().item()), abs=1e-5)
    # The process figures are logged as in process mode, and the phase's metrics carry the share.
    assert logged["process/steps_per_completion"] > 0
    from pipeline.policy import policy_metrics

    assert policy_metrics(run["logs"])["policy/process_variance_share"] == pytest.approx(share.item(), abs=1e-5)


@pytest.mark.slow
def test_hybrid_at_weight_zero_is_outcome_mode(hybrid_runs):
    w0, outcome = hybrid_runs["w0"], hybrid_runs["outcome"]
    assert outcome["advantages"].dim() == 1  # TRL's own, one per completion
    # The same advantage on every token, bit for bit what outcome mode trains on; the PRM's share is 0.
    assert torch.equal(w0["advantages"], outcome["advantages"].unsqueeze(1).expand_as(w0["advantages"]))
    assert outcome["advantages"].tolist() == pytest.approx(reference_outcome(hybrid_runs["rewards"], "group"), abs=1e-6)
    logged = next(h for h in w0["logs"] if "hybrid/process_variance_share" in h)
    assert logged["hybrid/process_variance_share"] == 0.0
    assert not any("hybrid/process_variance_share" in h for h in outcome["logs"])


def test_hybrid_needs_a_prm(tmp_path):
    from pipeline.grpo_trainer import ProcessGRPOTrainer

    with pytest.raises(ValueError, match="hybrid supervision needs a PRM"):
        ProcessGRPOTrainer(model="unused", supervision="hybrid")



@pytest.mark.slow
def test_prime_s_grpo_step_runs_the_reference_once_and_trains_as_before(tmp_path):
    """Issue 58, point 3, on the real trainer: a GRPO step of PRIME's credit with the online update runs the implicit
    PRM's frozen reference once (the update's forward, its log-probs read again by the scoring), and gives the
    advantages and the updated PRM of a twin whose scoring runs the reference again (the path before issue 58)."""
    from pipeline.rm_kinds.implicit import ImplicitPrmScorer

    class Twin(ImplicitPrmScorer):
        def reference_logprobs(self, ids, mask, keep=False):  # nothing kept: a reference forward each call
            self._reference_logprobs = {}
            return super().reference_logprobs(ids, mask, keep=False)

    tok = tokenizer_of("char")
    root, rows, runs = policy_and_prm(tok, tmp_path / "models"), rollout_ids(tok), {}
    for name, cls in (("shared", ImplicitPrmScorer), ("twin", Twin)):
        base = prime_scorer(tok, root / "policy")
        scorer = cls(base.model, base.reference, tok, beta=0.5, online_lr=1e-2)
        calls = [0]
        scorer.reference.register_forward_hook(lambda *_, calls=calls: calls.__setitem__(0, calls[0] + 1))
        run = run_grpo(tok, root / "policy", tmp_path / name, rows, "process", scorer, process_reward="prime")
        runs[name] = (run, scorer, calls[0])
    (shared, scorer, calls), (twin, twin_scorer, twin_calls) = runs["shared"], runs["twin"]
    assert (calls, twin_calls) == (1, 2)  # one GRPO step: the update's reference forward, and the twin's second
    assert shared["advantages"].tolist() == [pytest.approx(w, abs=1e-6) for w in twin["advantages"].tolist()]
    assert shared["advantages"].abs().max() > 1e-3
    a, b = scorer.model.state_dict(), twin_scorer.model.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
