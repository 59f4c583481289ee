"""Extraction jobs: a JSONL dataset → the SGLang server → SpecForge-format EAGLE-3 training data.

One module per noun: ``spec`` (the job TOML), ``datasets`` (JSONL readers), ``rendering`` (chat template +
loss mask), ``client`` (async ``/generate``), ``backpressure`` (the capture filesystem's fill gate),
``collector`` (capture dumps → one checked sample), ``output`` (the SpecForge output dir: files, manifest,
errors, ``dataset.json``), ``runner`` (the pipeline inside the detached job process), ``job`` (job state on
disk, spawn/resume/cancel/pause), ``progress`` (the ``JobProgress`` snapshot the TUI reads) and
``verify``.  Importing this package, ``job`` or ``progress`` never imports torch or transformers: the TUI
loads them.
"""
