"""Terminal input that survives any byte: `ByteSafeLinuxDriver`, the TUI's driver on Linux and macOS, and
`AltKeyParser`, which reports every Esc-then-character packet as alt+<key>.

Textual 8.2.8's `LinuxDriver.run_input_thread` decodes stdin with a strict UTF-8 decoder.  One byte that is
not UTF-8 (0xFF, a lone 0x80: a terminal in Latin-1, a stray Alt+key in "8-bit meta" mode, line noise on a
serial or SSH link) raises UnicodeDecodeError in its input thread; the thread then asks the app to panic,
and the TUI exits at once with status 0 and nothing on screen.  This driver runs the same loop with a
decoder that drops undecodable bytes, so the keys around them still arrive (a multi-byte character split
between two reads is still joined: the decoder is incremental).

Esc then a key, in one packet (type-ahead over SSH, or Esc typed quickly before a letter), is what a
terminal sends for alt+key, so Textual's parser reads it as one key.  It does so inconsistently: "\x1br" is
alt+r, but "\x1b/" is a bare slash (the Esc is lost) and "\x1b1" is "¡" (a macOS option-key character).
`AltKeyParser` makes every such pair alt+<key>, so that `app.typeahead` can tell it apart and, where no
binding uses that alt+key, hand it on as Esc followed by the key (issue 21 #6).  ESC b / ESC f stay Textual's
word-left / word-right (the macOS option+arrow convention), and the prefixes of longer sequences (CSI "[",
SS3 "O", DCS, OSC ...) are untouched.

The loop below is Textual's own (linux_driver.py of textual 8.2.8), with only the decoder's error mode
changed; the decoder is a local of that method, so there is no smaller place to change it.
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder
from collections.abc import Iterable

from textual import events
from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.keys import _character_to_key

# What the decoder does with bytes that are not UTF-8: drop them ("replace" would type U+FFFD into a field).
UNDECODABLE = "ignore"


ESC = "\x1b"
SEQUENCE_STARTS = frozenset("[OP]_^\\")  # CSI, SS3, DCS, OSC, APC, PM, ST: a longer sequence follows
WORD_MOVES = frozenset("bf")  # ESC b / ESC f: Textual's ctrl+left / ctrl+right (macOS option+arrows)


def key_name(character: str) -> str:
    """Textual's key name for one typed character: "r", "R", "slash", "space"."""
    return character if character.isalnum() else _character_to_key(character)


def alt_key(character: str) -> events.Key:
    """The alt+<key> event for Esc followed by ``character`` (its character is the key's own)."""
    name = key_name(character)
    if len(name) == 1 and name.isupper():
        name = f"shift+{name.lower()}"
    return events.Key(f"alt+{name}", character)


class AltKeyParser(XTermParser):
    """Textual's parser, reporting Esc followed by any printable ASCII character as alt+<key> (see above)."""

    def _sequence_to_key_events(self, sequence: str, alt: bool = False) -> Iterable[events.Key]:
        if len(sequence) == 2 and sequence[0] == ESC:
            character = sequence[1]
            if " " <= character <= "~" and character not in SEQUENCE_STARTS | WORD_MOVES:
                yield alt_key(character)
                return
        yield from super()._sequence_to_key_events(sequence, alt)


class ByteSafeLinuxDriver(LinuxDriver):
    """Textual's LinuxDriver whose input thread ignores bytes that are not UTF-8 (see the module docstring)."""

    def run_input_thread(self) -> None:
        """Wait for input and dispatch events (Textual's loop; undecodable bytes are dropped)."""
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)

        fileno = self.fileno
        EVENT_READ = selectors.EVENT_READ

        parser = AltKeyParser(self._debug)
        feed = parser.feed
        tick = parser.tick

        decode = getincrementaldecoder("utf-8")(errors=UNDECODABLE).decode
        read = os.read

        def process_selector_events(
            selector_events: list[tuple[selectors.SelectorKey, int]], final: bool = False
        ) -> None:
            for last, (_selector_key, mask) in loop_last(selector_events):
                if mask & EVENT_READ:
                    data = read(fileno, 1024 * 4)
                    if not data:  # end of input (a piped stdin)
                        break
                    # Bytes that decode to nothing (only undecodable ones, or the first part of a character)
                    # are not the end of input: Textual's loop read "" as that, here it only means "no keys".
                    unicode_data = decode(data, final=final and last)
                    for event in feed(unicode_data) if unicode_data else ():
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process_selector_events(selector.select(0.1))
            selector.unregister(self.fileno)
            process_selector_events(selector.select(0.1), final=True)
        finally:
            selector.close()
            try:
                for _event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
