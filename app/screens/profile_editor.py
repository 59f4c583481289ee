"""The profile editor: the flags people used to hand-edit in launch scripts, checked as they type.

Every change re-validates after a short pause, in a thread worker (`validate_profile` may probe the port
and read the installed SGLang's source), and the messages appear next to their fields.  The command
preview is `build_command(...).shell_text()` with secrets redacted.  The attention backend is a Select
with the installed SGLang's own choices when SGLang is found for the profile's Python
(`sessions.sglang_source`), and free text with a note otherwise.  Save writes the profile's file;
Save as writes a new one.  Leaving with unsaved changes asks first.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.widgets import Button, Footer, Input, Label, Select, Static, Switch
from textual.worker import Worker, WorkerState

from app.keymap import EDITOR_KEYS, bindings
from widgets.confirm_modal import ConfirmModal, DismissOnce
from widgets.env_table import EnvTable
from widgets.inputs import InOrderInput
from widgets.lists import PageSafeSelect

if TYPE_CHECKING:
    from sessions.home import Home

VALIDATE_DEBOUNCE_S = 0.3
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_InputKind = Literal["integer", "number", "text"]  # what Textual's Input(type=...) takes

# form widget id -> the profile field that `validate_profile` names in its problems
FIELD_OF_WIDGET = {
    "model_path": "server.model_path",
    "tp_size": "server.tp_size",
    "host": "server.host",
    "port": "server.port",
    "attention_backend": "server.attention_backend",
    "mem_fraction_static": "server.mem_fraction_static",
    "chunked_prefill_size": "server.chunked_prefill_size",
    "cuda_graph": "server.cuda_graph",
    "radix_cache": "server.radix_cache",
    "capture_enabled": "capture.enabled",
    "extra_args": "server.extra_args",
    "env": "server.env",
    "time_scale": "emulator.time_scale",
    "fault": "emulator.fault",
}
WIDGET_OF_FIELD = {field: widget for widget, field in FIELD_OF_WIDGET.items()}


@dataclasses.dataclass(frozen=True)
class EditorCheck:
    """What one validation run found: problems per widget id, the rest, and the command preview."""

    by_widget: dict[str, list[tuple[str, str]]]  # widget id -> [(severity, message)]
    general: list[str]
    preview: str
    profile: Any  # the LaunchProfile the form describes, or None when the form does not parse
    seq: int = 0  # which validation run (only the latest is shown)


class ProfileChecked(Message):
    def __init__(self, check: EditorCheck) -> None:
        super().__init__()
        self.check = check


class ProfileSaved(Message):
    def __init__(self, name: str, path: str) -> None:
        super().__init__()
        self.name = name
        self.path = path


class NameModal(DismissOnce, ModalScreen[str | None]):
    """Ask for a new profile name (Save as)."""

    DEFAULT_CSS = """
    NameModal { align: center middle; }
    NameModal > Vertical { width: 70%; max-width: 80; height: auto; border: thick $accent;
                           background: $surface; padding: 0 1; }
    NameModal #name-error { color: $error; height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, suggestion: str, profiles_dir: Path) -> None:
        super().__init__()
        self.suggestion = suggestion
        self.profiles_dir = profiles_dir

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Save as profile (letters, digits, . _ -):")
            yield InOrderInput(self.suggestion, id="new-name")
            yield Static("", id="name-error")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = event.value.strip()
        if not _PROFILE_NAME.match(name):
            self.query_one("#name-error", Static).update(
                f"profile name {name!r}: use letters, digits, '.', '_' or '-' (at most 100)"
            )
            return
        self.dismiss(name)

    def action_cancel(self) -> None:
        self.dismiss(None)


SWITCH_NAMES = {"cuda_graph": "CUDA graph", "radix_cache": "radix cache", "capture_enabled": "capture"}


def switch_words(widget_id: str, value: bool) -> str:
    """``CUDA graph: on`` / ``radix cache: off`` (padded so that a flip does not move the row)."""
    return f"{SWITCH_NAMES[widget_id]}: {'on ' if value else 'off'}"


class ProfileEditorScreen(DismissOnce, Screen[str | None]):
    """Edit one profile; dismisses with the saved name (or None when nothing was saved)."""

    BINDINGS = bindings(EDITOR_KEYS)
    # Textual annotates this "ClassVar[...] | None", which mypy reads as an instance variable.
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = (  # type: ignore[misc]
        [(0, "-narrow"), (120, "-wide")]
    )
    DEFAULT_CSS = """
    ProfileEditorScreen { layout: vertical; }
    ProfileEditorScreen #editor-title { height: 1; padding: 0 1; background: $panel; text-style: bold; }
    ProfileEditorScreen #editor-body { height: 1fr; }
    ProfileEditorScreen #form { width: 1fr; padding: 0 1; }
    ProfileEditorScreen #side { width: 1fr; padding: 0 1; border-left: solid $panel-lighten-2; }
    ProfileEditorScreen.-narrow #editor-body { layout: vertical; }
    ProfileEditorScreen.-narrow #form { height: 1fr; }
    ProfileEditorScreen.-narrow #side { height: auto; max-height: 8; border-left: none;
                                        border-top: solid $panel-lighten-2; }
    ProfileEditorScreen.-wide #editor-body { layout: horizontal; }
    ProfileEditorScreen .row { height: auto; }
    ProfileEditorScreen .row Label { width: 22; padding: 0 1 0 0; }
    ProfileEditorScreen.-narrow .row Label { width: 16; }
    ProfileEditorScreen.-narrow .field-problem, ProfileEditorScreen.-narrow .note { padding-left: 16; }
    ProfileEditorScreen .row Input, ProfileEditorScreen .row Select { width: 1fr; }
    ProfileEditorScreen Switch { border: none; height: 1; padding: 0 1; }
    ProfileEditorScreen Switch:focus { background: $accent 40%; }
    ProfileEditorScreen .switches { height: auto; margin-top: 1; }
    ProfileEditorScreen .switches Label { width: auto; padding: 0 1 0 0; }
    ProfileEditorScreen .switches Switch { margin-right: 3; }
    ProfileEditorScreen.-tight .switches { layout: grid; grid-size: 2; grid-columns: 18 8; grid-rows: 1; }
    ProfileEditorScreen .field-problem { height: auto; padding-left: 22; color: $error; display: none; }
    ProfileEditorScreen .field-problem.-shown { display: block; }
    ProfileEditorScreen .field-problem.-warning { color: $warning; }
    ProfileEditorScreen .note { height: auto; padding-left: 22; color: $text-muted; }
    ProfileEditorScreen #env { height: auto; max-height: 10; }
    ProfileEditorScreen #preview-title, ProfileEditorScreen #problems-title { text-style: bold; }
    ProfileEditorScreen #preview { height: auto; color: $text; }
    ProfileEditorScreen #problems { height: auto; color: $error; }
    ProfileEditorScreen #editor-buttons { height: 1; padding: 0 1; }
    ProfileEditorScreen #editor-buttons Button { margin-right: 2; }
    """

    def __init__(self, profile_name: str, home: Home) -> None:
        super().__init__()
        self.profile_name = profile_name
        self.home = home
        self.profile: Any = None  # as loaded or last saved
        self.backends: tuple[str, ...] | None = None
        self.sglang_note = ""
        self.dirty = False
        self.last_check: EditorCheck | None = None
        self.saved_name: str | None = None
        self.load_error: str | None = None
        self._form_shown = False  # the form has its focus (or will never come): keys typed ahead may land
        self._debounce: Timer | None = None
        self._check_seq = 0

    def ready_for_keys(self) -> bool:
        """Keys typed right after ``e`` wait (app.typeahead) until the form is built and its first field
        has focus, then land there instead of on the "loading…" screen."""
        return self._form_shown or self.load_error is not None

    # -- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(f"Edit profile {self.profile_name}", id="editor-title")
        with Horizontal(id="editor-body"):
            with VerticalScroll(id="form"):
                yield Static("loading…", id="loading")
            with VerticalScroll(id="side"):
                yield Static("Command preview", id="preview-title")
                yield Static("", id="preview", markup=False)
                yield Static("", id="problems-title")
                yield Static("", id="problems", markup=False)
        with Horizontal(id="editor-buttons"):
            yield Button("Save (ctrl+s)", id="save", variant="primary", compact=True)
            yield Button("Save as (F2)", id="save-as", compact=True)
            yield Button("Close (Esc)", id="close", compact=True)
        yield Footer()

    def on_resize(self) -> None:
        # Under 80 columns the three switches do not fit one row: one per row, with their words.
        self.set_class(self.size.width < 80, "-tight")

    def on_mount(self) -> None:
        self.run_worker(self._load, name="editor-load", group="editor-load", thread=True, exit_on_error=False)

    def _load(self) -> tuple[Any, tuple[str, ...] | None, str]:
        from sessions.profiles import load_profile

        profile = load_profile(self.profile_name, self.home)
        backends, note = _attention_backends(profile)
        return profile, backends, note

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.name == "editor-load":
            if event.state == WorkerState.SUCCESS:
                assert worker.result is not None  # _load returns (profile, backends, note)
                self.profile, self.backends, self.sglang_note = worker.result
                self._build_form()
            elif event.state == WorkerState.ERROR:
                self._show_load_error(worker.error)
        elif worker.name == "editor-validate" and event.state == WorkerState.SUCCESS:
            assert isinstance(worker.result, EditorCheck)  # what _check returns
            self._show_check(worker.result)

    def _show_load_error(self, error: BaseException | None) -> None:
        problems = getattr(error, "problems", None)
        if problems:
            text = "\n".join(
                f"{p.field}{f' (line {p.line})' if getattr(p, 'line', None) else ''}: {p.message}"
                for p in problems
            )
        else:
            text = str(error)
        self.load_error = text
        self.query_one("#loading", Static).update(
            f"Cannot edit {self.profile_name}: the file does not load.\n{text}\n\nFix it in a text editor "
            f"({self.home.profiles_dir / (self.profile_name + '.toml')}) and come back."
        )

    def _build_form(self) -> None:
        profile = self.profile
        server = profile.server
        form = self.query_one("#form", VerticalScroll)
        self.query_one("#loading").remove()
        widgets: list[Any] = []
        python = server.python or "(this interpreter)"
        widgets.append(Static(f"launcher {server.launcher} · python {python}", classes="note"))
        widgets += self._input("model path", "model_path", server.model_path)
        widgets += self._input("TP size", "tp_size", server.tp_size, kind="integer")
        widgets += self._input("host", "host", server.host)
        widgets += self._input("port", "port", server.port, kind="integer")
        backend = server.attention_backend or ""
        if self.backends:
            options = [(b, b) for b in self.backends]
            if backend and backend not in self.backends:
                options.insert(0, (f"{backend} (not in this SGLang)", backend))
            select = PageSafeSelect(
                options,
                prompt="auto (SGLang decides)",
                id="attention_backend",
                value=backend if backend else Select.NULL,
                compact=True,
            )
            widgets += self._row("attention backend", select)
        else:
            widgets += self._input("attention backend", "attention_backend", backend, placeholder="auto")
        if self.sglang_note:
            widgets.append(Static(self.sglang_note, classes="note"))
        widgets += self._input(
            "mem fraction",
            "mem_fraction_static",
            server.mem_fraction_static,
            kind="number",
            placeholder="auto",
        )
        widgets += self._input(
            "chunked prefill",
            "chunked_prefill_size",
            server.chunked_prefill_size,
            kind="integer",
            placeholder="auto (-1 turns chunking off)",
        )
        switches = (("cuda_graph", server.cuda_graph), ("radix_cache", server.radix_cache),
                    ("capture_enabled", profile.capture.enabled))
        row: list[Any] = []
        for widget_id, value in switches:
            row += [Label(switch_words(widget_id, bool(value)), id=f"label-{widget_id}"),
                    Switch(bool(value), id=widget_id)]
        widgets.append(Horizontal(*row, classes="switches"))
        for widget_id in ("cuda_graph", "radix_cache", "capture_enabled"):
            widgets.append(Static("", id=f"problem-{widget_id}", classes="field-problem"))
        widgets += self._input(
            "extra args", "extra_args", shlex.join(server.extra_args), placeholder="--trust-remote-code"
        )
        widgets.append(
            Label("environment [server.env]  (a add · Enter edit · Delete remove)", classes="note")
        )
        widgets.append(EnvTable(dict(server.env), id="env"))
        widgets.append(Static("", id="problem-env", classes="field-problem"))
        if server.launcher == "emulator":
            widgets += self._input(
                "emulator time scale", "time_scale", profile.emulator.time_scale, kind="number"
            )
            widgets += self._input("emulator fault", "fault", profile.emulator.fault or "none")
        form.mount_all(widgets)
        self.call_after_refresh(self._form_ready)

    def _input(
        self, label: str, widget_id: str, value: Any, kind: _InputKind = "text", placeholder: str = ""
    ) -> list[Any]:
        field = InOrderInput(_text(value), id=widget_id, type=kind, placeholder=placeholder, compact=True)
        return self._row(label, field)

    def _form_ready(self) -> None:
        fields = self.query("#model_path")
        if not fields:
            return  # the editor was closed before its form was drawn
        self.set_focus(fields.first(Input))  # now, not later: keys held for this field go out next
        self._form_shown = True
        self._validate_now()

    def _row(self, label: str, widget: Any) -> list[Any]:
        return [
            Horizontal(Label(label), widget, classes="row"),
            Static("", id=f"problem-{widget.id}", classes="field-problem"),
        ]

    # -- reading the form -----------------------------------------------------------------------------------

    def _read_form(self) -> tuple[Any, dict[str, str]] | None:
        """`form_profile()`, or None while the form is not (or no longer) on screen: keys and timers can
        arrive before the loaded form is mounted and after the editor was closed."""
        if self.profile is None or not self.is_attached or not self.query("#env"):
            return None
        try:
            return self.form_profile()
        except NoMatches:
            return None

    def form_profile(self) -> tuple[Any, dict[str, str]]:
        """The profile the form describes, and the fields that do not parse (widget id -> message)."""
        errors: dict[str, str] = {}
        server = self.profile.server

        def value(widget_id: str) -> str:
            return self.query_one(f"#{widget_id}", Input).value.strip()

        def parsed(widget_id: str, cast: Any, what: str, optional: bool) -> Any:
            text = value(widget_id)
            if not text and optional:
                return None
            try:
                return cast(text)
            except ValueError:
                errors[widget_id] = f"{FIELD_OF_WIDGET[widget_id]}: {text!r} is not {what}"
                return None

        def integer(widget_id: str, optional: bool = False) -> int | None:
            return parsed(widget_id, int, "a whole number", optional)

        def number(widget_id: str, optional: bool = False) -> float | None:
            return parsed(widget_id, float, "a number", optional)

        backend_widget = self.query_one("#attention_backend")
        if isinstance(backend_widget, Select):
            backend = None if backend_widget.value is Select.NULL else str(backend_widget.value)
        else:  # free text when SGLang's choices are unknown (_build_form)
            backend = self.query_one("#attention_backend", Input).value.strip() or None
        try:
            extra_args = tuple(shlex.split(value("extra_args")))
        except ValueError as exc:
            errors["extra_args"] = f"server.extra_args: {exc} (check the quotes)"
            extra_args = tuple(server.extra_args)
        tp_size = integer("tp_size")
        port = integer("port")
        new_server = dataclasses.replace(
            server,
            model_path=value("model_path"),
            tp_size=tp_size if tp_size is not None else server.tp_size,
            host=value("host") or "127.0.0.1",
            port=port if port is not None else server.port,
            attention_backend=backend,
            mem_fraction_static=number("mem_fraction_static", optional=True),
            chunked_prefill_size=integer("chunked_prefill_size", optional=True),
            cuda_graph=self.query_one("#cuda_graph", Switch).value,
            radix_cache=self.query_one("#radix_cache", Switch).value,
            extra_args=extra_args,
            env=dict(self.query_one(EnvTable).env),
        )
        changes: dict[str, Any] = {"server": new_server}
        capture = getattr(self.profile, "capture", None)
        if capture is not None:
            changes["capture"] = dataclasses.replace(
                capture, enabled=self.query_one("#capture_enabled", Switch).value
            )
        if self.profile.server.launcher == "emulator":
            emulator = self.profile.emulator
            scale = number("time_scale")
            changes["emulator"] = dataclasses.replace(
                emulator,
                time_scale=scale if scale is not None else emulator.time_scale,
                fault=value("fault") or "none",
            )
        return self.profile.with_changes(**changes), errors

    # -- live validation ----------------------------------------------------------------------------------

    @on(Switch.Changed)
    def _switch_changed(self, event: Switch.Changed) -> None:
        """The switch's label says its state in words (a glyph alone is not read the same by everyone)."""
        widget_id = event.switch.id or ""
        if widget_id in SWITCH_NAMES:
            self.query_one(f"#label-{widget_id}", Label).update(switch_words(widget_id, event.value))

    @on(Input.Changed)
    @on(Switch.Changed)
    @on(Select.Changed)
    @on(EnvTable.Changed)
    def _changed(self) -> None:
        if (read := self._read_form()) is None:
            return  # the form is still being built, or already gone
        form_profile, errors = read
        self.dirty = bool(errors) or form_profile != self.profile
        state = " · modified" if self.dirty else ""
        self.query_one("#editor-title", Static).update(f"Edit profile {self.profile_name}{state}")
        if self._debounce is not None:
            self._debounce.stop()
        self._debounce = self.set_timer(VALIDATE_DEBOUNCE_S, self._validate_now)

    def _validate_now(self) -> None:
        self._debounce = None
        if (read := self._read_form()) is None:
            return
        profile, errors = read
        self._check_seq += 1
        self.run_worker(
            partial(_check, profile, errors, self.home, self._check_seq),
            name="editor-validate",
            group="editor-validate",
            thread=True,
            exclusive=True,
            exit_on_error=False,
        )

    def _show_check(self, check: EditorCheck) -> None:
        if check.seq != self._check_seq:  # an older form state finished late
            return
        self.last_check = check
        for widget_id in FIELD_OF_WIDGET:
            matches = self.query(f"#problem-{widget_id}")
            if not matches:  # emulator-only rows are absent for sglang profiles
                continue
            problem = matches.first(Static)
            found = check.by_widget.get(widget_id, [])
            problem.update("\n".join(f"{'⚠' if sev == 'warning' else '✖'} {msg}" for sev, msg in found))
            problem.set_class(bool(found) and all(sev == "warning" for sev, _ in found), "-warning")
            problem.set_class(bool(found), "-shown")
        self.query_one("#preview", Static).update(check.preview)
        self.query_one("#problems-title", Static).update("Other problems" if check.general else "")
        self.query_one("#problems", Static).update("\n".join(check.general))
        self.post_message(ProfileChecked(check))

    # -- saving and leaving -------------------------------------------------------------------------------

    def _savable(self) -> Any:
        """The form's profile, or None (and a notification naming the fields) when it does not parse."""
        if (read := self._read_form()) is None:
            self.notify("The form is still loading: nothing saved yet.", title="not saved", severity="warning")
            return None
        profile, errors = read
        if errors:
            self.notify("\n".join(errors.values()), title="not saved", severity="error")
            return None
        from sessions.profiles import validate_profile

        # Checked now, on exactly what is in the form (the live check may be a keystroke behind).
        refused = [p for p in validate_profile(profile, check_port=False) if p.is_error]
        if refused:
            lines = [f"{p.field}: {p.message}" for p in refused]
            self.notify("The profile does not validate:\n" + "\n".join(lines), title="not saved",
                        severity="error", timeout=15)
            return None
        return profile

    def action_save(self) -> None:
        if (profile := self._savable()) is not None:
            self._save(profile, Path(self.profile.path), self.profile_name)

    def action_save_as(self) -> None:
        if (profile := self._savable()) is None:
            return

        def named(name: str | None) -> None:
            if not name:
                return
            path = self.home.profiles_dir / f"{name}.toml"
            new_profile = profile.with_changes(name=name, path=path)
            if path.exists() and name != self.profile_name:
                self.app.push_screen(
                    ConfirmModal(f"Profile {name} exists. Overwrite it?", str(path)),
                    lambda yes: self._save(new_profile, path, name) if yes else None,
                )
            else:
                self._save(new_profile, path, name)

        self.app.push_screen(NameModal(f"{self.profile_name}-copy", self.home.profiles_dir), named)

    def _save(self, profile: Any, path: Path, name: str) -> None:
        from sessions.profiles import save_profile

        try:
            save_profile(profile, path)
        except Exception as exc:  # noqa: BLE001 - ProfileError / OSError: say which file and why
            self.notify(f"{path}: {exc}", title="not saved", severity="error", timeout=10)
            return
        self.profile = profile
        self.profile_name = name
        self.saved_name = name
        self.dirty = False
        self.query_one("#editor-title", Static).update(f"Edit profile {name} · saved")
        problems = (
            len(self.last_check.general) + sum(len(v) for v in self.last_check.by_widget.values())
            if self.last_check
            else 0
        )
        note = f" ({problems} problem{'s' if problems != 1 else ''} to fix before launch)" if problems else ""
        self.notify(f"Saved {path}{note}", title="saved", severity="warning" if problems else "information")
        self.post_message(ProfileSaved(name, str(path)))

    def action_close(self) -> None:
        if not self.dirty:
            self.dismiss(self.saved_name)
            return
        def answered(yes: bool | None) -> None:
            if yes:
                self.dismiss(self.saved_name)

        self.app.push_screen(ConfirmModal(f"Discard the unsaved changes to profile {self.profile_name}?",
                                             yes_label="Discard (y)"), answered)

    def action_add_env(self) -> None:
        tables = self.query(EnvTable)
        if tables:  # not while the form is still loading
            tables.first().action_add_row()

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#save-as")
    def _save_as_pressed(self) -> None:
        self.action_save_as()

    @on(Button.Pressed, "#close")
    def _close_pressed(self) -> None:
        self.action_close()


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _attention_backends(profile: Any) -> tuple[tuple[str, ...] | None, str]:
    """The installed SGLang's attention backends for this profile's Python, or None and why not."""
    if profile.server.launcher == "emulator":
        note = "the emulator accepts SGLang's flags; "
    else:
        note = ""
    try:
        from sessions.sglang_source import locate_sglang

        location = locate_sglang(profile.server.python or None)
    except Exception as exc:  # noqa: BLE001 - no SGLang source reader: free text
        return None, f"{note}SGLang's choices unknown ({exc}); any value is accepted here"
    if location.source is None:
        return None, f"{note}no SGLang for this Python: free text, checked by SGLang at launch"
    backends = location.source.attention_backends()
    if not backends:
        return (
            None,
            f"{note}SGLang {location.source.version or ''} at {location.source.root}: choices unreadable",
        )
    return tuple(backends), f"choices of SGLang {location.source.version or '?'} at {location.source.root}"


def _check(profile: Any, parse_errors: dict[str, str], home: Home | None = None, seq: int = 0) -> EditorCheck:
    """Validate and preview one form state (runs in a thread worker)."""
    from sessions.profiles import build_command, validate_profile

    by_widget: dict[str, list[tuple[str, str]]] = {}
    general: list[str] = []
    for parsed_id, message in parse_errors.items():
        by_widget.setdefault(parsed_id, []).append(("error", message))
    try:
        problems = validate_profile(profile, check_port=False) + _port_problems(profile, home)
    except Exception as exc:  # noqa: BLE001
        problems = []
        general.append(f"validation failed: {exc}")
    for problem in problems:
        field = str(problem.field)
        widget_id = WIDGET_OF_FIELD.get(field) or next(
            (w for f, w in WIDGET_OF_FIELD.items() if field.startswith((f + ".", f + "["))), None
        )
        severity = getattr(problem, "severity", "error")
        if widget_id is None:
            general.append(f"{'⚠' if severity == 'warning' else '✖'} {field}: {problem.message}")
        elif widget_id not in parse_errors:
            by_widget.setdefault(widget_id, []).append((severity, problem.message))
    try:
        preview = build_command(profile).shell_text(redacted=True)
    except Exception as exc:  # noqa: BLE001 - an invalid form may not build a command
        preview = f"(no command: {exc})"
    return EditorCheck(by_widget, general, preview, profile, seq)


def _port_problems(profile: Any, home: Home | None) -> list[Any]:
    """The port check, knowing our own sessions (`sessions.server.port_check`, shared with the CLI)."""
    from sessions.server.port_check import port_problems

    return port_problems(profile, home, restart_hint="restart (r)")
