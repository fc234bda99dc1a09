"""``deepspeed.runtime.data_pipeline.config``: the ``data_efficiency`` section of a whole config
dict with DeepSpeed's defaults filled in. The reader and its checks: ``config/data_efficiency.py``.
"""

from __future__ import annotations

from dslaunch.config.data_efficiency import SEED_DEFAULT, data_efficiency_config, data_efficiency_problems


def _section(param_dict: dict) -> dict:
    section = param_dict.get("data_efficiency") or {}
    problems = data_efficiency_problems(section)
    if problems:
        raise ValueError("; ".join(problems))
    return section


def get_data_efficiency_config(param_dict: dict) -> dict:
    return data_efficiency_config(_section(param_dict))


def get_data_efficiency_enabled(param_dict: dict) -> bool:
    return _section(param_dict).get("enabled", False) is True


def get_data_efficiency_seed(param_dict: dict) -> int:
    return _section(param_dict).get("seed", SEED_DEFAULT)


def get_data_sampling(param_dict: dict) -> dict:
    """Of a ``data_efficiency`` section (DeepSpeed's argument), its filled-in ``data_sampling``."""
    return data_efficiency_config(param_dict)["data_sampling"]


def get_curriculum_learning(param_dict: dict) -> dict:
    """Of a ``data_sampling`` section, its filled-in ``curriculum_learning``."""
    return data_efficiency_config({"data_sampling": param_dict})["data_sampling"][
        "curriculum_learning"]


def get_data_routing(param_dict: dict) -> dict:
    """Of a ``data_efficiency`` section, its ``data_routing`` as given (random-LTD reads it)."""
    return data_efficiency_config(param_dict)["data_routing"]
