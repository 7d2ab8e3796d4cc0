"""Load recipes: compose (`extends`), override (`a.b=value`), interpolate (`${ENV}`), validate, save.

Environment references stay references in the saved recipe, so secrets never reach disk or logs.
"""

from __future__ import annotations

import copy
import os
import re
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from memrl.app.config import Recipe
from memrl.core.errors import ConfigError, closest

Key = str | int
RESOLVED_NAME = "recipe.resolved.yaml"  # what every run writes into its folder; `memrl resume` reads it back
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


@dataclass
class LoadedRecipe:
    recipe: Recipe
    source: Path
    # Dotted paths whose value came from ${ENV}; the saved recipe keeps the reference there.
    env_templates: dict[tuple[Key, ...], str] = field(default_factory=dict)

    def resolved(self) -> dict[str, Any]:
        """The validated recipe with defaults filled in and environment references restored."""
        data = self.recipe.model_dump(mode="json", exclude_none=False)
        for path, template in self.env_templates.items():
            _set_if_present(data, path, template)
        return data

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / RESOLVED_NAME
        out.write_text(yaml.safe_dump(self.resolved(), sort_keys=False))
        return out


# ---- finding recipes ---------------------------------------------------------------------------------------


def bundled_recipes() -> dict[str, Path]:
    """Recipes shipped with memrl, by name."""
    root = resources.files("memrl.recipes")
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")}


def find_recipe(ref: str, relative_to: Path | None = None) -> Path:
    """A recipe reference is a bundled name or a path to a YAML file."""
    candidates = [Path(ref).expanduser()]
    if relative_to is not None:
        candidates.insert(0, relative_to / ref)
    for path in candidates:
        if path.is_file():
            return path.resolve()
    bundled = bundled_recipes()
    name = ref.removesuffix(".yaml")
    if name in bundled:
        return bundled[name]
    hint = _closest(name, bundled)
    raise ConfigError(f"recipe {ref!r} not found: not a file, nor a bundled recipe{hint}")


# ---- loading -----------------------------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"recipe {path}: malformed YAML{where}: {problem}") from None
    except OSError as exc:
        raise ConfigError(f"recipe {path}: cannot read: {exc.strerror}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: top level must be a mapping, got {type(data).__name__}")
    return data


def compose(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a recipe and the chain of recipes it `extends`, later files overriding earlier ones."""
    if path in _seen:
        chain = " -> ".join(p.name for p in (*_seen, path))
        raise ConfigError(f"recipe {path}: `extends` forms a cycle: {chain}")
    data = _read_yaml(path)
    parents = data.pop("extends", None) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict[str, Any] = {}
    for parent in parents:
        merged = deep_merge(merged, compose(find_recipe(parent, relative_to=path.parent), (*_seen, path)))
    return deep_merge(merged, data)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides; values parse as YAML scalars or flow collections."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node: Any = data
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict | list):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is a value, not a section")
            node = nxt
        if isinstance(node, list):
            node[int(parts[-1])] = value
        else:
            node[parts[-1]] = value
    return data


def interpolate(data: Any, path: tuple[Key, ...] = ()) -> tuple[Any, dict[tuple[Key, ...], str]]:
    """Replace ${VAR} and ${VAR:-default} in strings; return the result and where each template was."""
    templates: dict[tuple[Key, ...], str] = {}
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out[k], sub = interpolate(v, (*path, k))
            templates.update(sub)
        return out, templates
    if isinstance(data, list):
        items = []
        for i, v in enumerate(data):
            item, sub = interpolate(v, (*path, i))
            items.append(item)
            templates.update(sub)
        return items, templates
    if isinstance(data, str) and _ENV_REF.search(data):

        def lookup(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            value = os.environ.get(name)
            if value is None:
                if default is None:
                    where = ".".join(map(str, path))
                    raise ConfigError(f"recipe key {where!r}: environment variable {name} is not set")
                return default
            return value

        templates[path] = data
        resolved = _ENV_REF.sub(lookup, data)
        # A whole-value reference such as ${PORT} may stand for a number or a boolean.
        return (yaml.safe_load(resolved) if _ENV_REF.fullmatch(data) and resolved else resolved), templates
    return data, templates


def load_recipe(ref: str | Path, overrides: Sequence[str] = (), smoke: bool = False) -> LoadedRecipe:
    """`smoke` applies the recipe's own `smoke` overrides first (a tiny model, a few steps), then the caller's."""
    source = find_recipe(str(ref))
    raw = compose(source)
    if smoke:
        smoke_overrides = raw.get("smoke") or []
        if not smoke_overrides:
            raise ConfigError(f"recipe {source.name} defines no `smoke` overrides")
        raw = apply_overrides(raw, [str(o) for o in smoke_overrides])
    raw = apply_overrides(raw, overrides)
    data, templates = interpolate(raw)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"recipe {source.name}: {describe_error(exc, Recipe)}") from None
    return LoadedRecipe(recipe, source, templates)


# ---- one-line validation errors ----------------------------------------------------------------------------


def describe_error(exc: ValidationError, root: type[BaseModel]) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    shown, parent = _walk(root, loc[:-1])
    if first["type"] == "extra_forbidden" and loc:
        key = str(loc[-1])
        where = ".".join([*shown, key])
        hint = _closest(key, list(parent.model_fields)) if parent is not None else ""
        line = f"unknown key {where!r}{hint}"
    else:
        where = ".".join([*shown, *(map(str, loc[-1:]) if loc else [])]) or "(top level)"
        line = _explain(first, where)
    more = len(errors) - 1
    return line + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def _explain(error: Any, where: str) -> str:
    kind, msg = error["type"], error["msg"]
    if kind == "missing":
        return f"required key {where!r} is missing"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    ctx = error.get("ctx", {})
    if kind == "union_tag_not_found":
        return f"required key '{where}.{ctx['discriminator'].strip(chr(39))}' is missing"
    if kind == "union_tag_invalid":
        return (
            f"{where}.{ctx['discriminator'].strip(chr(39))}: expected one of {ctx['expected_tags']}, got {ctx['tag']!r}"
        )
    expected = msg.removeprefix("Input should be ")
    return f"{where}: expected {expected}, got {error['input']!r}"


def _walk(root: type[BaseModel], loc: tuple[Key, ...]) -> tuple[list[str], type[BaseModel] | None]:
    """Follow a pydantic error location through the schema; drop union tags from the displayed path."""
    shown: list[str] = []
    node: Any = root
    i = 0
    while i < len(loc):
        node = _unwrap(node)
        part = loc[i]
        if isinstance(node, type) and issubclass(node, BaseModel):
            info = node.model_fields.get(str(part))
            node = info.annotation if info is not None else None
            shown.append(str(part))
        elif typing.get_origin(node) in (dict, list):
            node = typing.get_args(node)[-1]
            shown.append(str(part))
        elif _is_union(node):
            member = _union_member(node, part)
            if member is None:
                return shown, None
            node = member
        else:
            return shown, None
        i += 1
    node = _unwrap(node)
    if _is_union(node):
        models = [m for m in typing.get_args(node) if isinstance(m, type) and issubclass(m, BaseModel)]
        node = models[0] if len(models) == 1 else None
    return shown, node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _unwrap(node: Any) -> Any:
    while typing.get_origin(node) is typing.Annotated:
        node = typing.get_args(node)[0]
    return node


def _is_union(node: Any) -> bool:
    return typing.get_origin(node) in (Union, types.UnionType)


def _union_member(node: Any, tag: Key) -> Any:
    """The union member whose Literal discriminator equals `tag` (pydantic puts the tag in the location)."""
    for member in typing.get_args(node):
        if isinstance(member, type) and issubclass(member, BaseModel):
            for info in member.model_fields.values():
                if typing.get_origin(info.annotation) is typing.Literal and tag in typing.get_args(info.annotation):
                    return member
    return None


def _closest(word: str, options: Iterable[str]) -> str:
    match = closest(word, options)
    return f" (did you mean {match!r}?)" if match else ""


def _set_if_present(data: Any, path: tuple[Key, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return
    key = path[-1]
    if isinstance(node, list):
        if isinstance(key, int) and key < len(node):
            node[key] = value
    elif isinstance(node, dict) and key in node:
        node[key] = value
