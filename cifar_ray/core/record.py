"""One trial as its trial.json holds it: a typed record (TrialRecord) that every reader (status, the report's
loader, the live view, export, the end-of-run summary) takes from the run folder's owner (core/run.py) instead of
parsing the dict again.

The file keeps its format: from_json reads every key a trial.json holds today into a field, keeps the keys it does
not know (written by a later cifar-ray) in `extra`, and remembers which keys the file had, in its order, so that
to_json gives back the same object: no key added (a pending trial has no `error`), none dropped, none moved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

PENDING = "pending"  # the status of a trial.json without one


@dataclass(frozen=True)
class TrialRecord:
    """A trial's trial.json. `config` is the resolved config as written (lists, not tuples); `system` what its
    slot's workers found (devices, versions, nodes); `timeline` where its time went outside the epochs; the times
    as ISO strings (`*_at`) and Unix seconds (`*_unix`)."""

    name: str
    index: int | None = None
    swept: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    status: str = PENDING
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    started_at: str | None = None
    started_unix: float | None = None
    system: dict[str, Any] = field(default_factory=dict)
    slot: str | None = None
    driver: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] = field(default_factory=dict)
    diverged_epoch: int | None = None
    interrupted_at: str | None = None
    finished_at: str | None = None
    finished_unix: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as they were
    keys: tuple[str, ...] = ()  # the keys the file holds, in its order (to_json writes these)

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> TrialRecord:
        """The record of trial `name` from its trial.json's object ({} for a trial with no file yet). A null is
        kept as None, whatever the field's type, so that to_json writes it back."""
        values = {key: value for key, value in data.items() if key in _FIELDS}
        values.setdefault("name", name)
        extra = {key: value for key, value in data.items() if key not in _FIELDS}
        return cls(**values, extra=extra, keys=tuple(data))

    def to_json(self) -> dict[str, Any]:
        """The trial.json object this record was read from, or is to be written as: its keys in their order."""
        return {key: self.get(key) for key in self.keys}

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key` as trial.json holds it, `default` where it holds none (a key from a later version
        included)."""
        if key in self.extra:
            return self.extra[key]
        return getattr(self, key) if key in self.keys else default


_FIELDS = {f.name for f in dataclasses.fields(TrialRecord)} - {"extra", "keys"}  # trial.json's keys
