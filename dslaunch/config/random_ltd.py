"""The keys of ``data_efficiency.data_routing.random_ltd`` (random layer-wise token dropping;
the runtime: ``engine/features/random_ltd/``), checked when the config is read. DeepSpeed 0.19.8's keys;
as in DeepSpeed, ``random_ltd.enabled`` alone switches it on. Pure data and checks.
"""

from __future__ import annotations

from .section_checks import is_int, unknown_keys

PREFIX = "data_efficiency.data_routing.random_ltd"
SCHEDULE_TYPES = ("fixed_linear",)
MODEL_TYPES = ("decoder", "encoder")
HIDDEN_STATE_ORDERS = ("batch_seq_dim", "seq_batch_dim")
WARMUP_TYPES = ("linear", "log")

TOP_KEYS = {"enabled", "total_layer_num", "random_ltd_layer_num", "random_ltd_layer_id",
            "model_mask_name", "model_type", "hidden_state_order", "random_ltd_schedule",
            "layer_token_lr_schedule",
            "micro_batch_size", "global_batch_size"}  # the engine sets these two
SCHEDULE_KEYS = {"min_value", "max_value", "schedule_type", "schedule_config"}
SCHEDULE_CONFIG_KEYS = {"require_steps", "seq_per_step"}
LR_KEYS = {"enabled", "total_layer_tokens", "warmup_type", "warmup_layer_tokens"}


def random_ltd_section(data_efficiency) -> dict:
    """The ``random_ltd`` dict of a ``data_efficiency`` section (``{}`` when absent)."""
    routing = (data_efficiency or {}).get("data_routing") or {}
    return routing.get("random_ltd") or {}


def random_ltd_enabled(data_efficiency) -> bool:
    return random_ltd_section(data_efficiency).get("enabled") is True


def _required_int(section: dict, key: str, prefix: str, lo: int, problems: list) -> None:
    if key not in section:
        problems.append(f"{prefix}.{key}: missing; random-LTD needs it")
    elif not is_int(section[key], lo):
        problems.append(f"{prefix}.{key}: {section[key]!r}; must be an integer >= {lo}")


def _choice(section: dict, key: str, choices, prefix: str, problems: list, required=True):
    if key not in section:
        if required:
            problems.append(f"{prefix}.{key}: missing; one of {', '.join(choices)}")
    elif section[key] not in choices:
        problems.append(f"{prefix}.{key}: {section[key]!r}; use one of {', '.join(choices)}")


def routing_problems(routing, prefix: str = "data_efficiency.data_routing") -> list:
    """The ``data_routing`` section's own keys and its ``random_ltd`` (a non-object
    ``data_routing`` is reported by ``data_efficiency.py``)."""
    if not isinstance(routing, dict):
        return []
    problems = unknown_keys(routing, {"enabled", "random_ltd"}, prefix)
    if routing.get("enabled", False) not in (True, False):
        problems.append(f"{prefix}.enabled: {routing['enabled']!r}; must be true or false")
    return problems + random_ltd_problems(routing.get("random_ltd"), f"{prefix}.random_ltd")


def random_ltd_problems(section, prefix: str = PREFIX) -> list:
    """One line per problem of an enabled ``random_ltd`` section (``[]`` when disabled)."""
    if section is None or section == {}:
        return []
    if not isinstance(section, dict):
        return [f"{prefix}: {section!r}; must be an object"]
    if section.get("enabled", False) not in (True, False):
        return [f"{prefix}.enabled: {section['enabled']!r}; must be true or false"]
    if not section.get("enabled"):
        return []
    problems = unknown_keys(section, TOP_KEYS, prefix)
    _required_int(section, "total_layer_num", prefix, 1, problems)
    _required_int(section, "random_ltd_layer_num", prefix, 1, problems)
    _choice(section, "model_type", MODEL_TYPES, prefix, problems)
    _choice(section, "hidden_state_order", HIDDEN_STATE_ORDERS, prefix, problems)
    mask = section.get("model_mask_name")
    if mask is not None and not isinstance(mask, str):
        problems.append(f"{prefix}.model_mask_name: {mask!r}; the layer's mask keyword (a "
                        "string) or null")
    elif mask is None and section.get("model_type") == "encoder":
        problems.append(f"{prefix}.model_mask_name: missing; an encoder's dropping layers need "
                        "the attention mask, name its keyword")
    _layer_ids(section, prefix, problems)
    _schedule(section.get("random_ltd_schedule"), f"{prefix}.random_ltd_schedule", problems)
    _lr_schedule(section.get("layer_token_lr_schedule"), f"{prefix}.layer_token_lr_schedule",
                 problems)
    return problems


def _layer_ids(section: dict, prefix: str, problems: list) -> None:
    ids = section.get("random_ltd_layer_id")
    key = f"{prefix}.random_ltd_layer_id"
    if ids is None:
        problems.append(f"{key}: missing; list the indices of the layers that drop tokens")
        return
    if not isinstance(ids, list) or not ids or not all(is_int(i, 0) for i in ids):
        problems.append(f"{key}: {ids!r}; must be a non-empty list of layer indices (>= 0)")
        return
    if len(set(ids)) != len(ids):
        problems.append(f"{key}: {ids!r} repeats a layer")
    total, num = section.get("total_layer_num"), section.get("random_ltd_layer_num")
    if is_int(total) and max(ids) >= total:
        problems.append(f"{key}: layer {max(ids)} is past total_layer_num {total} (indices "
                        "start at 0)")
    if is_int(num) and num != len(ids):
        problems.append(f"{prefix}.random_ltd_layer_num: {num}, but random_ltd_layer_id lists "
                        f"{len(ids)} layers; they must agree")
    if is_int(num) and is_int(total) and num > total:
        problems.append(f"{prefix}.random_ltd_layer_num: {num} is more than total_layer_num "
                        f"{total}")


def _schedule(schedule, prefix: str, problems: list) -> None:
    if schedule is None:
        problems.append(f"{prefix}: missing; give min_value, max_value, schedule_type and "
                        "schedule_config")
        return
    if not isinstance(schedule, dict):
        problems.append(f"{prefix}: {schedule!r}; must be an object")
        return
    problems.extend(unknown_keys(schedule, SCHEDULE_KEYS, prefix))
    _required_int(schedule, "min_value", prefix, 1, problems)
    _required_int(schedule, "max_value", prefix, 1, problems)
    lo, hi = schedule.get("min_value"), schedule.get("max_value")
    if is_int(lo, 1) and is_int(hi, 1) and lo > hi:
        problems.append(f"{prefix}.min_value: {lo} is above max_value {hi}")
    _choice(schedule, "schedule_type", SCHEDULE_TYPES, prefix, problems)
    cfg = schedule.get("schedule_config")
    if not isinstance(cfg, dict):
        problems.append(f"{prefix}.schedule_config: {cfg!r}; give require_steps and "
                        "seq_per_step")
        return
    problems.extend(unknown_keys(cfg, SCHEDULE_CONFIG_KEYS, f"{prefix}.schedule_config"))
    _required_int(cfg, "require_steps", f"{prefix}.schedule_config", 1, problems)
    _required_int(cfg, "seq_per_step", f"{prefix}.schedule_config", 1, problems)


def _lr_schedule(lr, prefix: str, problems: list) -> None:
    if lr is None:
        return
    if not isinstance(lr, dict):
        problems.append(f"{prefix}: {lr!r}; must be an object")
        return
    problems.extend(unknown_keys(lr, LR_KEYS, prefix))
    if lr.get("enabled", False) not in (True, False):
        problems.append(f"{prefix}.enabled: {lr['enabled']!r}; must be true or false")
    if lr.get("enabled") is not True:
        return
    _required_int(lr, "total_layer_tokens", prefix, 1, problems)
    if "warmup_layer_tokens" in lr and not is_int(lr["warmup_layer_tokens"], 0):
        problems.append(f"{prefix}.warmup_layer_tokens: {lr['warmup_layer_tokens']!r}; must be "
                        "an integer >= 0")
    _choice(lr, "warmup_type", WARMUP_TYPES, prefix, problems, required=False)


def lr_schedule_settings(section: dict):
    """``(total_layer_tokens, warmup_layer_tokens, warmup_type)`` when the layer-token learning
    rate schedule is on, else None."""
    lr = section.get("layer_token_lr_schedule") or {}
    if lr.get("enabled") is not True:
        return None
    return lr["total_layer_tokens"], lr.get("warmup_layer_tokens", 0), lr.get("warmup_type",
                                                                                "linear")
