"""The config keys as a table (`cifar-ray keys`): one row per TrainConfig field, as Markdown (docs/config-keys.md)
or as text for a terminal."""

from __future__ import annotations

import textwrap
from typing import Any, NamedTuple, get_args

from .config import TrainConfig
from .text import markdown_table


class KeyRow(NamedTuple):
    """One config key as a table of keys shows it (docs/config-keys.md, `format_keys_text`)."""

    key: str
    type: str  # int, float, bool or str
    allowed: str  # the choices, the numeric bounds, or "any"
    default: str  # as written in --set and sweep files
    description: str


# Defaults computed when a config is made (default_factory): what the table shows instead of this machine's value.
SHOWN_DEFAULTS = {"data_dir": "~/.cache/cifar-ray/data"}
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _bound(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"  # :g writes 2**32 - 1 as 4.29497e+09


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def key_rows() -> list[KeyRow]:
    """Every TrainConfig key, in field order: its type, allowed values, default and description."""
    rows = []
    for key, field in TrainConfig.model_fields.items():
        choices = get_args(field.annotation)
        if choices:
            kind, allowed = type(choices[0]).__name__, ", ".join(choices)
        else:
            kind = field.annotation.__name__
            bounds = [
                f"{symbol} {_bound(getattr(rule, name))}"
                for rule in field.metadata
                for name, symbol in _BOUNDS
                if hasattr(rule, name)
            ]
            allowed = "true, false" if field.annotation is bool else ", ".join(bounds) or "any"
        default = SHOWN_DEFAULTS[key] if field.default_factory else _shown(field.default)
        rows.append(KeyRow(key, kind, allowed, default, field.description or ""))
    return rows


def markdown_keys_table(rows: list[KeyRow]) -> str:
    """The rows as a Markdown table: docs/config-keys.md (tests/test_readme.py keeps them equal)."""
    cells = [(f"`{row.key}`", row.type, row.allowed, f"`{row.default}`", row.description) for row in rows]
    return markdown_table(["key", "type", "allowed", "default", "meaning"], cells) + "\n"


def format_keys_text(rows: list[KeyRow], width: int = 100) -> str:
    """The rows as plain text for a terminal: key, type, default and allowed values in aligned columns,
    each key's description wrapped to `width` columns on the lines below it."""
    header = KeyRow("KEY", "TYPE", "ALLOWED", "DEFAULT", "")
    key_width = max(len(row.key) for row in rows)
    type_width = max(len(row.type) for row in rows + [header])
    default_width = max(len(row.default) for row in rows + [header])
    lines = []
    for row in [header, *rows]:
        line = f"{row.key:<{key_width}}  {row.type:<{type_width}}  {row.default:<{default_width}}  {row.allowed}"
        lines.append(line.rstrip())
        if row.description:
            lines += textwrap.wrap(row.description, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"
