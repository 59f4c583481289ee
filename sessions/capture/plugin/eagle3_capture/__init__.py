"""eagle3_capture: the SGLang plugin that dumps EAGLE-3 aux hidden states (DESIGN §5).

This package is self-contained (standard library, torch and SGLang only): the launcher copies it into a
generated ``PYTHONPATH`` folder next to a bare ``eagle3_capture-<ver>.dist-info`` whose
``entry_points.txt`` names `register` in the ``sglang.srt.plugins`` group.  It acts only when
``EAGLE3_CAPTURE`` is set.  Importing it imports neither torch nor SGLang.
"""
from __future__ import annotations

from .hook import register
from .spec import ENV_NAME, CaptureSpec, capture_active_line

__version__ = "0.1.0"
DIST_NAME = "eagle3_capture"
ENTRY_POINT_GROUP = "sglang.srt.plugins"

__all__ = ["ENV_NAME", "CaptureSpec", "__version__", "capture_active_line", "register"]
