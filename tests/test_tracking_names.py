"""MLflow's names of the pipeline's metrics (`tracking.metric_name`): the headline figures are the first charts of
the parent run's page, no two metrics share a name, and every name is one MLflow accepts."""

from __future__ import annotations

import pytest
from mlflow.utils.validation import _validate_metric_name

from pipeline.rm_kinds import RM_KINDS
from pipeline.tracking import HEADLINE_SECTION, metric_key, metric_name

KS = (1, 2, 4, 8, 16)  # Pass@K / Maj@K's K up to 16: 16 sorts between 1 and 2, as in MLflow's own order
HEADLINE = ["eval/greedy", *(f"eval/{what}@{k}" for what in ("pass", "maj") for k in KS)]


def pipeline_keys() -> list[str]:
    """One key of each shape the phases log on the parent run (docs/tracking.md), for every registered RM kind."""
    keys = ["eval/completions_per_s", "collect/he_gold_agreement", "collect/imputed_label_share",
            "collect/rollouts_per_s", "policy/reward_end", "policy/process_variance_share",
            "hybrid/process_variance_share", "rm/train_rows", "sft/train_loss"]
    for kind in RM_KINDS:
        keys += [f"{kind}/mean_score", f"{kind}/step_auc_gold", f"eval/{kind}_step_auc_gold",
                 f"eval/{kind}_step_auc_gold_within_position", f"monitor/{kind}_gap", f"monitor/{kind}_alarm"]
        keys += [f"bon/{kind}{vote}@{n}" for vote in ("", "_vote") for n in (2, 4, 16)]
    keys += [f"bon/{how}@{n}" for how in ("majority", "random") for n in (2, 4, 16)]
    return HEADLINE + keys


def chart_order(names: list[str]) -> list[tuple[str, list[str]]]:
    """The run page's sections and their charts, in MLflow 3.17's order for a page opened the first time
    (`RunsChartsCardConfig.getBaseChartAndSectionConfigs`, mlflow/server/js/src/experiment-tracking/components/
    runs-charts/runs-charts.types.ts): a chart's section is its name up to the last '/' (a name without one goes
    to "Model metrics", after all the others); sections sorted by name, charts in a section by full name, both
    with JavaScript's `sort()`, i.e. by UTF-16 code unit, which for these ASCII names is Python's `sorted`."""
    sections: dict[str, list[str]] = {}
    for name in sorted(names):
        sections.setdefault(name.rpartition("/")[0] or "Model metrics", []).append(name)
    return sorted(sections.items(), key=lambda item: (item[0] == "Model metrics", item[0]))


def test_the_headline_figures_are_the_first_section_of_the_run_page():
    order = chart_order([metric_name(k) for k in pipeline_keys()])
    first, charts = order[0]
    assert first == HEADLINE_SECTION
    # Greedy, then Maj@K and Pass@K in K's text order: the first row of three is greedy, maj_at_1, maj_at_16.
    assert charts == ["accuracy/greedy", *(f"accuracy/maj_at_{k}" for k in (1, 16, 2, 4, 8)),
                      *(f"accuracy/pass_at_{k}" for k in (1, 16, 2, 4, 8))]
    # The other families keep their names and sections: `bon` (which came first before) now comes second.
    others = pipeline_keys()[len(HEADLINE):]
    assert [section for section, _ in order[1:]] == sorted({k.rpartition("/")[0] for k in others})
    assert order[1][0] == "bon"


def test_the_headline_section_also_sorts_first_when_the_ui_compares_by_locale():
    # Charts found after the page opened are placed by `localeCompare`, which ignores case at first: the
    # headline section must come first that way too.
    sections = {metric_name(k).rpartition("/")[0] for k in pipeline_keys()}
    assert min(sections, key=str.casefold) == HEADLINE_SECTION


def test_names_are_one_to_one_and_metric_key_reverses_them():
    keys = pipeline_keys()
    names = [metric_name(k) for k in keys]
    assert len(set(names)) == len(set(keys))
    assert [metric_key(n) for n in names] == keys


@pytest.mark.parametrize("key", pipeline_keys())
def test_every_name_is_one_mlflow_accepts(key):
    name = metric_name(key)
    assert "@" not in name
    _validate_metric_name(name)  # raises MlflowException for a character MLflow does not allow


def test_only_the_headline_figures_change_section():
    # Only '@' is respelled elsewhere: eval's other metrics stay in `eval`, best-of-N's N keeps its spelling.
    assert metric_name("eval/prm_step_auc_gold") == "eval/prm_step_auc_gold"
    assert metric_name("eval/completions_per_s") == "eval/completions_per_s"
    assert metric_name("bon/prm_vote@4") == "bon/prm_vote_at_4"
    assert metric_name("eval/greedy_extra") == "eval/greedy_extra"
