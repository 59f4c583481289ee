"""``python -m sessions.emulator <sglang.launch_server flags> [--time-scale X] [--emulate-fault ID] ...``."""

import sys

from sessions.emulator.dp import engine_for
from sessions.emulator.startup import main

# Spawned ranks do not re-run a package's __main__ (multiprocessing skips "*.__main__"), but guard anyway.
if __name__ == "__main__":
    sys.exit(main(engine_for=engine_for))
