"""Never dies: seeded random keys, in bursts, over every screen and size; nothing may raise out of the app.

The app runs on a home with two emulator profiles, a live emulator session (so stop, diagnose, the log and
its filter have something to act on) and a job spec.  Launching more servers, restarting and starting jobs
are refused here (a LaunchError / JobError from the engine, which the app must show like any refusal):
a fuzz run must not spawn processes it cannot account for.  Every few bursts the run opens one screen on
purpose (help, editor, diagnose, jobs, palette, the modals), and the terminal changes size between
60x20, 80x24 and 200x50.  A failure prints the seed and the last keys, so it can be replayed.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from app.tui import Eagle3App
from sessions.gpus import EmulatedSource
from tests._tui_support import burst, first_poll, wait_until

SIZES = ((60, 20), (80, 24), (200, 50))
NAVIGATION = ("up", "down", "left", "right", "pageup", "pagedown", "home", "end", "tab", "shift+tab",
              "enter", "escape", "space", "backspace", "delete", "ctrl+a", "ctrl+e", "ctrl+k", "ctrl+u")
APP_KEYS = ("ctrl+p", "question_mark", "1", "2", "3", "4", "slash", "f", "w", "t", "d", "c", "x", "e",
            "n", "p", "r", "s", "y", "l", "ctrl+s", "f2", "ctrl+n", "ctrl+c")
TEXT = tuple("abz09.-_/:~ ")
# How to reach each screen from anywhere (escape leaves modals, editors and other screens first)
OPENERS = {
    "help": ("question_mark",),
    "editor": ("1", "e"),
    "editor-discard": ("1", "e", "wait", "end", "9", "escape"),
    "save-as": ("1", "e", "wait", "f2"),
    "diagnose": ("2", "d"),
    "jobs": ("x",),
    "job-form": ("x", "n"),
    "palette": ("ctrl+p", "l", "a"),
    "stop-question": ("2", "s"),
    "capture-question": ("1", "c"),
    "filter": ("slash", "r", "a"),
}
SEEDS = (1, 2)
BURSTS_PER_SEED = 60
KEYS_PER_BURST = (10, 40)


def _refuse(*_args, **_kwargs):
    from sessions.server import LaunchError

    raise LaunchError("the fuzz test starts no servers")


def _refuse_job(*_args, **_kwargs):
    from sessions.extraction.job import JobError

    raise JobError("the fuzz test starts no jobs")


@pytest.fixture
def fuzz_home(home, make_emulator_profile, launched, monkeypatch):
    profile = make_emulator_profile("emu-a-with-a-rather-long-profile-name", tp=2)
    make_emulator_profile("emu-b", tp=1)
    launched.launch(profile)
    (home.config_root / "jobs").mkdir(parents=True, exist_ok=True)
    (home.config_root / "jobs" / "fuzz.toml").write_text("[job]\nname = 'fuzz'\n")
    from sessions.extraction import job as jobs
    from sessions.server import ServerSession

    monkeypatch.setattr(ServerSession, "launch", classmethod(_refuse))
    monkeypatch.setattr(ServerSession, "restart", _refuse)
    monkeypatch.setattr(jobs, "run_job", _refuse_job)
    return home


Step = tuple[int, tuple[int, int] | None, list[str], str | None]


def _steps() -> list[Step]:
    """The whole run, fixed by the seeds: (seed, a size to change to first or None, the keys of one burst,
    the screen it opens on purpose or None)."""
    steps: list[Step] = []
    for seed in SEEDS:
        rng = random.Random(seed)
        pool = NAVIGATION * 2 + APP_KEYS + TEXT
        for number in range(BURSTS_PER_SEED):
            if number % 6 == 0:
                name = list(OPENERS)[(number // 6 + seed) % len(OPENERS)]
                keys = ["escape"] * 4 + list(OPENERS[name])
            else:
                name = None
                keys = [rng.choice(pool) for _ in range(rng.randint(*KEYS_PER_BURST))]
            size = rng.choice(SIZES) if number % 10 == 5 else None
            for index, part in enumerate(" ".join(keys).split("wait")):
                if part.split():
                    steps.append((seed, size if index == 0 else None, part.split(), name))
    return steps


@pytest.mark.slow  # minutes of key bursts: start it first (tests/conftest.py orders slow modules first)
def test_random_key_bursts_over_every_screen_and_size_never_raise(fuzz_home):
    """The palette's first command is Quit (ctrl+p, then Enter on its first hit), so random keys may quit: a
    quit is no failure when it is one, a palette command run with no crash; the run then goes on where it was
    in a new app on the same home, which finds the session again as a user who starts the TUI again does."""
    from textual.command import CommandPalette

    sent: list[str] = []
    opened: set[str] = set()
    steps = _steps()
    done = 0
    seed = SEEDS[0]

    async def one_app() -> None:
        nonlocal done, seed
        commands_run: list[object] = []

        def hook(message: object) -> None:
            if isinstance(message, CommandPalette.Closed) and message.option_selected:
                commands_run.append(message)

        app = Eagle3App(fuzz_home, gpu_source=EmulatedSource(fuzz_home), refresh_s=0.2)
        async with app.run_test(size=SIZES[1], message_hook=hook) as pilot:
            await first_poll(pilot, app)
            await wait_until(pilot, lambda: app.dashboard.last_snapshot.status is not None, "the session")
            while done < len(steps):
                seed, size, keys, name = steps[done]
                if name is not None:
                    opened.add(name)
                if size is not None:
                    await pilot.resize_terminal(*size)
                sent.extend(keys)
                await burst(pilot, *keys)
                done += 1
                if not app.is_running:
                    break
            if app.is_running:
                await pilot.pause()
        assert app.crash_file is None, f"crash file {app.crash_file} (seed {seed}, last keys {sent[-40:]})"
        if done < len(steps):  # it quit: only a palette command may have done that, with no error
            assert commands_run and app.return_code == 0, (
                f"the app stopped (return code {app.return_code}; seed {seed}, last keys {sent[-40:]})")

    async def scenario() -> None:
        while done < len(steps):
            await one_app()

    try:
        asyncio.run(scenario())
    except Exception as exc:
        raise AssertionError(f"seed {seed}: {exc!r}; last keys {sent[-40:]}") from exc
    assert opened == set(OPENERS)
    assert len(sent) > 2000
