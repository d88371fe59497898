"""The implicit PRM (`reward_model.kinds: [implicit]`, pipeline/rm_kinds/implicit.py): its scores against the formula
computed by hand from the two models' logits, its loss, one real training through the RM phase's code path, the
config's checks, PRIME's online update, a collection without MC rollouts, and two rounds of process supervision from
it (with the online update)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers import SIZES, mini_config


def _cfg(**reward_model):
    """A config training only the implicit PRM, process mode from it, no MC rollouts."""
    from pipeline.loading import config_from_dict

    return config_from_dict({"reward_model": {"kinds": ["implicit"], **reward_model},
                             "supervision": {"process_reward_model": "implicit"},
                             "collect": {"rollouts_per_step": 0}}, check_trl=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two different tiny random causal LMs over the char tokenizer, saved: pi_phi (seed 0) as an implicit PRM
    checkpoint whose igrpo.json names pi_ref (seed 1) and beta 0.5, and pi_ref as a policy."""
    from models import char_tokenizer, save_model, tiny_policy
    from pipeline.rm_kinds.loading import save_reward_model

    tok, root = char_tokenizer(), tmp_path_factory.mktemp("implicit")
    ref = save_model(tiny_policy(tok, **SIZES["tiny"], seed=1), tok, root / "reference")
    phi = save_reward_model(tiny_policy(tok, **SIZES["tiny"], seed=0), tok, root / "implicit", "implicit",
                            meta={"reference": str(ref), "beta": 0.5})
    return phi, ref, tok


def _hand_values(phi, ref, tok, prompt: str, completion: str, beta: float) -> list[float]:
    """V_k by the formula, a plain loop over the tokens of one unpadded forward of each model: token t's log-prob is
    the log-softmax of the logits at t - 1, picked at token t.

    The char tokenizer has one token per character and no special tokens, so token i is character i: the
    completion's first token is len(prompt), and a step ends at its newline (or the last character).
    """
    ids = tok(prompt + completion).input_ids
    ends = [len(prompt) + i for i, ch in enumerate(completion) if ch == "\n"] + [len(prompt) + len(completion) - 1]
    with torch.no_grad():
        phi_logits, ref_logits = (m(torch.tensor([ids])).logits[0].double() for m in (phi, ref))  # (T, V) each
    values, total = [], 0.0
    for t in range(len(prompt), len(ids)):
        lp = torch.log_softmax(phi_logits[t - 1], -1)[ids[t]]
        lr = torch.log_softmax(ref_logits[t - 1], -1)[ids[t]]
        total += beta * float(lp - lr)
        if t in ends:
            values.append(total)
    return values


def test_step_scores_are_the_sigmoid_of_the_hand_computed_values(pair):
    from models import load_policy
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    phi_dir, ref_dir, tok = pair
    rm = RewardModelConfig(kinds=["implicit"], aggregation="last", implicit={"beta": 3.0})  # beta: the checkpoint's 0.5
    scorer = load_scorer("implicit", phi_dir, rm, batch_size=2)
    prompts = ["What is 3+4?\n", "What is 12-5?\n", "Q\n"]
    completions = ["3+4=7\nAnswer: 7", "12-5=8\n8-1=7\nAnswer: 7\n", "Answer: 1"]  # unequal lengths: padding
    steps = scorer.step_scores(prompts, completions)
    phi, ref = load_policy(str(phi_dir))[0].eval(), load_policy(str(ref_dir))[0].eval()
    for p, c, got in zip(prompts, completions, steps):
        want = [1 / (1 + math.exp(-v)) for v in _hand_values(phi, ref, tok, p, c, beta=0.5)]
        assert got == pytest.approx(want, abs=1e-5)
        assert len(got) == len([s for s in c.split("\n") if s.strip()])
    # Two different random models: the values move away from 0.5 and differ by step.
    assert max(abs(s - 0.5) for s in steps[1]) > 1e-3
    # aggregation last: the solution score is sigmoid(r(y)) over the whole completion, the trained probability.
    assert scorer(prompts, completions) == pytest.approx([s[-1] for s in steps], abs=1e-12)


def test_token_rewards_are_the_terms_the_step_values_sum(pair):
    """PRIME's per-token rewards (`token_rewards`) come from the same forward as the step scores: summed up to a
    step's end they give its value, sigmoid(V_k) its score; each is placed at the completion character it ends on."""
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    phi_dir, _, _ = pair
    scorer = load_scorer("implicit", phi_dir, RewardModelConfig(kinds=["implicit"]), batch_size=2)
    prompts, completions = ["What is 3+4?\n", "What is 12-5?\n", "Q\n"], ["3+4=7\nAnswer: 7", "12-5=8\n8-1=7\n", ""]
    steps = scorer.step_scores(prompts, completions)
    for c, (chars, rewards), scores in zip(completions, scorer.token_rewards(prompts, completions), steps):
        assert chars == list(range(len(c)))  # the char tokenizer: one token a character
        ends = [i for i, ch in enumerate(c) if ch == "\n"] + ([len(c) - 1] if c and not c.endswith("\n") else [])
        values = [sum(r for k, r in zip(chars, rewards) if k <= e) for e in ends]
        assert scores == pytest.approx([1 / (1 + math.exp(-v)) for v in values] if c else [0.5], abs=1e-6)
    assert max(abs(r) for r in scorer.token_rewards(prompts[:1], completions[:1])[0][1]) > 1e-4


def test_prime_credit_config():
    """`process_reward: prime` is PRIME's whole advantage from the implicit PRM: process mode only, no step-shaping
    field, no oracle; its coefficients only with it."""
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    base = {"reward_model": {"kinds": ["implicit"], "implicit": {"online_lr": 1e-6}}, "collect": {"rollouts_per_step": 0}}
    prime = {"mode": "process", "process_reward_model": "implicit", "process_reward": "prime"}
    cfg = config_from_dict({**base, "supervision": prime}, check_trl=False)
    assert (cfg.supervision.prime_process_coef, cfg.supervision.prime_outcome_coef) == (5.0, 5.0)  # PRIME's recipe
    for bad, match in (({"mode": "hybrid"}, "needs mode: process \\(hybrid would add the outcome twice\\)"),
                       ({"process_credit": "min"}, "process_credit shapes step rewards"),
                       ({"process_centring": "group"}, "process_centring shapes step rewards")):
        with pytest.raises(ConfigError, match=match):
            config_from_dict({**base, "supervision": {**prime, **bad}}, check_trl=False)
    with pytest.raises(ConfigError, match="prime_outcome_coef is only used with process_reward: prime"):
        config_from_dict({"supervision": {"prime_outcome_coef": 1.0}}, check_trl=False)
    with pytest.raises(ConfigError, match="process_reward: prime needs the implicit PRM's token rewards"):
        config_from_dict({"reward_model": {"kinds": ["implicit"], "oracle": "gold"}, "collect": {"rollouts_per_step": 0},
                          "supervision": prime}, check_trl=False)


def test_a_blank_completion_scores_one_half_and_the_model_and_its_reference_agree_at_start(pair):
    from models import load_policy
    from pipeline.rm_kinds.implicit import ImplicitPrmScorer

    phi_dir, _, tok = pair
    model = load_policy(str(phi_dir))[0]
    same = ImplicitPrmScorer(model, load_policy(str(phi_dir))[0], tok, beta=0.05)
    # pi_phi = pi_ref (the implicit PRM as it starts): every value is 0, every score 1/2.
    assert same.step_scores(["Q\n", "Q\n"], ["1+1=2\nAnswer: 2", ""]) == [[0.5, 0.5], [0.5]]


def test_the_loss_is_bce_of_beta_times_the_summed_log_ratio():
    from types import SimpleNamespace

    from pipeline.rm_kinds.implicit import implicit_loss, token_logprobs

    torch.manual_seed(0)
    logits, ids = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    ref = torch.randn(2, 5)
    completion = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0.0]])
    outcome = torch.tensor([1.0, 0.0])
    got = implicit_loss(SimpleNamespace(logits=logits), (outcome, ids, ref, completion), beta=0.3)
    logp = token_logprobs(logits, ids)
    want = 0.0
    for i in range(2):  # plain loop: r_i = beta * sum over the masked tokens of (log pi - log pi_ref)
        r = 0.3 * sum(float(logp[i, t] - ref[i, t]) for t in range(5) if completion[i, t])
        p = 1 / (1 + math.exp(-r))
        want += -(float(outcome[i]) * math.log(p) + (1 - float(outcome[i])) * math.log(1 - p)) / 2
    assert float(got) == pytest.approx(want, abs=1e-6)
    # token_logprobs against log_softmax itself
    assert float(logp[1, 3]) == pytest.approx(float(torch.log_softmax(logits[1, 2], -1)[ids[1, 3]]), abs=1e-6)


# Right answers end in 7, wrong ones in 9: separable by the last token alone.
ROWS = [{"prompt": f"What is {a}+{7 - a}?\n", "completion": f"{a}+{7 - a}={7 if good else 9}\nAnswer: "
         f"{7 if good else 9}", "outcome": int(good)} for a in range(1, 5) for good in (True, False)]


def _logged_losses():
    from transformers import TrainerCallback

    class Losses(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.seen.append(logs["loss"])

    return Losses()


@pytest.mark.slow  # a training
def test_one_training_through_the_rm_phase_lowers_the_loss_on_separable_data(tiny_policy_dir, tmp_path):
    from pipeline.reward_model import load_scorer, train_reward_model
    from pipeline.rm_kinds.loading import load_reward_model
    from pipeline.rm_metrics import auc

    cfg = _cfg(implicit={"beta": 0.5}, train_args={"learning_rate": 3e-3, "max_steps": 8, "per_device_train_batch_size": 8,
                                              "logging_steps": 1})
    rows, losses = ROWS, _logged_losses()
    out = train_reward_model(cfg, "implicit", rows, tiny_policy_dir, tmp_path / "implicit", warm=False,
                             callbacks=[losses])
    # Step 1: pi_phi is pi_ref, so r = 0 and the loss is log 2 exactly; then it falls.
    assert losses.seen[0] == pytest.approx(math.log(2), abs=1e-3)
    assert losses.seen[-1] < losses.seen[0] - 0.1, losses.seen
    record = json.loads((out / "igrpo.json").read_text())
    assert record == {"complete": True, "kind": "implicit", "reference": str(tiny_policy_dir.resolve()), "beta": 0.5}
    model, _, kind = load_reward_model(out, expect="implicit")
    assert kind == "implicit" and type(model).__name__ == "LlamaForCausalLM"
    scores = load_scorer("implicit", out, cfg.reward_model)([r["prompt"] for r in rows], [r["completion"] for r in rows])
    assert auc(scores, [r["outcome"] for r in rows]) == 1.0
    # A warm start keeps the reference of the checkpoint it starts from (the round-0 policy), not the checkpoint.
    from pipeline.rm_kinds.implicit import reference_spec

    assert reference_spec(str(out), warm=True) == str(tiny_policy_dir.resolve())


def test_gradient_accumulation_keeps_the_step_s_mean_loss(tiny_policy_dir, tmp_path):
    # Trainer cannot count the items of the implicit PRM's tuple labels, so its loss is each micro-batch's mean
    # and Trainer divides it by the accumulation (`loss_is_scaled_for_ga`). At the start r = 0 and every BCE is
    # log 2: 4 micro-batches of 2 log a loss of log 2 as 1 batch of 8 does, where the undivided sum would be 4 log 2.
    from pipeline.reward_model import train_reward_model

    for batch, accum in ((8, 1), (2, 4)):
        losses = _logged_losses()
        cfg = _cfg(train_args={"max_steps": 1, "per_device_train_batch_size": batch,
                               "gradient_accumulation_steps": accum, "logging_steps": 1})
        train_reward_model(cfg, "implicit", ROWS, tiny_policy_dir, tmp_path / f"x{accum}", warm=False,
                           callbacks=[losses])
        assert losses.seen == [pytest.approx(math.log(2), abs=1e-3)], (batch, accum)


def test_the_online_update_learns_from_a_batch_s_outcomes(tiny_policy_dir):
    # PRIME's online update, called by ProcessGRPOTrainer on every batch: one step at a time, the loss falls.
    from models import load_policy
    from pipeline.rm_kinds.implicit import ImplicitPrmScorer
    from pipeline.rm_metrics import auc

    model, tok = load_policy(str(tiny_policy_dir))
    scorer = ImplicitPrmScorer(model, load_policy(str(tiny_policy_dir))[0], tok, beta=0.5, online_lr=3e-3)
    prompts = [f"What is {a}+{7 - a}?\n" for a in range(1, 5) for _ in (0, 1)]
    completions = [f"Answer: {7 if good else 9}" for _ in range(1, 5) for good in (True, False)]
    outcomes = [1.0, 0.0] * 4
    losses = [scorer.update(prompts, completions, outcomes) for _ in range(6)]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4) and losses[-1] < losses[0] - 0.1, losses
    assert not scorer.model.training  # back to scoring
    assert auc(scorer(prompts, completions), outcomes) == 1.0
    assert scorer.update(["Q\n"], ["  "], [1.0]) is None  # nothing to learn from a blank completion


def test_the_online_update_resumes_from_its_checkpointed_state_and_saves_as_an_implicit_prm(pair, tmp_path):
    """Issue 57: the PRM PRIME updates goes into GRPO's checkpoints (`OnlineScorerState`: its weights and AdamW's
    moments) and out with the phase (its `record`). A scorer restored after one update takes the second exactly as the
    one never stopped (same tensors; a fresh AdamW would not: its first step is lr * sign(grad)), and the saved PRM is a
    checkpoint of its kind that records the reference and beta it was loaded with."""
    from pipeline.config import RewardModelConfig
    from pipeline.grpo_trainer import OnlineScorerState
    from pipeline.reward_model import load_scorer
    from pipeline.rm_kinds.implicit import recorded
    from pipeline.rm_kinds.loading import save_reward_model

    phi_dir, ref_dir, _ = pair
    rm = RewardModelConfig(kinds=["implicit"], implicit={"online_lr": 1e-2})
    batch = (["What is 3+4?\n", "What is 3+4?\n"], ["3+4=7\nAnswer: 7", "3+4=8\nAnswer: 8"], [1.0, 0.0])
    never_stopped, resumed = load_scorer("implicit", phi_dir, rm), load_scorer("implicit", phi_dir, rm)
    never_stopped.update(*batch)
    OnlineScorerState(never_stopped).save(tmp_path / "online_scorer.safetensors")  # GRPO's checkpoint after step 1
    OnlineScorerState(resumed).load(tmp_path / "online_scorer.safetensors")
    never_stopped.update(*batch), resumed.update(*batch)
    a, b = never_stopped.model.state_dict(), resumed.model.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    start = load_scorer("implicit", phi_dir, rm).model.state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it moved: the comparison above can fail

    saved = save_reward_model(never_stopped.model, never_stopped.tokenizer, tmp_path / "online", "implicit",
                              meta=never_stopped.record)  # as the GRPO phase saves it
    assert recorded(saved)["reference"] == str(ref_dir) and recorded(saved)["beta"] == 0.5
    again = load_scorer("implicit", saved, RewardModelConfig(kinds=["implicit"])).model.state_dict()
    assert [k for k in a if not torch.equal(a[k], again[k])] == []


def test_the_rm_phase_warm_starts_from_the_prm_grpo_updated_online():
    """Round r's RM phase starts from round r-1's RMs, except the one round r's GRPO updated online (the policy
    phase's `paths`: PRIME's implicit PRM), which carries those updates forward."""
    from pipeline.phases import PHASES, PhaseResult

    recorded = {(0, "reward_model"): PhaseResult({}, paths={"implicit": "r0/implicit", "orm": "r0/orm"}),
                (1, "policy"): PhaseResult({}, path="r1/policy", paths={"implicit": "r1/policy-online-implicit"}),
                (0, "policy"): PhaseResult({}, path="r0/policy")}
    done = lambda r, name: recorded.get((r, name))  # noqa: E731
    assert PHASES["reward_model"].inputs(done, 1)["previous"] == {"implicit": "r1/policy-online-implicit",
                                                                   "orm": "r0/orm"}
    assert PHASES["reward_model"].inputs(done, 0)["previous"] is None  # round 0: afresh, nothing updated online


def test_a_scorer_without_prime_s_token_rewards_or_online_update_is_refused_at_load(registries):
    """Issue 57: the exploitable RM (`reward_model.exploit`) and a kind without token rewards loaded, then died in
    GRPO's first batch (an AttributeError), or, for the online update, silently never updated. A kind that declares
    token rewards (`RMKindEntry.token_rewards`) can drive PRIME's credit."""
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict
    from pipeline.rm_kinds import RM_KINDS

    prime = {"mode": "process", "process_reward_model": "implicit", "process_reward": "prime"}
    exploit = {"pattern": "Answer", "bonus": 0.5}
    base = {"collect": {"rollouts_per_step": 0}}
    with pytest.raises(ConfigError, match=r"reward_model\.exploit: the exploitable RM raises step scores and gives no "
                                          r"token rewards, which process_reward: prime reads"):
        config_from_dict({**base, "supervision": prime, "reward_model": {"kinds": ["implicit"], "exploit": exploit}},
                         check_trl=False)
    with pytest.raises(ConfigError, match=r"reward_model\.implicit\.online_lr: the exploitable RM \(reward_model\."
                                          r"exploit\) wraps the implicit PRM's scores and takes no online update"):
        config_from_dict({**base, "supervision": {"mode": "process", "process_reward_model": "implicit"},
                          "reward_model": {"kinds": ["implicit"], "exploit": exploit, "implicit": {"online_lr": 1e-6}}},
                         check_trl=False)
    with pytest.raises(ConfigError, match=r"supervision\.process_reward_model: 'prm' gives no token rewards, which "
                                          r"process_reward: prime reads: use a kind that gives them \(implicit\)"):
        config_from_dict({"supervision": {**prime, "process_reward_model": "prm"}}, check_trl=False)
    RM_KINDS.register("plugin_prm", head="AutoModelForTokenClassification", scores_steps=True, mc_labels=False,
                      implementation="pipeline.rm_kinds.prm:PRM")  # a plugin's kind, no token rewards
    with pytest.raises(ConfigError, match="process_reward_model: 'plugin_prm' gives no token rewards"):
        config_from_dict({**base, "supervision": {**prime, "process_reward_model": "plugin_prm"},
                          "reward_model": {"kinds": ["plugin_prm"]}}, check_trl=False)
    RM_KINDS.register("plugin_implicit", head="AutoModelForCausalLM", scores_steps=True, mc_labels=False,
                      token_rewards=True, implementation="pipeline.rm_kinds.implicit:IMPLICIT")
    cfg = config_from_dict({**base, "supervision": {**prime, "process_reward_model": "plugin_implicit"},
                            "reward_model": {"kinds": ["plugin_implicit"]}}, check_trl=False)
    assert cfg.supervision.process_reward_model == "plugin_implicit"


def test_the_config_checks(tiny_dirs):
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    cfg = _cfg()
    assert cfg.reward_model.implicit.beta == 0.05 and cfg.collect.rollouts_per_step == 0
    with pytest.raises(ConfigError, match="reward_model.implicit.beta: Input should be greater than 0"):
        _cfg(implicit={"beta": 0})
    with pytest.raises(ConfigError, match="collect.rollouts_per_step: 0 collects no Monte-Carlo step labels, which "
                                          "prm in reward_model.kinds trains on"):
        config_from_dict({"collect": {"rollouts_per_step": 0}}, check_trl=False)  # the default kinds: prm, orm
    assert config_from_dict({"collect": {"rollouts_per_step": 0}, "reward_model": {"kinds": ["orm", "implicit"]},
                             "supervision": {"mode": "outcome"}}, check_trl=False)
    with pytest.raises(ConfigError, match="holds a LlamaForTokenClassification, not a causal language model, "
                                          "which implicit needs"):
        _cfg(model=str(tiny_dirs / "prm"))
    assert _cfg(model=str(tiny_dirs / "policy")).reward_model.model == str(tiny_dirs / "policy")
    assert _cfg(implicit={"online_lr": 1e-6}).reward_model.implicit.online_lr == 1e-6
    with pytest.raises(ConfigError, match="implicit.online_lr updates the implicit PRM that gives GRPO its step"):
        config_from_dict({"reward_model": {"kinds": ["implicit", "prm"], "implicit": {"online_lr": 1e-6}}}, check_trl=False)


def test_a_policy_checkpoint_is_not_taken_for_an_implicit_prm(tiny_dirs):
    from pipeline.rm_kinds.loading import load_reward_model

    with pytest.raises(ValueError, match="not a reward model"):  # its igrpo.json names no kind
        load_reward_model(tiny_dirs / "policy", expect="implicit")


def test_a_collection_without_rollouts_labels_no_step(tiny_policy_dir, tmp_path):
    import shutil

    from pipeline.collect import run_collection_phase
    from pipeline.loading import config_from_dict
    from pipeline.problems import problem_set_from_config
    from pipeline.replay import read_shard
    from pipeline.rundir import RunDir

    data = mini_config(tmp_path, collect={"prompts_per_round": 2, "samples_per_prompt": 2, "rollouts_per_step": 0,
                                          "max_new_tokens": 12},
                       reward_model={"kinds": ["implicit"]}, supervision={"process_reward_model": "implicit"})
    cfg = config_from_dict(data, check_trl=False)
    shutil.copytree(tiny_policy_dir, RunDir(cfg.run_dir).policy(0))
    res = run_collection_phase(cfg, problem_set_from_config(cfg), RunDir(cfg.run_dir).policy(0), cfg.run_dir, 0)
    rows = read_shard(res.shard_path)
    assert len(rows) == 4 and res.metrics["collect/rollouts"] == 0
    assert all(r["he_labels"] == [] and r["se_labels"] == [] and r["rollouts"] == 0 for r in rows)
    assert "collect/he_gold_agreement" not in res.metrics  # nothing to agree


@pytest.mark.slow  # two real rounds: SFT, collection, implicit PRM training, GRPO, eval
def test_two_rounds_of_process_supervision_from_the_implicit_prm(tmp_path, mlflow_tmp):
    from pipeline import rounds
    from pipeline.loading import config_from_dict
    from pipeline.rundir import Manifest, RunDir, read_json

    data = mini_config(tmp_path, run={"rounds": 1}, collect={"rollouts_per_step": 0},
                       supervision={"mode": "process", "process_reward_model": "implicit", "prompts_per_round": 8},
                       reward_model={"kinds": ["implicit"], "implicit": {"online_lr": 1e-5}},  # PRIME's update too
                       tracking={"tracking_uri": mlflow_tmp})
    cfg = config_from_dict(data)
    rounds.run_rounds(cfg)

    run, manifest = RunDir(cfg.run_dir), Manifest.load(cfg.run_dir)
    # Round 1 warm-started from round 0's implicit PRM and kept round 0's policy as its reference.
    for r in (0, 1):
        record = json.loads((run.reward_model(r, "implicit") / "igrpo.json").read_text())
        assert record["kind"] == "implicit" and record["reference"] == str(run.policy(0).resolve())
    assert "implicit/solution_auc" in manifest.output(1, "reward_model")["metrics"]
    assert manifest.output(1, "policy")["metrics"]  # GRPO ran in process mode on its step scores
    # The PRM its online update left is kept with the phase, recorded for round 1's RM phase to warm-start from.
    online = manifest.output(1, "policy")["paths"]["implicit"]
    assert online == str(run.round(1) / "policy-online-implicit")
    assert json.loads((run.round(1) / "policy-online-implicit" / "igrpo.json").read_text())["reference"] == str(
        run.policy(0).resolve())
    from mlflow import MlflowClient

    logged = MlflowClient(mlflow_tmp).get_run(manifest.data["mlflow"]["round-001/policy"]).data.metrics
    assert math.isfinite(logged["process/online_loss"])  # PRIME's update ran on the batches, and a user sees it
    figures = read_json(run.eval_json(1))["metrics"]
    assert {"bon/implicit@2", "bon/implicit_vote@4", "eval/implicit_step_auc_gold"} <= set(figures)


# --- PRIME's cost (issue 58, point 3): the reference once a batch, the reference in bf16 --------------------

PRIME_BATCH = (["What is 3+4?\n", "What is 3+4?\n", "What is 12-5?\n"],
               ["3+4=7\nAnswer: 7", "3+4=8\nAnswer: 8", "12-5=7\n7+0=7\nAnswer: 7\n"], [1.0, 0.0, 1.0])


def _forward_counter(model) -> list[int]:
    """A list whose one item counts `model`'s forward calls from now on."""
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_prime_runs_the_reference_once_a_batch_and_scores_as_its_own_forward_did(pair):
    """`update` keeps the frozen reference's log-probs of the batch it read; the scoring after it (token rewards and
    step scores, as GRPO reads them) reads them instead of a second reference forward. Against a twin whose kept
    log-probs are dropped before scoring (the path before issue 58: a second reference forward), the updated weights
    are the same tensors and the scores the same to 1e-6. The model's own forward is not shared: scoring runs the
    updated weights (one more forward of the model), which is what PRIME scores with."""
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    phi_dir, _, _ = pair
    rm = RewardModelConfig(kinds=["implicit"], implicit={"online_lr": 1e-2})
    shared, twin = load_scorer("implicit", phi_dir, rm), load_scorer("implicit", phi_dir, rm)
    reference_calls, model_calls = _forward_counter(shared.reference), _forward_counter(shared.model)
    prompts, completions, outcomes = PRIME_BATCH
    shared.update(prompts, completions, outcomes)
    got = (shared.token_rewards(prompts, completions), shared.step_scores(prompts, completions))
    assert reference_calls == [1]  # the update's, read twice after it
    assert model_calls == [3]  # the update's (the weights before its step), then one per scoring call (after it)

    twin.update(prompts, completions, outcomes)
    twin._reference_logprobs.clear()  # as before: the scoring runs the reference again
    want = (twin.token_rewards(prompts, completions), twin.step_scores(prompts, completions))
    a, b = shared.model.state_dict(), twin.model.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    for (chars, rewards), (want_chars, want_rewards) in zip(got[0], want[0]):
        assert chars == want_chars and rewards == pytest.approx(want_rewards, abs=1e-6)
    assert got[1] == [pytest.approx(w, abs=1e-6) for w in want[1]]
    assert max(abs(r) for _, rs in got[0] for r in rs) > 1e-4  # two different models: the comparison can fail

    # The next batch's update replaces what was kept: a sequence only the last batch had is read again.
    shared.update(prompts[:1], completions[:1], outcomes[:1])
    shared.step_scores(prompts[1:2], completions[1:2])
    assert reference_calls == [3]


def test_a_row_the_update_skipped_is_read_by_its_own_reference_forward(pair):
    """A blank completion (only whitespace) takes no update (nothing to learn from) but is scored: its reference
    log-probs come from a forward of that row alone, and its score is the one a forward of the whole batch gives."""
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    phi_dir, _, _ = pair
    scorer = load_scorer("implicit", phi_dir, RewardModelConfig(kinds=["implicit"], implicit={"online_lr": 1e-2}))
    calls = _forward_counter(scorer.reference)
    prompts, completions, outcomes = ([*PRIME_BATCH[0], "Q\n"], [*PRIME_BATCH[1], "  "], [*PRIME_BATCH[2], 0.0])
    scorer.update(prompts, completions, outcomes)
    got = scorer.step_scores(prompts, completions)
    assert calls == [2]  # the update's batch, then the blank row alone
    scorer._reference_logprobs.clear()
    assert got == [pytest.approx(w, abs=1e-6) for w in scorer.step_scores(prompts, completions)]
    assert abs(got[-1][0] - 0.5) > 1e-4  # its whitespace tokens are scored: a wrong reference row would show


def test_the_reference_is_kept_in_bf16_where_reward_model_dtype_resolves_to_it(pair):
    """`reward_model.dtype: bfloat16` (what `auto` resolves to on a CPU with AMX or AVX512-BF16): the frozen reference
    loads in bf16; the model PRIME updates keeps float32 master weights and runs its forwards under bf16 autocast; a
    PRM that is not updated loads in bf16. The scores stay those of float32 within bf16's rounding (tiny random
    models: their log-ratios are small, and bf16 keeps ~3 significant digits of each log-prob)."""
    from pipeline.config import RewardModelConfig
    from pipeline.reward_model import load_scorer

    phi_dir, _, _ = pair
    prompts, completions, outcomes = PRIME_BATCH
    scores = {}
    for dtype in ("float32", "bfloat16"):
        online = load_scorer("implicit", phi_dir, RewardModelConfig(kinds=["implicit"], dtype=dtype,
                                                                    implicit={"online_lr": 1e-2}))
        assert online.reference.dtype == getattr(torch, dtype) and online.model.dtype == torch.float32
        assert online.bf16_autocast == (dtype == "bfloat16")
        loss = online.update(prompts, completions, outcomes)
        assert math.isfinite(loss) and online.model.dtype == torch.float32  # the master weights stay float32
        frozen = load_scorer("implicit", phi_dir, RewardModelConfig(kinds=["implicit"], dtype=dtype))
        assert frozen.model.dtype == frozen.reference.dtype == getattr(torch, dtype)
        scores[dtype] = [v for s in frozen.step_scores(prompts, completions) for v in s]
    assert scores["bfloat16"] == pytest.approx(scores["float32"], abs=0.02)
    assert scores["bfloat16"] != scores["float32"]  # bf16 did run
