"""Round-trip writing of a profile's TOML: change only the values that changed, keep the rest of the file.

Saving from the editor and toggling capture used to regenerate the file, which dropped the user's comments,
blank lines and key order.  `updated_toml` applies the profile's values onto the existing document with
tomlkit: a changed value is replaced in place, a new key is added to its table, a key the profile no longer
writes (back to its default) is removed.  Anything else in the file (comments, order, layout) stays.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError


def updated_toml(original: str, doc: Mapping[str, Any], sections: tuple[str, ...],
                 top_keys: tuple[str, ...] = ()) -> str | None:
    """``original`` with the values of ``doc`` (section -> key -> value) applied; keys of ``sections`` that
    ``doc`` no longer has are removed.  None when ``original`` is not TOML tomlkit can edit (the caller
    writes the file anew)."""
    try:
        document = tomlkit.parse(original)
    except (TOMLKitError, ValueError):
        return None
    for key in top_keys:  # plain keys before the first table (``host = "gpu2"``)
        if key in doc:
            if key not in document or _plain(document[key]) != doc[key]:
                document[key] = doc[key]
        elif key in document:
            del document[key]
    for section in sections:
        values = doc.get(section)
        table = document.get(section)
        if table is None:
            if values:
                document[section] = values
            continue
        if not isinstance(table, MutableMapping):
            return None  # `server = 3`: not a layout worth keeping; validation would have refused it
        _merge(table, values or {})
    return tomlkit.dumps(document)


def _merge(table: MutableMapping[str, Any], values: Mapping[str, Any]) -> None:
    for key in [k for k in table if k not in values]:
        del table[key]
    for key, value in values.items():
        current = table.get(key)
        if isinstance(value, Mapping) and isinstance(current, MutableMapping):
            _merge(current, value)
        elif current is None or _plain(current) != value:
            table[key] = value


def _plain(item: Any) -> Any:
    unwrap = getattr(item, "unwrap", None)
    return unwrap() if unwrap is not None else item
