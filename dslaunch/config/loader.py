"""Read a config from a file (.json, .yaml, .yml), a dict, or a JSON string, into a plain dict.

Syntax errors name the file and the line. Duplicate keys are an error in both formats (DeepSpeed
rejects them in JSON; YAML would silently keep the last one, which hides mistakes).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Optional, Tuple

import yaml

from .errors import ConfigError

YAML_SUFFIXES = (".yaml", ".yml")


def load_config(source: Any) -> dict:
    """The raw config as a dict (no validation). Raises ConfigError with one line per problem."""
    return load_config_with_origin(source)[0]


def load_config_with_origin(source: Any) -> Tuple[dict, Optional[str]]:
    """(raw dict, the file name it came from or None)."""
    if isinstance(source, dict):
        return copy.deepcopy(source), None
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(source, str) and text.lstrip()[:1] in ("{", "["):
            return _parse_json(text, "<config JSON string>"), None
        return _load_file(Path(text)), text
    raise ConfigError([f"config: expected a file path, a dict or a JSON string, got {type(source).__name__}"])


def _load_file(path: Path) -> dict:
    name = str(path)
    if not path.exists():
        raise ConfigError([f"{name}: no such config file"])
    if path.is_dir():
        raise ConfigError([f"{name}: is a directory, expected a .json or .yaml config file"])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{name}: cannot read config file: {exc}"]) from None
    if not text.strip():
        raise ConfigError([f"{name}: config file is empty"])
    if path.suffix.lower() in YAML_SUFFIXES:
        return _parse_yaml(text, name)
    return _parse_json(text, name)


def _parse_json(text: str, name: str) -> dict:
    def no_duplicates(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        hint = " (a .yaml/.yml name reads it as YAML)" if name != "<config JSON string>" else ""
        raise ConfigError([f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}{hint}"]) from None
    except _Duplicate as dup:
        raise ConfigError([f"{name}: {dup.key}: key given twice; keep one"]) from None
    return _top_level_mapping(data, name)


class _Duplicate(Exception):
    def __init__(self, key):
        super().__init__(key)
        self.key = key


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and says on which line."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice; keep one", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, name: str) -> dict:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        what = exc.problem or exc.context or "syntax error"
        raise ConfigError([f"{where}: invalid YAML: {what}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{name}: invalid YAML: {exc}"]) from None
    return _top_level_mapping(data, name)


def _top_level_mapping(data: Any, name: str) -> dict:
    if not isinstance(data, dict):
        raise ConfigError([f"{name}: the config must be a mapping of keys at the top level, "
                           f"got {type(data).__name__}"])
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError([f"{name}: {bad[0]!r}: keys must be strings"])
    return data
