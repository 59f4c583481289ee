"""Startup phases of an SGLang server (DESIGN §3, contract) and the StartupTracker that reads them from a log.

* `sessions.phases.model`: `StartupPhase` and what a summary holds (`StartupSummary`, `PhaseEvent`,
  `PhaseProgress`, `LogError`);
* `sessions.phases.catalogue`: the line catalogue (SGLang's markers, bars and error lines, 0.4.x to 0.5.23);
* `sessions.phases.topology`: the server's layout from ``server_args``, and a rank tag's global rank in it;
* `sessions.phases.tracker`: `StartupTracker`, the state machine (lines in, events and a summary out);
* `sessions.phases.summarize`: a whole static log (text, bytes or a file) to its summary.

The names below are the package's public ones; ``from sessions.phases import ...`` is the way in.
"""

from sessions.logs.lines import collapse_cr, strip_ansi
from sessions.phases.model import (
    ARRIVAL_MARKERS,
    HARD_FATAL_KINDS,
    SOFT_ERROR_KINDS,
    LogError,
    PhaseEvent,
    PhaseProgress,
    StartupPhase,
    StartupSummary,
    error_headline,
)
from sessions.phases.summarize import summarize_bytes, summarize_file, summarize_text
from sessions.phases.tracker import MAX_ERRORS, StartupTracker

__all__ = [
    "ARRIVAL_MARKERS",
    "HARD_FATAL_KINDS",
    "MAX_ERRORS",
    "SOFT_ERROR_KINDS",
    "LogError",
    "PhaseEvent",
    "PhaseProgress",
    "StartupPhase",
    "StartupSummary",
    "StartupTracker",
    "collapse_cr",
    "error_headline",
    "strip_ansi",
    "summarize_bytes",
    "summarize_file",
    "summarize_text",
]
