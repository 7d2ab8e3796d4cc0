"""Load recipes: compose (`extends`), override (`a.b=value`), interpolate (`${ENV}`), validate, save.

Environment references stay references in the saved recipe, so secrets never reach disk or logs.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from memrl.app.config import Recipe
from memrl.app.context import RESOLVED_NAME
from memrl.core import secrets
from memrl.core.envrefs import ENV_REF, register_secrets, substitute
from memrl.core.errors import ConfigError
from memrl.core.files import atomic_write_text, describe_kind, read_text
from memrl.core.runfolder import RUNTIME_KEYS
from memrl.core.schema import describe_error, did_you_mean
from memrl.core.secrets import redact
from memrl.core.yamlsafe import MAX_DEPTH, YamlRefused, load_yaml, safe_load

Key = str | int
# Recipes are a few KB; PyYAML would spend minutes on a hostile 50 MB file before finding it malformed.
MAX_RECIPE_BYTES = 2**20


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
        """Write the resolved recipe into the run folder, refusing one that holds a run of another setup (the
        stages would mix two experiments' outputs, and the saved recipe would no longer say what was run)."""
        text = redact(yaml.safe_dump(self.resolved(), sort_keys=False))
        saved = directory / RESOLVED_NAME
        if saved.is_file():
            before = load_yaml(read_text(saved, ConfigError, limit=MAX_RECIPE_BYTES), str(saved), ConfigError)
            if isinstance(before, dict) and (changed := setup_changes(before, safe_load(text))):
                raise ConfigError(
                    f"{directory} holds a run of another setup ({', '.join(changed[:3])} "
                    f"{'differs' if len(changed) == 1 else 'differ'}): use another "
                    f"output_dir, or `memrl resume {directory}` to go on with the saved one"
                )
        return atomic_write_text(saved, text)


# What a rerun may change in a run folder's recipe: words, the smoke list, tracking and where the folder is (a resume
# names it absolutely), and how work is carried out (runfolder.RUNTIME_KEYS, at any depth).
_MAY_CHANGE = frozenset({"description", "smoke", "logging", "output_dir"})


def setup_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two resolved recipes, apart from what a rerun may change."""
    changed: list[str] = []

    def walk(a: Any, b: Any, path: tuple[str, ...]) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                if (not path and key in _MAY_CHANGE) or key in RUNTIME_KEYS:
                    continue
                walk(a.get(key), b.get(key), (*path, str(key)))
        elif a != b:
            changed.append(".".join(path))

    walk(before, after, ())
    return changed


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
        if os.path.lexists(path) and not path.is_dir():  # a FIFO, a device, a broken link: say what it is
            raise ConfigError(f"recipe {path}: {describe_kind(path)}, not a file")
    bundled = bundled_recipes()
    name = ref.removesuffix(".yaml")
    if name in bundled:
        return bundled[name]
    hint = did_you_mean(name, bundled)
    what = "a folder, not a file" if any(path.is_dir() for path in candidates) else "not a file"
    raise ConfigError(f"recipe {ref!r} not found: {what}, nor a bundled recipe{hint}")


# ---- loading -----------------------------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    text = read_text(path, ConfigError, limit=MAX_RECIPE_BYTES)
    data = load_yaml(text, f"recipe {path}", ConfigError)
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
    merged: dict[str, Any] = {}
    for parent in _parents(path, data.pop("extends", None)):
        merged = deep_merge(merged, compose(find_recipe(parent, relative_to=path.parent), (*_seen, path)))
    return deep_merge(merged, data)


def _parents(path: Path, extends: Any) -> list[str]:
    """The recipes `extends` names: one name or path, or a list of them."""
    parents = [extends] if isinstance(extends, str) else extends if extends is not None else []
    if not isinstance(parents, list) or not all(isinstance(p, str) and p.strip() for p in parents):
        raise ConfigError(
            f"recipe {path}: `extends` must be a recipe name or path, or a list of them, got {extends!r}"[:300]
        )
    return parents


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
            raise ConfigError(f"override {_shown(item)} is not of the form dotted.key=value")
        parts = key.strip().split(".")
        if len(parts) > MAX_DEPTH:  # every later walk of the recipe recurses once per level
            raise ConfigError(f"override {_shown(item)}: its key is nested more than {MAX_DEPTH} levels deep")
        try:
            value = safe_load(raw) if raw.strip() else ""
        except YamlRefused as exc:
            raise ConfigError(f"override {_shown(item)}: {exc}") from None
        except yaml.YAMLError:  # not YAML: the text itself, e.g. `prompt=a: b`
            value = raw
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            node = _section(node, part, parts[: i + 1], item)
        if isinstance(node, list):
            node[_index(node, parts[-1], parts, item)] = value
        else:
            node[parts[-1]] = value
    return data


def _shown(item: str, limit: int = 120) -> str:
    """An override as error lines quote it: cut to `limit` characters (one may be 100 KB long)."""
    return repr(item if len(item) <= limit else item[:limit] + "...")


def _index(node: list[Any], part: str, path: Sequence[str], item: str) -> int:
    """A list position named in an override: an existing index, since a recipe's lists have no gaps."""
    # ASCII digits only (`²` is a digit int() refuses), and few of them (int() refuses 4,300 digits and more).
    if not (part.isascii() and part.isdigit() and len(part) <= 9) or int(part) >= len(node):
        where = ".".join(path[:-1])
        indices = f"0..{len(node) - 1}" if node else "none: the list is empty"
        raise ConfigError(
            f"override {_shown(item)}: {where} is a list; {part[:20]!r} is not one of its indices ({indices})"
        )
    return int(part)


def _section(node: Any, part: str, path: Sequence[str], item: str) -> Any:
    """The map or list under `part` that an override descends into; a missing map key starts an empty map."""
    if isinstance(node, list):
        child = node[_index(node, part, path, item)]
    else:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
    if not isinstance(child, dict | list):
        raise ConfigError(f"override {_shown(item)}: {'.'.join(path)[:120]} is a value, not a section")
    return child


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
    if isinstance(data, str) and ENV_REF.search(data):
        where = ".".join(map(str, path))
        templates[path] = data
        resolved = substitute(
            data, message=lambda name: f"recipe key {where!r}: environment variable {name} is not set"
        )
        # A whole-value reference such as ${PORT} may stand for a number or a boolean; a secret stays text (read as
        # YAML, `sk-...: x` would be a mapping that error lines then show).
        whole = ENV_REF.fullmatch(data) and resolved and resolved not in secrets.known()
        return (_env_value(resolved) if whole else resolved), templates
    return data, templates


def _env_value(text: str) -> Any:
    """A whole-value `${VAR}` as YAML (a port, a flag, a list); text that is no plain YAML stays text, unechoed:
    the variable may hold a secret."""
    try:
        return safe_load(text)
    except yaml.YAMLError:
        return text


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
    register_secrets(raw)  # before substitution, while a field still says which variables it takes a secret from
    data, templates = interpolate(raw)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"recipe {source.name}: {describe_error(exc, Recipe)}") from None
    return LoadedRecipe(recipe, source, templates)


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
