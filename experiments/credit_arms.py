"""The credit study's arms: each one's `--set` overrides of its task's config (experiments/credit_study.py runs them
on the tiny model's tasks, experiments/smollm2_control.py two of them on SmolLM2)."""

# PAV's form: the outcome advantage plus the progress of the token's own step, unnormalised (REFERENCE.md).
PROGRESS = ["supervision.mode=hybrid", "supervision.process_reward=progress", "supervision.process_credit=step"]
ARMS = {
    "verifier": ["supervision.mode=outcome"],
    "oracle": ["supervision.mode=process", "reward_model.oracle=gold"],
    "oracle-progress": ["reward_model.oracle=gold", *PROGRESS],
    "mc-progress": ["reward_model.oracle=mc", "reward_model.mc_rollouts=4", *PROGRESS],
    # At the verifier's wall-clock: online MC's GRPO phase took 3.7x the verifier's a round in issue 47's study
    # (medians of its units' train_runtime, 165 s against 44.5 s), so 80 / 3.7 ~ 22 steps of 8 prompts.
    "mc-progress-wc": ["reward_model.oracle=mc", "reward_model.mc_rollouts=4", *PROGRESS, "grpo.max_steps=22",
                       "supervision.prompts_per_round=176"],
    "prm-progress": PROGRESS,
    "implicit": ["supervision.mode=hybrid", "reward_model.kinds=[implicit]", "supervision.process_reward_model=implicit",
                 "collect.rollouts_per_step=0"],
    # PRIME's online lr is 1e-6 for 7B models; the tiny RM trains offline at 3e-4: 1e-5 sits between, untuned.
    "implicit-prime": ["supervision.mode=process", "reward_model.kinds=[implicit]",
                       "supervision.process_reward_model=implicit", "supervision.process_reward=prime",
                       "reward_model.implicit.online_lr=1e-5", "collect.rollouts_per_step=0"],
    "labeltoken-progress": ["reward_model.head=label_tokens", *PROGRESS],
}
