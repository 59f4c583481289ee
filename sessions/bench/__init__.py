"""The one-key serving bench (``eagle3-tui bench``): SGLang ``bench_serving``'s client and figures.

Modules: `prompts` (seeded random-id prompts, as bench_serving's ``random-ids``, or a dataset's real text),
`bounded` (capped reads and checked counts: nothing a server answers is trusted), `client` (one streaming
``/generate`` request, parsed as bench_serving parses it), `metrics` (``calculate_metrics``'s definitions
and key names), `runner` (warm-up, then each concurrency), `session_bench` (a ready session's bench, its
size limits), `compare` and `ab_report` (`bench compare A B --rounds N` and its report with spread),
`store` (results kept in the state dir under unique names, and the history across profiles).  Imports
httpx only when a bench runs.
"""
