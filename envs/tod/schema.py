"""SGD service schemas: slots and intents of each service, read from one or more `schema.json` files.

The MS-TOD release names a service without SGD's version suffix (`Restaurants`, not `Restaurants_1`). Such a bare
name resolves to the family of its versions, merged: the slots of every version together (the first version that
defines a slot gives its spec), and each intent with the slots it has in any version. `Schemas.restricted` narrows
services to the slots a released folder confirms (`extract.folder_schemas`).

A generated MS-TOD folder carries its own `schema.json` (only the services its tasks use), so the judger data and the
evaluation read the slot descriptions from the same place the generator did.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memrl.core import files as json_files
from memrl.core.errors import MemrlError, closest
from memrl.core.files import atomic_write_json


class TodDataError(MemrlError):
    """An MS-TOD or SGD file (or schema) is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class SlotSpec:
    name: str
    description: str
    is_categorical: bool = False
    possible_values: tuple[str, ...] = ()


@dataclass(frozen=True)
class IntentSpec:
    name: str
    description: str
    required_slots: tuple[str, ...]
    optional_slots: dict[str, str] = field(default_factory=dict)  # slot -> default value
    result_slots: tuple[str, ...] = ()
    is_transactional: bool = False

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots a user can fill for this intent, in schema order: required first, then optional."""
        return self.required_slots + tuple(s for s in self.optional_slots if s not in self.required_slots)


@dataclass(frozen=True)
class ServiceSchema:
    name: str
    description: str
    slots: dict[str, SlotSpec]
    intents: dict[str, IntentSpec]
    raw: dict[str, Any] = field(repr=False, compare=False)  # the SGD record, written back unchanged

    def slot_order(self, intent: str) -> list[str]:
        """The intent's slots first (schema order), then the service's other slots."""
        first = list(self.intents[intent].slots) if intent in self.intents else []
        return first + [s for s in self.slots if s not in first]

    def in_slot_order(self, intent: str, slots: Iterable[str]) -> list[str]:
        """`slots` sorted by `slot_order(intent)`; names the service lacks go last, in their given order."""
        order = self.slot_order(intent)
        return sorted(slots, key=lambda s: order.index(s) if s in order else len(order))


def _service(record: Mapping[str, Any], where: str) -> ServiceSchema:
    name = record.get("service_name")
    if not isinstance(name, str):
        raise TodDataError(f"{where}.service_name: missing or not a string")
    try:
        slots = {
            s["name"]: SlotSpec(
                s["name"],
                str(s.get("description", "")),
                bool(s.get("is_categorical", False)),
                tuple(str(v) for v in s.get("possible_values", ())),
            )
            for s in record.get("slots", ())
        }
        intents = {
            i["name"]: IntentSpec(
                i["name"],
                str(i.get("description", "")),
                tuple(i.get("required_slots", ())),
                {str(k): str(v) for k, v in dict(i.get("optional_slots", {})).items()},
                tuple(i.get("result_slots", ())),
                bool(i.get("is_transactional", False)),
            )
            for i in record.get("intents", ())
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise TodDataError(f"{where} ({name}): malformed slot or intent ({exc!r})") from exc
    for intent in intents.values():
        unknown = [s for s in intent.slots if s not in slots]
        if unknown:
            raise TodDataError(f"{where} ({name}).intents.{intent.name}: slot {unknown[0]!r} is not a slot of {name}")
    return ServiceSchema(name, str(record.get("description", "")), slots, intents, dict(record))


_VERSION = re.compile(r"^(?P<family>.+)_(?P<version>\d+)$")


def _merged_intent(name: str, versions: Sequence[IntentSpec]) -> IntentSpec:
    def united(parts: Iterable[Iterable[str]]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(x for part in parts for x in part))

    required = united(i.required_slots for i in versions)
    optional: dict[str, str] = {}
    for intent in versions:
        for slot, default in intent.optional_slots.items():
            if slot not in required:
                optional.setdefault(slot, default)
    return IntentSpec(
        name,
        versions[0].description,
        required,
        optional,
        united(i.result_slots for i in versions),
        any(i.is_transactional for i in versions),
    )


def merge_family(family: str, versions: Sequence[ServiceSchema]) -> ServiceSchema:
    """One service named `family` holding the slots and intents of all its `versions` (in version order)."""
    slots: dict[str, SlotSpec] = {}
    for version in versions:
        for slot in version.slots.values():
            slots.setdefault(slot.name, slot)
    names = dict.fromkeys(i for v in versions for i in v.intents)
    intents = {n: _merged_intent(n, [v.intents[n] for v in versions if n in v.intents]) for n in names}
    slot_records = {s["name"]: s for v in versions for s in reversed(v.raw.get("slots", ()))}  # first version wins
    raw = {
        "service_name": family,
        "description": versions[0].description,
        "slots": [slot_records[n] for n in slots if n in slot_records],
        "intents": [
            {
                "name": i.name,
                "description": i.description,
                "is_transactional": i.is_transactional,
                "required_slots": list(i.required_slots),
                "optional_slots": dict(i.optional_slots),
                "result_slots": list(i.result_slots),
            }
            for i in intents.values()
        ],
    }
    return ServiceSchema(family, versions[0].description, slots, intents, raw)


def only_slots(service: ServiceSchema, keep: Collection[str]) -> ServiceSchema:
    """`service` with only the slots in `keep` (its intents' slot lists and its raw record likewise)."""

    def kept(names: Iterable[str]) -> tuple[str, ...]:
        return tuple(n for n in names if n in keep)

    intents = {
        name: replace(
            i,
            required_slots=kept(i.required_slots),
            optional_slots={s: d for s, d in i.optional_slots.items() if s in keep},
            result_slots=kept(i.result_slots),
        )
        for name, i in service.intents.items()
    }
    raw = dict(service.raw)
    raw["slots"] = [s for s in raw.get("slots", ()) if isinstance(s, Mapping) and s.get("name") in keep]
    raw["intents"] = [
        {
            **r,
            "required_slots": list(kept(r.get("required_slots", ()))),
            "optional_slots": {s: d for s, d in dict(r.get("optional_slots", {})).items() if s in keep},
            "result_slots": list(kept(r.get("result_slots", ()))),
        }
        for r in raw.get("intents", ())
        if isinstance(r, Mapping)
    ]
    slots = {n: s for n, s in service.slots.items() if n in keep}
    return ServiceSchema(service.name, service.description, slots, intents, raw)


def families(services: Iterable[ServiceSchema]) -> dict[str, ServiceSchema]:
    """Bare family name -> its versions merged, for every family with a versioned service."""
    grouped: dict[str, list[tuple[int, ServiceSchema]]] = {}
    for service in services:
        if match := _VERSION.match(service.name):
            grouped.setdefault(match["family"], []).append((int(match["version"]), service))
    return {
        family: merge_family(family, [s for _, s in sorted(versions, key=lambda v: v[0])])
        for family, versions in grouped.items()
    }


class Schemas:
    """Services by name; lookups of an unknown service, intent or slot fail in one line with a suggestion.

    `services` holds the services as the files name them; a bare family name (`Restaurants`) that no file names
    resolves to the family's versions merged (`families`), everywhere a service is looked up.
    """

    def __init__(self, services: Iterable[ServiceSchema] = ()) -> None:
        self.services: dict[str, ServiceSchema] = {}
        for s in services:
            self.services.setdefault(s.name, s)  # SGD repeats a service across splits, identically
        self.families = {k: v for k, v in families(self.services.values()).items() if k not in self.services}

    def _find(self, name: object) -> ServiceSchema | None:
        if not isinstance(name, str):
            return None
        return self.services.get(name) or self.families.get(name)

    def __contains__(self, name: object) -> bool:
        return self._find(name) is not None

    def __len__(self) -> int:
        return len(self.services)

    def service(self, name: str) -> ServiceSchema:
        found = self._find(name)
        if found is None:
            hint = closest(name, [*self.services, *self.families])
            raise TodDataError(
                f"service {name!r} is not in the schema" + (f" (did you mean {hint!r}?)" if hint else "")
            )
        return found

    def intent(self, service: str, intent: str) -> IntentSpec:
        spec = self.service(service)
        try:
            return spec.intents[intent]
        except KeyError:
            raise TodDataError(f"intent {intent!r} is not an intent of service {service!r}") from None

    def slot(self, service: str, slot: str) -> SlotSpec:
        spec = self.service(service)
        try:
            return spec.slots[slot]
        except KeyError:
            raise TodDataError(f"slot {slot!r} is not a slot of service {service!r}") from None

    def has_slot(self, service: str, slot: str) -> bool:
        found = self._find(service)
        return found is not None and slot in found.slots

    def subset(self, names: Iterable[str]) -> Schemas:
        return Schemas(self.service(n) for n in sorted(set(names)))

    def restricted(self, used: Mapping[str, Iterable[str]]) -> Schemas:
        """A copy where each service named in `used` (as looked up: a bare family name too) keeps only the slots
        `used` lists for it, in every intent as well; the other services are unchanged."""
        out = Schemas()
        out.services, out.families = dict(self.services), dict(self.families)
        for name, slots in used.items():
            keep = set(slots)
            if name in out.services:
                out.services[name] = only_slots(out.services[name], keep)
            elif name in out.families:
                out.families[name] = only_slots(out.families[name], keep)
        return out

    def to_records(self) -> list[dict[str, Any]]:
        return [self.services[n].raw for n in sorted(self.services)]

    def write(self, path: str | Path) -> Path:
        """SGD `schema.json` format (a list of service records), services sorted by name."""
        return atomic_write_json(path, self.to_records(), indent=2)


def schema_files(path: str | Path) -> list[Path]:
    """`path` itself when it is a file; else `schema.json` in the folder and in its train/dev/test subfolders."""
    path = Path(path)
    if path.is_file():
        return [path]
    found = [path / "schema.json", *(path / split / "schema.json" for split in ("train", "dev", "test"))]
    return [p for p in found if p.is_file()]


def read_schema_file(path: Path) -> list[ServiceSchema]:
    data = json_files.read_json(path, TodDataError)
    if not isinstance(data, list):
        raise TodDataError(f"{path}: an SGD schema is a list of services (service_name, slots, intents)")
    out = []
    for index, record in enumerate(data):
        if not isinstance(record, dict):
            raise TodDataError(f"{path}: [{index}]: a service must be an object")
        try:
            out.append(_service(record, f"[{index}]"))
        except TodDataError as exc:
            raise TodDataError(f"{path}: {exc}") from exc
    return out


def load_schemas(*paths: str | Path) -> Schemas:
    """Services from schema.json files or folders holding them (train/dev/test subfolders included)."""
    files = [f for p in paths for f in schema_files(p)]
    if not files:
        raise TodDataError(f"no schema.json in {', '.join(map(str, paths)) or '(no path)'}")
    return Schemas(s for f in files for s in read_schema_file(f))


# --- phrasing from the schema, shared by the template writer and the memory builders --------------------------------

_BOOLEAN_PREFIXES = (
    "boolean flag indicating whether ",
    "boolean flag indicating if ",
    "boolean flag whether ",
    "boolean flag if ",
    "boolean flag for whether ",
    "whether or not ",
    "whether ",
    "if ",
)
_SOFT_PREFIXES = ("tentative ", "the ")


def _lower_first(text: str) -> str:
    # Keep acronyms ("IATA code") as they are.
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def is_boolean(slot: SlotSpec) -> bool:
    return set(slot.possible_values) == {"True", "False"}


def boolean_clause(slot: SlotSpec) -> str | None:
    """'the restaurant has outdoor seating' for a True/False slot whose description reads like a condition."""
    text = slot.description.strip().rstrip(".")
    low = text.lower()
    for prefix in _BOOLEAN_PREFIXES:
        if low.startswith(prefix):
            clause = text[len(prefix) :]
            return clause[: -len(" or not")] if clause.lower().endswith(" or not") else clause
    return None


def slot_phrase(slot: SlotSpec) -> str:
    """A short noun phrase for a slot: its description, lower-cased, cut at ' or ' ('date for the reservation')."""
    text = slot.description.strip().rstrip(".") or slot.name.replace("_", " ")
    text = text.split(" or ")[0]
    for prefix in _SOFT_PREFIXES:
        if text.lower().startswith(prefix):
            text = text[len(prefix) :]
    return _lower_first(text)


def slot_question(slot: SlotSpec) -> str:
    """The generic question a memory QA pair asks about a slot ('What is the date for the reservation?')."""
    clause = boolean_clause(slot) if is_boolean(slot) else None
    if clause:
        return f"Should it be that {clause}?"
    return f"What is the {slot_phrase(slot)}?"


def intent_phrase(intent: IntentSpec) -> str:
    """The intent as a verb phrase ('reserve a table at a restaurant')."""
    return _lower_first(intent.description.strip().rstrip(".") or intent.name)
