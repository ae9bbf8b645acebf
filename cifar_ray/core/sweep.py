"""Sweep files: YAML -> a validated list of trials (the cartesian product of the grid x repeats).

    name: batch-size
    description: How do time, memory and accuracy change with batch size?
    base: {model: simple_cnn, epochs: 10, workers: 2}
    grid: {batch_size: [16, 32, 64, 128]}
    repeats: 2            # seeds seed, seed+1, ... per grid point

A grid factor whose values are mappings sets several keys together (the values must not be
crossed, e.g. each optimizer with its own learning rate); its name is free:

    grid:
      optimizer:
        - {optimizer: momentum, lr: 0.05}
        - {optimizer: adam, lr: 0.001}
    metric: test_acc      # what "best" means in the summary
    mode: max

Everything is validated before Ray starts; errors are one line naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import (
    KEYS,
    TrainConfig,
    absolute_paths,
    did_you_mean,
    parse_config,
    unknown_key_message,
    validation_line,
)
from .errors import ConfigError, YamlValueError
from .runlog import DEFAULT_OBJECTIVE, MODES, OBJECTIVES
from .strict_yaml import load_yaml
from .text import counted, shown

# Run names (--name, a sweep file's name) and bundle factor names become folder, CSV and PNG names: one path
# component that stays inside its folder (no /, no leading dot, so no .. either). Trial names match it too.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$"
NAME_MAX = 80
DICT_SOURCE = "<dict>"  # how a sweep given as a dict is named in refusals and in sweep.json's source
TRIAL_NAME_MAX = 120
REPEATS_MAX = 100
TRIALS_MAX = 10_000  # a sweep's trials are listed, validated and printed before Ray starts: 10^6 would hang there
# A sweep file is a page; PyYAML reads about 0.5 MB a second, and a 50 MB file was copied whole into sweep.json.
SWEEP_FILE_MAX = 1_000_000


def name_refusal(name: Any) -> str | None:
    """Why `name` cannot name a run or a factor, or None when it can."""
    if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) and len(name) <= NAME_MAX:
        return None
    return (
        f"{shown(name)} is not a name; allowed: up to {NAME_MAX} letters, digits and . _ = + -, starting with a letter "
        f"or digit ({NAME_PATTERN}), as it names a folder or file"
    )


def target_refusal(target: Any) -> str | None:
    """Why `target` is not a target test accuracy (a number above 0 and below 1); None when it is one."""
    if isinstance(target, bool) or not isinstance(target, (int, float)):
        return f"target {shown(target)} is not a number; allowed: a test accuracy above 0 and below 1, e.g. 0.85"
    if 1 <= target <= 100:
        return f"target {target:g} reads as a percentage; write it as a fraction: {target / 100:g}"
    if not 0 < target < 1:
        return f"target {target:g}: allowed: a test accuracy above 0 and below 1, e.g. 0.85"
    return None


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    repeats: int = Field(1, ge=1, le=REPEATS_MAX)
    # the default of --max-concurrent: 1 where the question is time, so no trial's epochs share the machine's cores
    max_concurrent: int | None = Field(None, ge=1)
    metric: Literal[OBJECTIVES] = DEFAULT_OBJECTIVE[0]  # type: ignore[valid-type]
    mode: Literal[MODES] = DEFAULT_OBJECTIVE[1]  # type: ignore[valid-type]
    target: float | None = None  # a test accuracy: the report's time to reach it (report --target overrides)

    @field_validator("target")
    @classmethod
    def _target_is_an_accuracy(cls, target: float | None) -> float | None:
        refusal = target_refusal(target) if target is not None else None
        if refusal:
            raise ValueError(refusal)
        return target

    @field_validator("name")
    @classmethod
    def _name_is_a_name(cls, name: str) -> str:
        refusal = name_refusal(name)
        if refusal:
            raise ValueError(refusal)
        return name

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            if not values:
                raise ValueError(f"grid.{key} is an empty list; allowed: a list of at least one value")
            if len(values) > TRIALS_MAX:  # refused before repr walks them: each value is at least one trial
                raise ValueError(
                    f"grid.{key} has {len(values):,} values, a trial each; "
                    f"allowed: at most {TRIALS_MAX:,} trials per sweep"
                )
            seen: set[str] = set()
            for value in values:
                if repr(value) in seen:
                    raise ValueError(f"grid.{key} repeats a value: {shown(value)}; allowed: each value once")
                seen.add(repr(value))
            bundles = [isinstance(value, dict) for value in values]
            if any(bundles) and not all(bundles):
                raise ValueError(
                    f"grid.{key} mixes mappings and plain values; allowed: all mappings or all plain values"
                )
            refusal = name_refusal(key) if all(bundles) else None
            if refusal:  # a bundle factor's name is free: it goes into trial, CSV and PNG names
                raise ValueError(f"factor {refusal}")
        return grid


@dataclass(frozen=True)
class TrialSpec:
    index: int
    name: str
    swept: dict[str, Any]  # the grid values (and seed, with repeats) that make this trial
    config: TrainConfig

    def as_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "swept": self.swept, "config": self.config.model_dump()}


@dataclass(frozen=True)
class SweepPlan:
    name: str
    description: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    repeats: int
    metric: str
    mode: str
    trials: list[TrialSpec]
    source: str = ""
    # every repeat count the run was planned with, in order: a --resume --repeats N extension adds N (extended_plan)
    repeat_counts: tuple[int, ...] = ()
    max_concurrent: int | None = None  # the sweep file's; --max-concurrent overrides it
    target: float | None = None  # the sweep file's target test accuracy

    def summary(self) -> dict:
        return ({"target": self.target} if self.target is not None else {}) | {
            "name": self.name,
            "description": self.description,
            "metric": self.metric,
            "mode": self.mode,
            "grid": self.grid,
            "base": self.base,
            "repeats": self.repeats,
            "repeat_counts": list(self.repeat_counts),
            "source": self.source,
            "trials": [t.name for t in self.trials],
        }


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(value)).strip("-") or "x"


def trial_name(index: int, swept: dict[str, Any]) -> str:
    """Deterministic folder-safe name: t003-batch_size=64-seed=1 (no timestamps, so a restored
    sweep finds its trials again)."""
    parts = [f"{key}={_slug(value)}" for key, value in swept.items()]
    return "-".join([f"t{index:03d}", *parts])[:TRIAL_NAME_MAX]


def bundle_label(factor: str, bundle: dict[str, Any]) -> str:
    """How a mapping grid value is named in trial names and reports: 'adam (lr=0.001)'."""
    rest = ", ".join(f"{k}={v}" for k, v in bundle.items() if k != factor)
    if factor in bundle:
        return f"{bundle[factor]} ({rest})" if rest else str(bundle[factor])
    return rest


def _factor_keys(factor: str, values: list[Any]) -> list[str]:
    """The config keys a grid factor sets, in the file's order: a bundle factor's mappings' keys, else the factor."""
    return list(dict.fromkeys(key for value in values if isinstance(value, dict) for key in value)) or [factor]


def _shared_key_refusal(grid: dict[str, list[Any]]) -> str | None:
    """Two grid factors that set one key: the later would silently overwrite the earlier, and the report would
    compare trials that ran the same config; one line, or None when every key has one factor."""
    setter: dict[str, str] = {}
    for factor, values in grid.items():
        for key in _factor_keys(factor, values):
            if key in setter:
                return (
                    f"grid.{setter[key]} and grid.{factor} both set {key}; allowed: each key set by one grid factor "
                    f"(sweep {key} inside the bundles, or as a factor of its own)"
                )
            setter[key] = factor
    return None


def _values_that_run(values: list[Any], overrides: dict[str, Any]) -> list[Any]:
    """A factor's values as the trials run them: --set wins over a bundle's keys, so a bundle is relabelled with
    the overriding values, and bundles that become the same config are one value."""
    ran = [
        value | {k: overrides[k] for k in value if k in overrides} if isinstance(value, dict) else value
        for value in values
    ]
    return list({repr(value): value for value in ran}.values())


# What each key of a sweep file takes, for the refusal of a value pydantic's own words would not explain.
SWEEP_FILE_ALLOWED = {
    "name": f"a name of up to {NAME_MAX} letters, digits and . _ = + - (it names the run folder)",
    "description": "text",
    "base": "a mapping of config keys to values (cifar-ray keys lists them)",
    "grid": "a mapping of factor names to lists of values, e.g. {batch_size: [64, 128]}",
    "repeats": f"an integer from 1 to {REPEATS_MAX} (seeds per grid point)",
    "max_concurrent": "an integer of at least 1 (trials at once)",
    "metric": ", ".join(OBJECTIVES),
    "mode": ", ".join(MODES),
    "target": "a test accuracy above 0 and below 1, e.g. 0.85",
}


def sweep_file_allowed(key: str) -> str:
    """What the sweep-file key `key` (`grid.lr` is under grid) takes."""
    return SWEEP_FILE_ALLOWED[key.split(".")[0]]


def unknown_top_level_key(key: str) -> str:
    known = tuple(SweepFile.model_fields)
    return f"unknown top-level key '{key}'{did_you_mean(key, known)}; allowed: {', '.join(known)}"


def build_plan(
    data: Any,
    overrides: dict[str, Any] | None = None,
    source: str = "<sweep>",
    name: str | None = None,
    repeats: int | None = None,
) -> SweepPlan:
    """Validate a parsed sweep document and expand it; `overrides` replace base keys for every
    trial and win over the grid: a factor all of whose keys they set leaves the grid, a bundle with some of its
    keys set is relabelled from the values that run. `repeats` (--repeats) replaces the file's."""
    where = f"{source}: "
    refusal = name_refusal(name) if name is not None else None
    if refusal:
        raise ConfigError(f"--name {refusal}")
    if repeats is not None and not 1 <= repeats <= REPEATS_MAX:
        raise ConfigError(f"--repeats {repeats}: allowed: 1 to {REPEATS_MAX} seeds per grid point")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}a sweep file is a YAML mapping with keys {', '.join(SweepFile.model_fields)}")
    try:
        sweep = SweepFile(**data)
    except ValidationError as error:
        raise ConfigError(validation_line(error, where, unknown_top_level_key, sweep_file_allowed)) from None
    except TypeError as error:  # non-string keys
        raise ConfigError(f"{where}{error}") from None
    if repeats is not None:
        sweep = sweep.model_copy(update={"repeats": repeats})
    for key in sweep.base:
        if key not in KEYS:
            raise ConfigError(unknown_key_message(str(key), f"{where}base: "))
    for factor, values in sweep.grid.items():
        for key in _factor_keys(factor, values):
            if key not in KEYS:
                raise ConfigError(unknown_key_message(str(key), f"{where}grid.{factor}: "))
    shared_key_refusal = _shared_key_refusal(sweep.grid)
    if shared_key_refusal:
        raise ConfigError(where + shared_key_refusal)
    base_overrides = absolute_paths(overrides or {})
    file_base = absolute_paths(sweep.base)
    base = file_base | base_overrides
    grid = {
        k: _values_that_run(v, base_overrides)
        for k, v in sweep.grid.items()
        if set(_factor_keys(k, v)) - base_overrides.keys()
    }
    labels = {k: [bundle_label(k, v) if isinstance(v, dict) else v for v in values] for k, values in grid.items()}
    if "seed" in grid and sweep.repeats > 1:
        raise ConfigError(f"{where}grid.seed and repeats={sweep.repeats} both vary the seed; use one of them")
    trial_count = math.prod(len(values) for values in grid.values()) * sweep.repeats  # counted, not listed
    if trial_count > TRIALS_MAX:
        sizes = " x ".join([*(f"{len(v)} {k}" for k, v in grid.items()), counted(sweep.repeats, "repeat")])
        raise ConfigError(
            f"{where}the grid makes {trial_count:,} trials ({sizes}); allowed: at most {TRIALS_MAX:,} per sweep"
        )
    # A bad base value is reported once, not per trial, and blamed on where it came from. A --set value may be
    # valid only with the file's other base keys, so the file's base is checked alone only when the two together fail.
    try:
        parse_config(base)
    except ConfigError:
        parse_config(file_base, f"{where}base: ")
        parse_config(base, "--set: ")  # raises: the file's base is fine alone, so --set made it invalid

    first_seed = base.get("seed", 0)
    trials = []
    for point in itertools.product(*(range(len(v)) for v in grid.values())):
        for repeat in range(sweep.repeats):
            swept = {k: labels[k][i] for k, i in zip(grid, point)}
            values = dict(base)
            for factor, i in zip(grid, point):
                value = grid[factor][i]
                values |= value if isinstance(value, dict) else {factor: value}
            if sweep.repeats > 1:
                swept["seed"] = values["seed"] = first_seed + repeat
            label = ", ".join(f"{k}={v}" for k, v in swept.items())
            config = parse_config(values, f"{where}trial ({label}): " if label else where)
            index = len(trials)
            trials.append(TrialSpec(index, trial_name(index, swept), swept, config))
    return SweepPlan(
        name or sweep.name,
        sweep.description,
        base,
        labels,
        sweep.repeats,
        sweep.metric,
        sweep.mode,
        trials,
        source,
        (sweep.repeats,),
        sweep.max_concurrent,
        sweep.target,
    )


def _grid_point_and_seed(trial: TrialSpec) -> tuple:
    """What a trial is in its sweep, whatever its number: its grid values and its seed."""
    return tuple((k, repr(v)) for k, v in trial.swept.items() if k != "seed"), trial.config.seed


def extended_plan(plan: SweepPlan, more: SweepPlan, points: list[dict[str, Any]] | None = None) -> SweepPlan:
    """`plan` extended by the trials of `more` (the same sweep at more repeats) that it lacks: its own trials keep
    their names and numbers, the new seeds follow them, numbered on (so no name is taken twice). `points`: only at
    these grid points (factor -> label), in their order (a round of --until-settled; the repeat counts stay)."""
    had = {_grid_point_and_seed(t) for t in plan.trials}
    new = [t for t in more.trials if _grid_point_and_seed(t) not in had]
    if points is not None:
        order = {tuple((k, repr(v)) for k, v in point.items()): i for i, point in enumerate(points)}
        new = sorted(
            (t for t in new if _grid_point_and_seed(t)[0] in order), key=lambda t: order[_grid_point_and_seed(t)[0]]
        )
    trials = list(plan.trials)
    for trial in new:
        trials.append(TrialSpec(len(trials), trial_name(len(trials), trial.swept), trial.swept, trial.config))
    counts = plan.repeat_counts if points is not None else (*plan.repeat_counts, more.repeats)
    return dataclasses.replace(
        more, trials=trials, repeats=plan.repeats if points is not None else more.repeats, repeat_counts=counts
    )


def resumed_plan(
    path: str | Path | Mapping[str, Any],
    overrides: dict[str, Any],
    name: str | None,
    repeats: int | None,
    recorded: dict,
    source: str | None = None,
) -> SweepPlan:
    """The plan a --resume of the run whose sweep.json is `recorded` continues: the plan as the run was planned
    (its repeat_counts, each extension in turn), extended with new seeds to `repeats` (else the file's repeats)
    when that is more. Fewer than the run has is refused: --resume never drops trials. `path`: the sweep file, or
    its content as a dict (`source` then names it in errors)."""
    data = dict(path) if isinstance(path, Mapping) else read_sweep_file(path)
    source = source or str(path)
    wanted = build_plan(data, overrides, source, name, repeats)
    counts = recorded.get("repeat_counts") or [recorded.get("repeats", wanted.repeats)]
    if wanted.repeats < counts[-1]:
        asked = f"--repeats {repeats}" if repeats is not None else f"{source}: repeats: {wanted.repeats}"
        raise ConfigError(
            f"{asked} is fewer seeds than the {counts[-1]} per grid point the run already has; allowed: "
            f"--repeats {counts[-1]} to resume it, or more to add seeds"
        )
    more = [wanted.repeats] if wanted.repeats > counts[-1] else []
    plan = build_plan(data, overrides, source, name, counts[0])
    for count in [*counts[1:], *more]:
        plan = extended_plan(plan, build_plan(data, overrides, source, name, count))
    for past in (recorded.get("settle") or {}).get("rounds", []):  # --until-settled's rounds, each as it added
        if past.get("seeds") and not past.get("stop"):
            plan = extended_plan(plan, build_plan(data, overrides, source, name, past["seeds"]), past["points"])
    return plan


def load_sweep(
    path: str | Path, overrides: dict[str, Any] | None = None, name: str | None = None, repeats: int | None = None
) -> SweepPlan:
    return build_plan(read_sweep_file(path), overrides, str(path), name, repeats)


def _near_file(path: Path) -> str:
    """` (did you mean sweeps/quickstart.yaml?)` for the YAML file beside a missing `path` whose name is closest."""
    try:
        names = [p.name for p in path.parent.iterdir() if p.suffix in (".yaml", ".yml")]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1)
    return f" (did you mean {path.parent / close[0]}?)" if close else ""


def read_sweep_file(path: str | Path) -> Any:
    """The parsed YAML document of a sweep file, or a one-line ConfigError."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(SWEEP_FILE_MAX + 1)  # no more: a larger file is refused unread
    except OSError as error:
        hint = _near_file(path) if isinstance(error, FileNotFoundError) else ""
        raise ConfigError(f"cannot read sweep file {path}: {error.strerror or error}{hint}") from None
    if len(data) > SWEEP_FILE_MAX:
        raise ConfigError(f"{path}: larger than {SWEEP_FILE_MAX:,} bytes; allowed: a sweep file up to 1 MB")
    try:
        text = data.decode("utf-8")  # not the locale's encoding: a sweep file means the same on every machine
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line}: byte 0x{data[error.start]:02x} is not UTF-8; allowed: a UTF-8 text file"
        ) from None
    try:
        data = load_yaml(text)  # safe: Python object tags are refused, never constructed
    except YamlValueError as error:
        raise ConfigError(f"{path}: line {error.line}: {error}") from None
    except yaml.constructor.ConstructorError as error:
        tag = error.problem.split()[-1] if error.problem else ""
        raise ConfigError(f"{path}: refused YAML tag {tag} (only plain YAML is allowed)") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{at}: {detail}") from None
    return data


def single_run_plan(overrides: dict[str, Any], name: str) -> SweepPlan:
    """`cifar-ray train`: one trial of base config + overrides, recorded like a sweep."""
    return build_plan(
        {"name": name, "description": "A single training run (cifar-ray train).", "base": {}}, overrides, "--set", name
    )
