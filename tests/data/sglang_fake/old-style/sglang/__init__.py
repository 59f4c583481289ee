# ruff: noqa
# A stand-in for an older SGLang package (one ServerArgs dataclass, flags registered with add_argument).
# Importing it is a test failure: eagle3-tui must read SGLang statically, never import it.
raise RuntimeError("sglang was imported; eagle3-tui must only read it")
