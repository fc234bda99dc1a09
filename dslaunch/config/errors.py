"""ConfigError: every problem of a config at once, one readable line each."""

from __future__ import annotations

from typing import Iterable, Optional


class ConfigError(ValueError):
    """``problems``: one line per problem, each starting with the key path (or file:line for syntax).

    ``str()`` prefixes each line with the file name when the config came from a file, so a user
    sees ``configs/x.json: zero_optimization.stag: unknown key; did you mean stage?``.
    """

    def __init__(self, problems: Iterable[str], source: Optional[str] = None):
        self.problems = list(problems)
        self.source = source
        super().__init__(str(self))

    def lines(self) -> list:
        if not self.source:
            return list(self.problems)
        return [f"{self.source}: {p}" for p in self.problems]

    def __str__(self) -> str:
        return "\n".join(self.lines())
