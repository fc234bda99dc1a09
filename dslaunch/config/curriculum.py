"""The keys of an enabled ``curriculum_learning`` section, per schedule type (the schedule
itself: ``engine/features/curriculum.py``). Pure data, checked when the config is read."""

from __future__ import annotations

SCHEDULES = ("fixed_linear", "fixed_root", "fixed_discrete", "custom")
# schedule type -> the schedule_config keys it needs
NEEDS = {"fixed_linear": ("total_curriculum_step", "difficulty_step"),
         "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
         "fixed_discrete": ("difficulty", "max_step"), "custom": ()}


def schedule_problems(section: dict, prefix: str = "curriculum_learning") -> list:
    """What is missing or wrong in an enabled curriculum section (one line per problem)."""
    problems = []
    for key in ("min_difficulty", "max_difficulty", "schedule_type"):
        if section.get(key) is None:
            problems.append(f"{prefix}.{key}: missing; curriculum learning needs it")
    kind = section.get("schedule_type")
    if kind not in NEEDS:
        return problems
    cfg = section.get("schedule_config") or {}
    for key in NEEDS[kind]:
        if key not in cfg:
            problems.append(f"{prefix}.schedule_config.{key}: missing; the {kind} schedule needs it")
    if kind == "fixed_discrete" and not problems:
        diff, steps = cfg["difficulty"], cfg["max_step"]
        if not isinstance(diff, list) or not isinstance(steps, list) or not steps or \
                len(diff) != len(steps) + 1:
            problems.append(f"{prefix}.schedule_config.difficulty: give one more difficulty than "
                            f"max_step entries (the last holds after the last max_step); got "
                            f"{diff!r} and {steps!r}")
    if kind in ("fixed_linear", "fixed_root") and not problems:
        if not cfg["total_curriculum_step"] or cfg["total_curriculum_step"] <= 0:
            problems.append(f"{prefix}.schedule_config.total_curriculum_step: must be > 0")
        if not cfg["difficulty_step"] or cfg["difficulty_step"] <= 0:
            problems.append(f"{prefix}.schedule_config.difficulty_step: must be > 0")
    return problems
