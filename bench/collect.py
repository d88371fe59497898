"""Collection-phase figures on one bootstrapped policy, in one run:

1. labelling throughput (rollouts/s, generated tokens/s) against raw batched generation of the same model
   on the same number of sequences (the limit); goal: labelling tokens/s >= 0.8x raw;
2. first_error against exhaustive: rollouts spent and agreement with the gold step labels
   (goal: <= 50% of the rollouts, agreement within 2 points);
3. agreement of HE and SE (threshold 0.5) with gold labels against N (Math-Shepherd §5.2: HE degrades
   as N grows, SE improves).
Run: python -m bench.collect [--prompts 64 --samples 8]
"""

from __future__ import annotations

import argparse

from bench._common import bootstrapped_policy, quickstart
from models import load_policy
from pipeline.collect import agreement, label_exhaustive, label_first_error, make_request
from pipeline.generation import sample
from pipeline.problems import problem_set_from_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="rollouts per step for parts 1 and 2")
    ap.add_argument("--steps", type=int, default=None, help="operations per problem (default: the quickstart's 2-3)")
    a = ap.parse_args()
    steps = [f"problems.arithmetic.min_steps={a.steps}", f"problems.arithmetic.max_steps={a.steps}"] if a.steps else []
    cfg = quickstart(steps)
    c = cfg.collect
    ps = problem_set_from_config(cfg)
    model, tok = load_policy(str(bootstrapped_policy(cfg)))
    opts = dict(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens, batch_size=c.batch_size)
    problems = ps.train[: a.prompts]
    fresh = sample(model, tok, [p.prompt for p in problems], a.samples, seed=0, **opts)
    items = [(p, t, ids) for p, texts, row_ids in zip(problems, fresh.texts, fresh.ids) for t, ids in zip(texts, row_ids)]
    gold = [ps.gold_step_labels(t, p) for p, t, _ in items]
    reqs = [make_request(ps, p, tok, ids) for p, _, ids in items]

    stats = {}

    def completer_for(n_calls_key):
        def completer(prefixes, n):
            out = sample(model, tok, prefixes, n, seed=len(stats), **opts)
            s = stats.setdefault(n_calls_key, {"seqs": 0, "tokens": 0, "seconds": 0.0})
            s["seqs"] += len(prefixes) * n
            s["tokens"] += out.total_tokens
            s["seconds"] += out.seconds
            return out.texts
        return completer

    # 1. Labelling throughput against raw generation of the same number of sequences.
    import time

    t0 = time.perf_counter()
    ex = label_exhaustive(ps, completer_for("exhaustive"), reqs, a.n)
    label_seconds = time.perf_counter() - t0
    e = stats["exhaustive"]
    # The limit: the same rollout inputs (prompt + step prefix ids), generated raw, with no labelling around them.
    raw_texts = [c for r in reqs for c, settled in zip(r.continuations, r.settled) if settled is None]
    raw = sample(model, tok, raw_texts, a.n, seed=99, **opts)
    print(f"{len(items)} samples, {sum(len(r.prefixes) for r in reqs)} steps, N = {a.n}")
    print("\n1. throughput              rollouts/s   tokens/s")
    lab_tps = e["tokens"] / label_seconds
    raw_tps = raw.total_tokens / raw.seconds
    print(f"   labelling (exhaustive)  {e['seqs'] / label_seconds:10.1f} {lab_tps:10.0f}")
    print(f"   raw batched generation  {len(raw_texts) * a.n / raw.seconds:10.1f} {raw_tps:10.0f}")
    print(f"   ratio labelling/raw tokens/s = {lab_tps / raw_tps:.2f}  (goal >= 0.8)")

    # 2. first_error against exhaustive.
    fe = label_first_error(ps, completer_for("first_error"), reqs, a.n)
    r_ex, r_fe = sum(x.rollouts for x in ex), sum(x.rollouts for x in fe)
    ag_ex, ag_fe = agreement([x.he for x in ex], gold), agreement([x.he for x in fe], gold)
    print("\n2. strategy      rollouts   share   HE agreement with gold")
    print(f"   exhaustive   {r_ex:9d}   100%   {ag_ex:.3f}")
    print(f"   first_error  {r_fe:9d}   {100 * r_fe / max(r_ex, 1):3.0f}%   {ag_fe:.3f}   (goal <= 50%, within 0.02)")

    # 3. Agreement with gold against N.
    print("\n3.  N   HE agreement   SE agreement (>= 0.5)")
    for n in (1, 2, 4, 8, 16):
        labels = label_exhaustive(ps, completer_for(f"n{n}"), reqs, n)
        print(f"   {n:2d}   {agreement([x.he for x in labels], gold):.3f}          {agreement([x.se for x in labels], gold):.3f}")


if __name__ == "__main__":
    main()
