"""Collection-phase figures on one bootstrapped policy, in one run:

1. labelling throughput (rollouts/s, generated tokens/s) against raw batched generation of the same rollout
   inputs with the same seed (the limit: the same tokens, with no labelling around them), `--repeats` times,
   interleaved, each repeat under its own seed after a warm-up call; goal (issue 49): labelling tokens/s >= 1.0x
   raw, the median over repeats (printed with its min-max);
2. first_error against exhaustive: rollouts spent and agreement with the gold step labels
   (goal: <= 50% of the rollouts, agreement within 2 points);
3. agreement of HE and SE (threshold 0.5) with gold labels against N (Math-Shepherd §5.2: HE degrades
   as N grows, SE improves).
Run: python -m bench.collect [--prompts 64 --samples 8 --repeats 3]
"""

from __future__ import annotations

import argparse
import time

from bench._common import bootstrapped_policy, quickstart, spread
from models import load_policy
from pipeline.mc_labels import agreement, label_exhaustive, label_first_error, make_request
from pipeline.generation import sample
from pipeline.problems import problem_set_from_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="rollouts per step for parts 1 and 2")
    ap.add_argument("--steps", type=int, default=None, help="operations per problem (default: the quickstart's 2-3)")
    ap.add_argument("--repeats", type=int, default=3, help="part 1's runs of each arm, interleaved (default 3)")
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

    called = set()  # the completers called so far: each new one samples under the next seed

    def completer_for(n_calls_key):
        def completer(prefixes, n):
            out = sample(model, tok, prefixes, n, seed=len(called), **opts)
            called.add(n_calls_key)
            return out.texts
        return completer

    print(f"{len(items)} samples, {sum(len(r.prefixes) for r in reqs)} steps, N = {a.n}")
    ex = throughput(ps, model, tok, reqs, a, opts)

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


def throughput(ps, model, tok, reqs, a, opts) -> list:
    """Part 1: exhaustive labelling against raw generation of the same rollout inputs under the same seed (so the
    same tokens: the difference is what labelling adds), `a.repeats` times, the arms alternating which goes first,
    after one warm-up call. Prints each repeat and the ratio of tokens/s, labelling/raw: median (min-max)."""
    # The limit: the same rollout inputs (prompt + step prefix ids), generated raw, with no labelling around them.
    raw_inputs = [c for r in reqs for c, settled in zip(r.continuations, r.settled) if settled is None]
    sample(model, tok, raw_inputs[: opts["batch_size"]], 1, seed=0, **opts)  # one-off costs land in no arm
    print("\n1. throughput              rollouts/s   tokens/s")
    ratios = []
    for r in range(a.repeats):
        figures, tokens_of = {}, {}
        for arm in ("labelling", "raw") if r % 2 == 0 else ("raw", "labelling"):
            made = []  # the Samples of each generation call

            def completer(prefixes, n, seed=r):
                made.append(sample(model, tok, prefixes, n, seed=seed, **opts))
                return made[-1].texts

            t0 = time.perf_counter()
            if arm == "raw":
                completer(raw_inputs, a.n)
            else:
                labels = label_exhaustive(ps, completer, reqs, a.n)
            seconds = time.perf_counter() - t0
            seqs, tokens = sum(len(m.num_tokens) * a.n for m in made), sum(m.total_tokens for m in made)
            figures[arm], tokens_of[arm] = tokens / seconds, tokens
            print(f"   {arm:<9} (repeat {r + 1})  {seqs / seconds:10.1f} {tokens / seconds:10.0f}", flush=True)
        assert tokens_of["labelling"] == tokens_of["raw"], "the arms generated different tokens: not like for like"
        ratios.append(figures["labelling"] / figures["raw"])
    print(f"   ratio labelling/raw tokens/s = {spread(ratios)}  (goal >= 1.0; median (min-max) of {a.repeats} repeats)")
    return labels


if __name__ == "__main__":
    main()
