"""The ``data_efficiency`` section (DeepSpeed 0.19.8's keys), read and checked when the config is
read. Two halves: ``data_sampling`` (curriculum data sampling; runtime:
``runtime/data_pipeline/data_sampling/``) is checked here in full; ``data_routing`` (random-LTD)
is handed on raw: its keys are checked by ``config/random_ltd.py``.

``data_sampling.dynamic_batching`` is checked here too; as in DeepSpeed the engine does not use
it: the script's call to ``variable_batch_size_and_lr`` does.

As in DeepSpeed, ``data_sampling.curriculum_learning.enabled`` alone switches the curriculum
sampler on (DeepSpeed's engine reads only that flag); ``data_efficiency.enabled`` and
``data_sampling.enabled`` are kept and reported but do not gate it. Pure data and checks.
"""

from __future__ import annotations

from .curriculum import schedule_problems
from .random_ltd import routing_problems
from .section_checks import is_int, unknown_keys

PREFIX = "data_efficiency"
SEED_DEFAULT = 1234
NUM_EPOCHS_DEFAULT = 1000
DIFFICULTY_TYPES = ("value", "percentile")
CLUSTERING_TYPES = ("schedule_based", "single_cluster")
LR_SCALING_METHODS = ("linear", "sqrt", "none")
PICKING_ORDERS = ("random", "seqlen", "dataloader")

TOP_KEYS = {"enabled", "seed", "data_sampling", "data_routing"}
SAMPLING_KEYS = {"enabled", "num_epochs", "num_workers", "pin_memory", "curriculum_learning",
                 "dynamic_batching"}
CURRICULUM_KEYS = {"enabled", "data_cluster_path", "curriculum_metrics"}
# dynamic_batching: read by the script's call to variable_batch_size_and_lr (not by the engine)
DYNAMIC_BATCHING_KEYS = {"enabled", "metrics_path", "lr_scaling_method", "min_batch_size",
                         "max_batch_size", "sequence_picking_order", "max_tokens", "verbose"}
METRIC_KEYS = {"index_to_sample_path", "index_to_metric_path", "difficulty_type",
               "clustering_type", "min_difficulty", "max_difficulty", "schedule_type",
               "schedule_config"}


def _flag(section: dict, key: str, prefix: str, problems: list) -> None:
    if section.get(key, False) not in (True, False):
        problems.append(f"{prefix}.{key}: {section[key]!r}; must be true or false")


def _object(value, prefix: str, problems: list) -> dict:
    """``value`` when it is a dict (``{}`` for None); else a problem and ``{}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{prefix}: {value!r}; must be an object")
        return {}
    return value


# -- the section's parts, as the runtime reads them ------------------------------------------------
def sampling_section(data_efficiency) -> dict:
    return (data_efficiency or {}).get("data_sampling") or {}


def curriculum_section(data_efficiency) -> dict:
    return sampling_section(data_efficiency).get("curriculum_learning") or {}


def curriculum_sampling_enabled(data_efficiency) -> bool:
    """Whether the curriculum data sampler serves the training data (DeepSpeed's one switch)."""
    return curriculum_section(data_efficiency).get("enabled") is True


def data_routing_section(data_efficiency) -> dict:
    """The raw ``data_routing`` dict (random-LTD's reader: ``config/random_ltd.py``)."""
    return (data_efficiency or {}).get("data_routing") or {}


def data_efficiency_config(data_efficiency) -> dict:
    """The section with DeepSpeed's defaults filled in, in the shape DeepSpeed's
    ``get_data_efficiency_config`` returns (what ``DeepSpeedDataSampler`` takes)."""
    section = data_efficiency or {}
    sampling = dict(sampling_section(section))
    sampling.setdefault("enabled", False)
    sampling.setdefault("num_epochs", NUM_EPOCHS_DEFAULT)
    sampling.setdefault("num_workers", 0)
    sampling.setdefault("pin_memory", False)
    curriculum = dict(curriculum_section(section))
    curriculum.setdefault("enabled", False)
    sampling["curriculum_learning"] = curriculum
    sampling["dynamic_batching"] = dynamic_batching_config(sampling.get("dynamic_batching"))
    return {"enabled": section.get("enabled", False) is True,
            "seed": section.get("seed", SEED_DEFAULT),
            "data_sampling": sampling,
            "data_routing": dict(data_routing_section(section))}


def dynamic_batching_config(dynamic) -> dict:
    """``dynamic_batching`` with DeepSpeed's defaults filled in (``max_tokens`` stays absent
    when not given; ``metrics_path`` None when not given)."""
    out = dict(dynamic or {})
    out.setdefault("enabled", False)
    out.setdefault("metrics_path", None)
    out.setdefault("lr_scaling_method", "linear")
    out.setdefault("min_batch_size", 1)
    out.setdefault("max_batch_size", None)
    out.setdefault("sequence_picking_order", "dataloader")
    out.setdefault("verbose", False)
    return out


# -- checks -----------------------------------------------------------------------------------------
def data_efficiency_problems(section) -> list:
    """One line per problem of the ``data_efficiency`` section, each naming its key path.
    ``data_routing`` is only checked to be an object here."""
    problems: list = []
    section = _object(section, PREFIX, problems)
    problems.extend(unknown_keys(section, TOP_KEYS, PREFIX))
    _flag(section, "enabled", PREFIX, problems)
    if "seed" in section and not is_int(section["seed"], 0):
        problems.append(f"{PREFIX}.seed: {section['seed']!r}; must be an integer >= 0 (the "
                        "sampler's numpy seed)")
    _object(section.get("data_routing"), f"{PREFIX}.data_routing", problems)
    problems.extend(routing_problems(section.get("data_routing")))  # random_ltd.py
    problems.extend(sampling_problems(section.get("data_sampling")))
    return problems


def sampling_problems(sampling, prefix: str = f"{PREFIX}.data_sampling") -> list:
    problems: list = []
    sampling = _object(sampling, prefix, problems)
    problems.extend(unknown_keys(sampling, SAMPLING_KEYS, prefix))
    _flag(sampling, "enabled", prefix, problems)
    _flag(sampling, "pin_memory", prefix, problems)
    if "num_epochs" in sampling and not is_int(sampling["num_epochs"], 1):
        problems.append(f"{prefix}.num_epochs: {sampling['num_epochs']!r}; must be an integer "
                        ">= 1 (how many passes over the data the sampler serves)")
    if "num_workers" in sampling and not is_int(sampling["num_workers"], 0):
        problems.append(f"{prefix}.num_workers: {sampling['num_workers']!r}; must be an integer "
                        ">= 0 (the dataloader's worker processes)")
    problems.extend(dynamic_batching_problems(sampling.get("dynamic_batching"),
                                              f"{prefix}.dynamic_batching"))
    problems.extend(curriculum_problems(sampling.get("curriculum_learning"),
                                        f"{prefix}.curriculum_learning"))
    return problems


def dynamic_batching_problems(dynamic, prefix: str) -> list:
    """The ``dynamic_batching`` keys (DeepSpeed's); ``max_tokens`` is required when enabled."""
    problems: list = []
    dynamic = _object(dynamic, prefix, problems)
    problems.extend(unknown_keys(dynamic, DYNAMIC_BATCHING_KEYS, prefix))
    _flag(dynamic, "enabled", prefix, problems)
    _flag(dynamic, "verbose", prefix, problems)
    method = dynamic.get("lr_scaling_method", "linear")
    if not isinstance(method, str) or method.lower() not in LR_SCALING_METHODS:
        problems.append(f"{prefix}.lr_scaling_method: {method!r}; use one of "
                        f"{', '.join(LR_SCALING_METHODS)}")
    order = dynamic.get("sequence_picking_order", "dataloader")
    if order not in PICKING_ORDERS:
        problems.append(f"{prefix}.sequence_picking_order: {order!r}; use one of "
                        f"{', '.join(PICKING_ORDERS)}")
    lo, hi = dynamic.get("min_batch_size", 1), dynamic.get("max_batch_size")
    if not is_int(lo, 1):
        problems.append(f"{prefix}.min_batch_size: {lo!r}; must be an integer >= 1 (samples "
                        "per micro-batch)")
    if hi is not None and not is_int(hi, 1):
        problems.append(f"{prefix}.max_batch_size: {hi!r}; must be null or an integer >= 1")
    elif hi is not None and is_int(lo, 1) and hi < lo:
        problems.append(f"{prefix}.max_batch_size: {hi} is below min_batch_size {lo}")
    path = dynamic.get("metrics_path")
    if path is not None and (not isinstance(path, str) or not path):
        problems.append(f"{prefix}.metrics_path: {path!r}; name the directory of the data "
                        "analyzer's seqlen files")
    if "max_tokens" in dynamic and not is_int(dynamic["max_tokens"], 1):
        problems.append(f"{prefix}.max_tokens: {dynamic['max_tokens']!r}; must be an integer "
                        ">= 1 (the token budget of a micro-batch)")
    elif dynamic.get("enabled") is True and "max_tokens" not in dynamic:
        problems.append(f"{prefix}.max_tokens: missing; dynamic batching is enabled, so give "
                        "the token budget of a micro-batch")
    return problems


def curriculum_problems(curriculum, prefix: str) -> list:
    problems: list = []
    curriculum = _object(curriculum, prefix, problems)
    _flag(curriculum, "enabled", prefix, problems)
    if curriculum.get("enabled") is not True:
        return problems
    problems.extend(unknown_keys(curriculum, CURRICULUM_KEYS, prefix))
    path = curriculum.get("data_cluster_path")
    if not isinstance(path, str) or not path:
        problems.append(f"{prefix}.data_cluster_path: {path!r}; name a directory where the "
                        "sampler writes its data clusters")
    metrics = curriculum.get("curriculum_metrics")
    if not isinstance(metrics, dict) or not metrics:
        problems.append(f"{prefix}.curriculum_metrics: {metrics!r}; give an object of metric "
                        "name -> its schedule and index files")
        return problems
    for name, metric in metrics.items():
        problems.extend(metric_problems(metric, f"{prefix}.curriculum_metrics.{name}"))
    return problems


def metric_problems(metric, prefix: str) -> list:
    problems: list = []
    if not isinstance(metric, dict):
        return [f"{prefix}: {metric!r}; must be an object"]
    problems.extend(unknown_keys(metric, METRIC_KEYS, prefix))
    difficulty, clustering = metric.get("difficulty_type"), metric.get("clustering_type")
    if difficulty not in DIFFICULTY_TYPES:
        problems.append(f"{prefix}.difficulty_type: {difficulty!r}; use one of "
                        f"{', '.join(DIFFICULTY_TYPES)}")
    if clustering not in CLUSTERING_TYPES:
        problems.append(f"{prefix}.clustering_type: {clustering!r}; use one of "
                        f"{', '.join(CLUSTERING_TYPES)}")
    if clustering == "schedule_based":
        needs = ["index_to_sample_path"] + (["index_to_metric_path"] if difficulty == "value"
                                            else [])
        for key in needs:
            if not isinstance(metric.get(key), str) or not metric.get(key):
                problems.append(f"{prefix}.{key}: missing; the data analyzer's index file "
                                "(path without .bin/.idx) for this metric")
    problems.extend(schedule_problems(metric, prefix))
    lo, hi = metric.get("min_difficulty"), metric.get("max_difficulty")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
        problems.append(f"{prefix}.min_difficulty: {lo} is above max_difficulty {hi}")
    if difficulty == "percentile" and isinstance(hi, (int, float)) and not 0 < hi <= 100:
        problems.append(f"{prefix}.max_difficulty: {hi}; a percentile difficulty is in (0, 100]")
    return problems
