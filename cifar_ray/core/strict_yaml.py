"""YAML read as a config means it, for sweep files (load_yaml) and --set values (parse_value) alike."""

from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import YamlValueError

_BOOL_TAG, _INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_LEADING_ZERO_TAG = "tag:cifar-ray:leading-zero"
# How deep collections may nest: a sweep file needs 4 (the file, grid, a factor's list, a bundle); PyYAML composes
# recursively, so 10^5 levels end in a RecursionError, and a few thousand already in a page-long pydantic message.
NESTING_MAX = 32
# How many nodes a document may compose, an alias counted as the nodes it repeats: a sweep file needs a few hundred,
# and 560 bytes of aliases nested 9 deep ("billion laughs") repeat 10^9 values that repr and pydantic then walk.
# Above the 10,000-trial cap; a 1 MB list of numbers is refused at its 20,001st value, before PyYAML builds it all.
NODES_MAX = 20_000


class StrictLoader(yaml.SafeLoader):
    """Safe YAML (Python object tags refused) read as a config means it, for sweep files and --set alike:
    true/false are the only booleans (YAML 1.1 reads off/on/yes/no as booleans: `amp: off` would be False;
    a bool key still takes them, as pydantic reads "off" as false), an integer with a leading zero is refused
    (YAML 1.1 reads 010 as octal 8), 1e-3 is a float (YAML 1.1 wants a dot, 1.0e-3, and reads 1e-3 as text), 1:30
    is text (not YAML 1.1's sexagesimal 90), a mapping may not repeat a key (YAML keeps the last one silently),
    collections nest at most NESTING_MAX deep, and a document holds at most NODES_MAX nodes with its aliases
    expanded."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _INT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    depth = 0  # the collections open where the composer stands

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.nodes = 0  # composed so far, aliases expanded
        self.anchor_nodes: dict[str, int] = {}  # an anchored node's nodes, aliases inside it expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self.depth += 1
        try:
            event = self.peek_event()
            if self.depth > NESTING_MAX:
                raise YamlValueError(
                    f"nested deeper than {NESTING_MAX} levels; allowed: up to {NESTING_MAX} (a sweep file needs 4)",
                    event.start_mark.line + 1,
                )
            before = self.nodes
            node = super().compose_node(parent, index)
            if isinstance(event, yaml.AliasEvent):
                self.nodes += self.anchor_nodes.get(event.anchor, 1)  # absent: an alias inside its anchor, a cycle
            else:
                self.nodes += 1
                if event.anchor is not None:
                    self.anchor_nodes[event.anchor] = self.nodes - before
            if self.nodes > NODES_MAX:
                raise YamlValueError(
                    f"more than {NODES_MAX:,} values with its aliases expanded; allowed: up to {NODES_MAX:,} "
                    "(a sweep file needs a few hundred)",
                    event.start_mark.line + 1,
                )
            return node
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in first_line:
                    raise YamlValueError(
                        f"duplicate key {key!r} (first at line {first_line[key]}); allowed: each key once", line
                    )
                first_line[key] = line
            except TypeError:  # an unhashable key: the base constructor refuses it
                break
        return super().construct_mapping(node, deep)

    def construct_leading_zero(self, node: yaml.ScalarNode) -> None:
        digits = node.value.replace("_", "").lstrip("+-").lstrip("0") or "0"
        raise YamlValueError(
            f"{node.value} is an integer written with a leading zero (YAML 1.1 reads it as octal); "
            f"allowed: {digits}, or '{node.value}' in quotes for text",
            node.start_mark.line + 1,
        )


StrictLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
StrictLoader.add_implicit_resolver(
    _INT_TAG, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0b[01_]+|0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)
StrictLoader.add_implicit_resolver(
    _FLOAT_TAG, re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)
StrictLoader.add_implicit_resolver(_LEADING_ZERO_TAG, re.compile(r"^[-+]?0[0-9_]+$"), list("-+0"))
StrictLoader.add_constructor(_LEADING_ZERO_TAG, StrictLoader.construct_leading_zero)


def load_yaml(text: str) -> Any:
    """`text` read by StrictLoader; raises YamlValueError for what it refuses, yaml.YAMLError for bad YAML."""
    return yaml.load(text, Loader=StrictLoader)  # safe: StrictLoader is a SafeLoader


def parse_value(text: str) -> Any:
    """A --set value, read as a YAML scalar (as a sweep file reads it) so `lr=0.1` is a number, `use_gpu=true`
    a bool and `amp=off` the string off; raises YamlValueError for an integer written with a leading zero."""
    try:
        value = load_yaml(text)
    except YamlValueError:
        raise
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) else text
