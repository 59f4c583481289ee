"""Where each key of a profile's TOML text sits (line numbers for problems)."""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

# --- the TOML line scanner -------------------------------------------------------------------------------


def toml_key_lines(text: str) -> dict[str, int]:
    """Dotted key → 1-based line where the TOML text defines it.

    Tables map their own path (``server.env``), keys map ``server.port``, array elements map
    ``server.extra_args[2]`` (the element's own line in a multi-line array).  Meant for text that tomllib
    has accepted; on anything else it returns what it found so far.
    """
    scanner = _TomlLineScanner(text)
    try:
        scanner.document()
    except (IndexError, ValueError):
        pass
    return scanner.lines


class _TomlLineScanner:
    _BARE = re.compile(r"[A-Za-z0-9_-]+")

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.lines: dict[str, int] = {}
        self.array_tables: dict[str, int] = {}

    # low level
    def _peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def _advance(self, n: int = 1) -> None:
        chunk = self.s[self.i : self.i + n]
        self.line += chunk.count("\n")
        self.i += len(chunk)

    def _skip(self, newlines: bool = False) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self._advance()
            elif c == "#":
                end = self.s.find("\n", self.i)
                self._advance((end if end != -1 else len(self.s)) - self.i)
            else:
                return

    def _record(self, path: str, line: int) -> None:
        self.lines.setdefault(path, line)

    # grammar
    def document(self) -> None:
        prefix = ""
        while True:
            self._skip(newlines=True)
            if self.i >= len(self.s):
                return
            start = self.i
            if self._peek(2) == "[[":
                line = self.line
                self._advance(2)
                base = self._key()
                self._skip()
                self._advance(2)
                index = self.array_tables.get(base, -1) + 1
                self.array_tables[base] = index
                prefix = f"{base}[{index}]"
                self._record(base, line)
                self._record(prefix, line)
            elif self._peek() == "[":
                line = self.line
                self._advance()
                prefix = self._key()
                self._skip()
                self._advance()
                self._record(prefix, line)
            else:
                self._keyval(prefix)
            if self.i == start:  # never loop without progress
                self._advance()

    def _keyval(self, prefix: str) -> None:
        line = self.line
        path = self._key(prefix)
        self._skip()
        if self._peek() != "=":
            raise ValueError("expected '='")
        self._advance()
        self._skip()
        self._record(path, line)
        self._value(path)

    def _key(self, prefix: str = "") -> str:
        parts: list[str] = [prefix] if prefix else []
        while True:
            self._skip()
            c = self._peek()
            if c == '"':
                parts.append(self._basic_string())
            elif c == "'":
                parts.append(self._literal_string())
            else:
                m = self._BARE.match(self.s, self.i)
                if not m:
                    raise ValueError("expected a key")
                parts.append(m.group(0))
                self._advance(len(m.group(0)))
            self._record(".".join(parts), self.line)
            self._skip()
            if self._peek() != ".":
                return ".".join(parts)
            self._advance()

    def _value(self, path: str) -> None:
        if self._peek(3) in ('"""', "'''"):
            quote = self._peek(3)
            self._advance(3)
            while self.i < len(self.s):
                if quote == '"""' and self._peek() == "\\":
                    self._advance(2)
                elif self._peek(3) == quote:
                    self._advance(3)
                    while self._peek() == quote[0]:  # up to two quotes may close the content
                        self._advance()
                    return
                else:
                    self._advance()
            return
        c = self._peek()
        if c == '"':
            self._basic_string()
        elif c == "'":
            self._literal_string()
        elif c == "[":
            self._advance()
            index = 0
            while True:
                self._skip(newlines=True)
                if self._peek() in ("]", ""):
                    self._advance()
                    return
                self._record(f"{path}[{index}]", self.line)
                self._value(f"{path}[{index}]")
                self._skip(newlines=True)
                if self._peek() == ",":
                    self._advance()
                    index += 1
        elif c == "{":
            self._advance()
            while True:
                self._skip()
                if self._peek() in ("}", ""):
                    self._advance()
                    return
                self._keyval(path)
                self._skip()
                if self._peek() == ",":
                    self._advance()
        else:
            m = re.compile(r"[^,\]}\n#]*").match(self.s, self.i)
            self._advance(len(m.group(0)) if m else 1)

    def _basic_string(self) -> str:
        self._advance()
        out = []
        while self.i < len(self.s) and self._peek() != '"':
            if self._peek() == "\\":
                out.append(self.s[self.i : self.i + 2])
                self._advance(2)
            else:
                out.append(self._peek())
                self._advance()
        self._advance()
        return "".join(out)

    def _literal_string(self) -> str:
        end = self.s.index("'", self.i + 1)
        value = self.s[self.i + 1 : end]
        self._advance(end + 1 - self.i)
        return value


def _line_of(lines: Mapping[str, int], dotted: str) -> int | None:
    """The line of ``dotted``, else of the nearest enclosing key (``a.b[2]`` → ``a.b`` → ``a``)."""
    key = dotted
    while key:
        if key in lines:
            return lines[key]
        if key.endswith("]") and "[" in key:
            key = key[: key.rindex("[")]
        elif "." in key:
            key = key[: key.rindex(".")]
        else:
            return None
    return None


def _did_you_mean(key: str, choices) -> str:
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
