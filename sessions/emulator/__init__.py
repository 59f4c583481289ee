"""The SGLang 0.5.23 stand-in for demo mode and tests (DESIGN §7): ``python -m sessions.emulator``.

It accepts the ``sglang.launch_server`` flags that profiles produce, prints SGLang's own startup lines
(stderr; uvicorn's access log on stdout), spawns one ``sglang::scheduler_TP<n>`` child per TP rank plus
``sglang::detokenizer``, binds the HTTP port only after every rank is loaded, serves SGLang's endpoints,
and can be told to fail the ways SGLang fails (``--emulate-fault``).

Modules: `args` (flags, resolved server args, titles), `model_config` (config.json, both shapes),
`pacing` (how long each step takes), `console` (log lines and tqdm bars), `faults`, `ranks` (scheduler
and detokenizer processes), `scheduler_client` (main-process side of the rank pipes),
`tokenizer_manager` (serving state), `http` (the endpoints), `backend` (FixedBackend),
`gpu_memory` (emulated and real GPU memory), `startup` (the main process).  ``model_backend`` (the
model-backed forward) belongs to the capture work and is loaded only when a model dir has weights.
Importing this package is cheap: no torch, no HTTP server, no subprocess.
"""
