"""The one-key serving bench (``eagle3-tui bench``): SGLang ``bench_serving``'s client and figures.

Modules: `prompts` (seeded random-id prompts, as bench_serving's ``random-ids``), `client` (one streaming
``/generate`` request, parsed as bench_serving parses it), `metrics` (``calculate_metrics``'s definitions
and key names), `runner` (warm-up, then each concurrency), `store` (results kept in the state dir, and the
history across profiles).  Imports httpx only when a bench runs.
"""
