"""The one YAML reader for what users write (recipes, overrides, `${VAR}` values): safe types only, and bounded.

PyYAML's SafeLoader builds an aliased node once and shares it, but whatever walks the result afterwards (merging,
interpolation, validation, dumping) walks the expanded tree: a "billion laughs" document of a few hundred bytes
expands to 10^9 values and runs for minutes, a self-referencing alias (`&a [*a]`) never ends, and nesting thousands
deep overflows Python's stack. `safe_load` refuses all three before constructing anything, and refuses tags that
name no plain YAML type (`!!python/name:os.system`) instead of leaving them to fail later or to pass as strings.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from memrl.core.errors import MemrlError, first_line

MAX_DEPTH = 64  # recipes nest 5-6 levels; every later walk of the result recurses once per level
MAX_VALUES = 200_000  # values once aliases are expanded; the largest bundled recipe has a few hundred
# The tags SafeLoader constructs, and merge keys (`<<: *base`), which it folds into their mapping.
_PLAIN_TAGS = frozenset(
    {*(tag for tag in yaml.SafeLoader.yaml_constructors if tag is not None), "tag:yaml.org,2002:merge"}
)


class YamlRefused(yaml.YAMLError):
    """A document that parses but is refused: nested too deeply, too large once expanded, recursive, or tagged."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops composing past MAX_DEPTH, before Python's own recursion limit does."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise YamlRefused(f"nested more than {MAX_DEPTH} levels deep (line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_load(text: str) -> Any:
    """The YAML value of `text` (None for an empty document); raises `yaml.YAMLError`: a `YamlRefused` for a
    document that parses but is hostile, another `YAMLError` for one that does not parse."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set())
        return loader.construct_document(node)
    except RecursionError:  # the scanner's own recursion on pathological flow syntax: same verdict
        raise YamlRefused(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # int() refuses a number of thousands of digits (Python's limit on its work)
        raise YamlRefused(f"a value YAML cannot hold here ({first_line(exc).partition(';')[0]})") from None
    finally:
        loader.dispose()


def _expanded_size(node: Node, sizes: dict[int, int], open_: set[int]) -> int:
    """Values under `node` with every alias expanded; each distinct node is counted once (`sizes`), so a bomb costs
    time in proportion to its text, not to its expansion. Depth is bounded by the loader: at most 2 * MAX_DEPTH."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise YamlRefused(f"an alias refers to a value that contains it (line {node.start_mark.line + 1})")
    if node.tag not in _PLAIN_TAGS:
        raise YamlRefused(f"tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed, only plain YAML "
                          f"values (line {node.start_mark.line + 1})")  # fmt: skip
    children: list[Node] = []
    if isinstance(node, SequenceNode):
        children = node.value
    elif isinstance(node, MappingNode):
        children = [part for pair in node.value for part in pair]
        _unique_keys(node)
    open_.add(key)
    total = 1 + sum(_expanded_size(child, sizes, open_) for child in children)
    open_.discard(key)
    if total > MAX_VALUES:
        raise YamlRefused(
            f"expands to more than {MAX_VALUES} values (aliases of aliases; line {node.start_mark.line + 1})"
        )
    sizes[key] = total
    return total


def _unique_keys(node: MappingNode) -> None:
    """A key written twice in one mapping: PyYAML keeps the last silently, so a recipe would not say what it runs."""
    seen: set[str] = set()
    for key, _ in node.value:
        if isinstance(key, ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            if key.value in seen:
                raise YamlRefused(f"key {key.value[:60]!r} is given twice (line {key.start_mark.line + 1})")
            seen.add(key.value)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: `malformed YAML at line N: problem`, or what a refused document does."""
    if isinstance(exc, YamlRefused):
        return str(exc)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"malformed YAML{where}: {problem}"


def load_yaml(text: str, where: str, error: type[MemrlError] = MemrlError) -> Any:
    """`safe_load`, any failure raised as `error`: `WHERE: malformed YAML at line N: ...` or `WHERE: <refusal>`."""
    try:
        return safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{where}: {describe_yaml_error(exc)}") from None
