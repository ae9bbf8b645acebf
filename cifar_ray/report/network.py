"""The networks a run trained, for the report: each distinct model once, its layers and parameter count, and the
trials that used it. Read from each trial's network.json (written by rank 0 as the trial builds its model, so the
report needs no torch); a run from before trials recorded it has none, and the report then has no such section."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core import runlog
from ..core.runlog import RunLog
from .document import Block, Heading, Paragraph, Table

if TYPE_CHECKING:
    from .build import Report

LAYER_HEADERS = ("layer", "type", "output shape", "parameters")


@dataclass(frozen=True)
class Network:
    """One distinct model: what built it, its layers (name, type, output shape of one image, parameters), its
    total parameter count, and the trials that trained it, in run order."""

    model: str
    width: int
    depth: int | None  # simple_cnn's blocks; None for resnet9, which has no depth
    norm: str
    layers: tuple[tuple[str, str, tuple[int, ...], int], ...]
    total_params: int
    trials: tuple[str, ...]


def run_networks(runs: Sequence[tuple[str, RunLog]]) -> list[Network]:
    """The distinct networks of `runs` ((label, run) pairs; with several runs, trials are named `label/trial`),
    in the order their first trial comes. A trial.json-like read: retried, then StorageError; a trial without
    network.json is left out (a run from before it was recorded)."""
    by_model: dict[str, dict] = {}
    users: dict[str, list[str]] = {}
    for label, run in runs:
        for trial in run.trials:
            network = runlog.read_json(run.path / trial.name / runlog.NETWORK_FILE)
            if not network:
                continue
            key = json.dumps({k: network.get(k) for k in ("model", "width", "depth", "norm", "layers")})
            by_model.setdefault(key, network)
            users.setdefault(key, []).append(f"{label}/{trial.name}" if len(runs) > 1 else trial.name)
    return [
        Network(
            model=network["model"],
            width=network["width"],
            depth=network.get("depth"),
            norm=network["norm"],
            layers=tuple(
                (layer["name"], layer["type"], tuple(layer["output"]), layer["params"]) for layer in network["layers"]
            ),
            total_params=network["total_params"],
            trials=tuple(users[key]),
        )
        for key, network in by_model.items()
    ]


def network_title(network: Network) -> str:
    depth = f", depth {network.depth}" if network.depth is not None else ""
    return f"`{network.model}`, width {network.width}{depth}, norm {network.norm}"


def network_blocks(report: Report) -> list[Block]:
    """The report's section on the networks: each distinct model once, with its layer table, its total parameter
    count and the trials that used it; no blocks when no trial recorded its network."""
    networks = run_networks([(source.label, source.log) for source in report.sources])
    if not networks:
        return []
    blocks: list[Block] = [Heading("Networks")]
    for number, network in enumerate(networks, 1):
        used = f"{len(network.trials)} trial{'s' * (len(network.trials) != 1)}: " + ", ".join(network.trials)
        blocks.append(Paragraph(f"{network_title(network)}: **{network.total_params:,} parameters**; {used}."))
        rows = tuple(
            (name, kind, " × ".join(map(str, shape)), f"{params:,}") for name, kind, shape, params in network.layers
        )
        blocks.append(Table(LAYER_HEADERS, rows, "lllr", name=f"network-{number}"))
    return blocks
