"""The headless engine of eagle3-tui: profiles, server sessions, logs, GPUs, diagnosis, capture, extraction.

Nothing in this package imports Textual; the TUI and the CLI both drive it.
"""
