"""A JSON body checked before the app builds anything from it: its structure, then its fields.

The checks :class:`~tiletune.service.access.bodies.BodyGuard` runs, in a worker thread, on a large
JSON body of a route with a model; each refuses with :class:`BodyRefusedError`:

- **structure** (:func:`check_structure`): scanned before anything is built from it: at most
  :data:`MAX_DEPTH` levels, :data:`MAX_KEYS` keys per object, :data:`MAX_ELEMENTS` elements per
  array, and the route's most values; 413 ``too_large`` naming the limit and the byte where it
  was passed;
- **fields** (:func:`parse_json`, :func:`validate`): parsed, then validated against the route's
  model, lists item by item, so that no single step holds the interpreter long nor builds more
  than one item's errors; 422 ``invalid`` naming the first field at fault.

Every 422 ``invalid`` of the API states its field and message as :func:`error_field_and_message`
does (the app's handler of validation errors too).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any, get_args, get_origin

import annotated_types
from pydantic import BaseModel, TypeAdapter, ValidationError

from tiletune.client.wire import ErrorBody
from tiletune.service.errors import ServiceError, error_headers

#: Nesting levels a body may have (our deepest request has 5).
MAX_DEPTH = 32
#: Keys an object may have (our widest request object has 256: a worker's ``kernel_versions``).
MAX_KEYS = 1_000
#: Elements an array may have (our longest bounded request list has 10,000: a miss report's).
MAX_ELEMENTS = 100_000


class BodyRefusedError(Exception):
    """A body refused before the app saw it: the answer's status and :class:`ErrorBody`."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(code=code, message=message, field=field)
        self.headers = headers or {}

    @classmethod
    def of(cls, error: ServiceError) -> BodyRefusedError:
        """The refusal of a service error (401, 403, 429, 503), with its headers."""
        return cls(error.status, error.code, error.message, error.field, error_headers(error))


def too_large(message: str) -> BodyRefusedError:
    """413 ``too_large``: the body is over a limit, as ``message`` says."""
    return BodyRefusedError(413, "too_large", message, "body")


# -- the structure, scanned before anything is built ----------------------------------------------

#: A JSON token: a string (group 1: followed by ``:``, a key), a bracket, or a scalar
#: (number, ``true``, ...). Commas, colons and spaces between them are skipped.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?|[\[\]{}]|[^\s,:"\[\]{}]+')
_OPENS = frozenset(b"[{")
_CLOSES = frozenset(b"]}")
_OBJECT = ord("{")


def check_structure(body: bytes, max_values: int | None = None) -> None:
    """Refuse (413) a body nested over :data:`MAX_DEPTH`, with an object over :data:`MAX_KEYS`
    keys, an array over :data:`MAX_ELEMENTS` elements, or over ``max_values`` values.

    One pass over the tokens, stopping at the first limit passed; nothing is built. Invalid JSON
    is left to the parser (its counts are bounded all the same).
    """
    open_containers: list[list[int]] = []  # [kind, items] of each open array or object, innermost last
    values = 0
    for token in _TOKENS.finditer(body):
        first = body[token.start()]
        if first in _CLOSES:
            if open_containers:
                open_containers.pop()
            continue
        inside = open_containers[-1] if open_containers else None
        if token.lastindex:  # a key
            if inside is not None:
                inside[1] += 1
                if inside[1] > MAX_KEYS:
                    raise too_large(f"the body has an object of more than {MAX_KEYS:,} keys{_at(token)}")
            continue
        values += 1
        if max_values is not None and values > max_values:
            raise too_large(f"the body has more than {max_values:,} values, this route's most{_at(token)}")
        if inside is not None and inside[0] != _OBJECT:
            inside[1] += 1
            if inside[1] > MAX_ELEMENTS:
                raise too_large(f"the body has an array of more than {MAX_ELEMENTS:,} elements{_at(token)}")
        if first in _OPENS:
            open_containers.append([first, 0])
            if len(open_containers) > MAX_DEPTH:
                raise too_large(f"the body nests deeper than {MAX_DEPTH} levels{_at(token)}")


def _at(token: re.Match[bytes]) -> str:
    return f" (at byte {token.start():,})"


# -- parsing and validation, in steps that each hold the interpreter briefly -----------------------


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of the body (a Python call per object lets other threads run while a body is parsed)."""
    return dict(pairs)


def parse_json(body: bytes) -> Any:
    """The body's JSON; 422 ``invalid`` naming the fault when it is not JSON."""
    try:
        return json.loads(body, object_pairs_hook=_object)
    except UnicodeDecodeError:
        raise BodyRefusedError(422, "invalid", "the body is not UTF-8 text", "body") from None
    except json.JSONDecodeError as error:
        raise BodyRefusedError(422, "invalid", not_json_message(error.msg, error.pos), "body") from None
    except RecursionError:
        raise too_large(f"the body nests deeper than {MAX_DEPTH} levels") from None


def not_json_message(reason: str, position: int) -> str:
    """The message of a body that is not JSON."""
    return f"the body is not valid JSON: {reason} (at byte {position:,})"


def validate(model: type[BaseModel], data: Any, location: tuple[int | str, ...] = ()) -> BaseModel:
    """``data`` as ``model``; :class:`BodyRefusedError` (422) naming the first field at fault.

    Each list field is validated item by item first (recursively, within the list's length
    limit), so one step never holds the interpreter for more than an item, nor builds more than
    one item's errors; the model then takes the validated items as they are.
    """
    if isinstance(data, dict):
        data = dict(data)
        for name, (item_type, max_items) in _list_fields(model).items():
            items = data.get(name)
            if isinstance(items, list) and (max_items is None or len(items) <= max_items):
                data[name] = [
                    _validate_item(item_type, item, (*location, name, index))
                    for index, item in enumerate(items)
                ]
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise _first_error(error, location) from None


def _validate_item(item_type: Any, item: Any, location: tuple[int | str, ...]) -> Any:
    if isinstance(item_type, type) and issubclass(item_type, BaseModel):
        return validate(item_type, item, location)
    try:
        return _adapter(item_type).validate_python(item)
    except ValidationError as error:
        raise _first_error(error, location) from None


@cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


@cache
def _list_fields(model: type[BaseModel]) -> dict[str, tuple[Any, int | None]]:
    """The model's list fields: name -> (item type, most items or ``None``)."""
    fields = {}
    for name, field in model.model_fields.items():
        if get_origin(field.annotation) is list:
            max_items = next(
                (m.max_length for m in field.metadata if isinstance(m, annotated_types.MaxLen)), None
            )
            fields[name] = (get_args(field.annotation)[0], max_items)
    return fields


def _first_error(error: ValidationError, location: tuple[int | str, ...]) -> BodyRefusedError:
    first = error.errors(include_url=False, include_context=False, include_input=False)[0]
    field, message = error_field_and_message((*location, *first["loc"]), first["msg"])
    return BodyRefusedError(422, "invalid", message, field)


def error_field_and_message(location: tuple[int | str, ...], message: str) -> tuple[str | None, str]:
    """A validation error's field (``shapes[0].n``) and message, as every 422 ``invalid`` states them."""
    field = field_path(location)
    return field, (f"{field}: {message}" if field else message)


def field_path(location: tuple[int | str, ...] | list[int | str]) -> str | None:
    """A validation error's location as one path: ``("body", "shapes", 0, "n")`` -> ``shapes[0].n``."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("body", "query", "path", "header"):
            path += f".{part}" if path else part
    return path or None


def check_json(body: bytes, model: type[BaseModel], max_values: int | None = None) -> None:
    """Refuse a JSON body its route would refuse: structure (413; at most ``max_values`` values),
    not JSON or invalid as ``model`` (422).

    Runs in a worker thread: each step lets the event loop's thread run between its pieces.
    """
    check_structure(body, max_values)
    validate(model, parse_json(body))
