"""The ``data_efficiency`` config reader (config/data_efficiency.py): bad keys name their path."""

import pytest

from dslaunch.config.data_efficiency import data_efficiency_config, data_efficiency_problems
from dslaunch.config.errors import ConfigError
from dslaunch.config.resolve import resolve_config

METRIC = {"index_to_sample_path": "an/index_to_sample", "index_to_metric_path": "an/index_to_metric",
          "difficulty_type": "value", "clustering_type": "schedule_based",
          "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
          "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}


def _section(**metric_changes):
    metric = {**METRIC, **metric_changes}
    return {"enabled": True, "seed": 7, "data_sampling": {
        "enabled": True, "num_epochs": 2, "curriculum_learning": {
            "enabled": True, "data_cluster_path": "clusters",
            "curriculum_metrics": {"seqlen": metric}}}}


def test_a_valid_section_has_no_problems_and_gets_deepspeeds_defaults():
    assert data_efficiency_problems(_section()) == []
    full = data_efficiency_config(_section())
    assert full["seed"] == 7 and full["data_sampling"]["num_workers"] == 0
    assert full["data_sampling"]["num_epochs"] == 2
    assert full["data_routing"] == {}
    assert data_efficiency_config(None)["seed"] == 1234


@pytest.mark.parametrize("change, path", [
    ({"difficulty_type": "hard"}, "curriculum_metrics.seqlen.difficulty_type"),
    ({"clustering_type": "kmeans"}, "curriculum_metrics.seqlen.clustering_type"),
    ({"index_to_metric_path": None}, "curriculum_metrics.seqlen.index_to_metric_path"),
    ({"schedule_config": {"total_curriculum_step": 10}},
     "curriculum_metrics.seqlen.schedule_config.difficulty_step"),
    ({"min_difficulty": 100}, "curriculum_metrics.seqlen.min_difficulty"),
    ({"bogus": 1}, "curriculum_metrics.seqlen.bogus"),
])
def test_a_bad_metric_names_its_key_path(change, path):
    problems = data_efficiency_problems(_section(**change))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"data_efficiency.data_sampling.curriculum_learning.{path}:")


def test_percentile_needs_no_metric_file_and_is_capped_at_100():
    assert data_efficiency_problems(_section(difficulty_type="percentile",
                                             index_to_metric_path=None, max_difficulty=100)) == []
    bad = data_efficiency_problems(_section(difficulty_type="percentile", max_difficulty=150))
    assert bad and "max_difficulty" in bad[0]


def test_top_level_and_sampling_keys_are_checked():
    section = _section()
    section["seed"] = "x"
    section["data_sampling"]["num_epochs"] = 0
    section["data_sampling"]["curriculum_learning"]["data_cluster_path"] = None
    problems = data_efficiency_problems(section)
    assert [p.split(":")[0] for p in problems] == [
        "data_efficiency.seed", "data_efficiency.data_sampling.num_epochs",
        "data_efficiency.data_sampling.curriculum_learning.data_cluster_path"]


def test_resolve_checks_the_section_and_dynamic_batching_keys():
    base = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2}
    bad = {**base, "data_efficiency": _section(difficulty_type="hard")}
    with pytest.raises(ConfigError, match="curriculum_metrics.seqlen.difficulty_type"):
        resolve_config(bad, world_size=2)
    resolve_config({**base, "data_efficiency": _section()}, world_size=2)  # sampling is on
    dynamic = _section()
    dynamic["data_sampling"]["dynamic_batching"] = {"enabled": True}
    with pytest.raises(ConfigError, match="dynamic_batching.max_tokens: missing"):
        resolve_config({**base, "data_efficiency": dynamic}, world_size=2)
    # a library the script calls (tests/test_dynamic_batching.py): accepted once complete
    dynamic["data_sampling"]["dynamic_batching"]["max_tokens"] = 512
    resolve_config({**base, "data_efficiency": dynamic}, world_size=2)
    # enabled with nothing in it does nothing, as in DeepSpeed
    resolve_config({**base, "data_efficiency": {"enabled": True}}, world_size=2)
