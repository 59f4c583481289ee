"""The first `eagle3-tui --demo` on a fresh home: how long the terminal stays blank, and until the TUI's
first frame.

Each round starts the real TUI on a pseudo-terminal with an EAGLE3_TUI_HOME that does not exist, and
times (from exec) the first byte the terminal shows and the switch to the alternate screen (the TUI's
first frame); then it stops the TUI.  ``--code DIR`` runs another checkout's code (PYTHONPATH), to
compare before and after.  Prints numbers only; no assertion (DESIGN §8).

    python benches/bench_demo_first_start.py --rounds 3
    python benches/bench_demo_first_start.py --rounds 3 --code /tmp/old-checkout
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tui import TuiInPty

ALT_SCREEN = b"\x1b[?1049h"


def one_round(code: Path, timeout_s: float = 300.0) -> tuple[float, float, str]:
    """(seconds to the first byte, seconds to the first frame, the text shown before the frame)."""
    home = Path(tempfile.mkdtemp(prefix="demo-first-start-"))
    env = dict(os.environ, EAGLE3_TUI_HOME=str(home / "never-opened"), PYTHONPATH=str(code),
               TERM="xterm-256color")
    env.pop("EAGLE3_TUI_DEMO", None)
    tui = TuiInPty(env, 120, 40, argv=[sys.executable, "-m", "app", "--demo"], cwd=code)
    try:
        started = tui.start(watch=(ALT_SCREEN,))
        frame_at = tui.wait_marker(ALT_SCREEN, timeout_s)
        seen = bytes(tui.output)
        if frame_at is None:
            raise SystemExit(f"no first frame within {timeout_s:.0f} s (or the TUI ended first): {seen[-2000:]!r}")
    finally:
        tui.quit()
        shutil.rmtree(home, ignore_errors=True)
    assert tui.first_output_at is not None  # the frame is output
    shown = seen.split(ALT_SCREEN)[0].decode(errors="replace").strip()
    return tui.first_output_at - started, frame_at - started, shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose code runs (default: this one)")
    args = parser.parse_args()
    blank, frames = [], []
    for n in range(args.rounds):
        first_byte, frame, shown = one_round(args.code.resolve())
        blank.append(first_byte)
        frames.append(frame)
        print(f"round {n + 1}: first byte on the terminal after {first_byte:.2f} s, first frame after "
              f"{frame:.2f} s; shown before it: {shown!r}")
    print(f"blank terminal: median {statistics.median(blank):.2f} s (min {min(blank):.2f}, max {max(blank):.2f}); "
          f"first frame: median {statistics.median(frames):.2f} s (min {min(frames):.2f}, max {max(frames):.2f}); "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
