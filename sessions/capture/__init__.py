"""Hidden-state capture (DESIGN §5): the SGLang plugin, its dump writer, the profile toggle, the check.

* ``plugin/eagle3_capture/`` — the self-contained package that runs inside SGLang (the source of truth
  for the writer and the capture spec);
* `layers` — physical capture points ↔ ``--return-aux-hidden-state-layer-ids`` per model family;
* `inject` — the generated PYTHONPATH folder (plugin + bare dist-info with the entry point);
* `toggle` — the toggle and the status snapshot (what ``[capture]`` adds to a launch and its validation:
  `sessions.profiles.capture_launch`);
* `compat` — ``eagle3-tui capture check``: every SGLang symbol the plugin relies on, verified with ast;
* `writer` — the plugin's writer, importable from here (torch is imported only when tensors are handled).

Importing this package (or `layers`, `inject`, `toggle`, `compat`) imports neither torch nor SGLang.
"""
