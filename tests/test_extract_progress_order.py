"""progress.json is written off the event loop by the report loop: a write of an older snapshot that runs
late (its worker thread scheduled after the run's final write) must never land over the newer one."""
from __future__ import annotations

import json
from pathlib import Path

from sessions.extraction.progress import PROGRESS_FILE
from sessions.extraction.run_report import RunReport


class Report(RunReport):
    """A report whose snapshot is only its state (the rest of a run is not needed here)."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.state = "running"

    def snapshot(self) -> dict:
        return {"state": self.state}


def test_a_late_write_of_an_older_snapshot_does_not_undo_the_final_state(tmp_path: Path) -> None:
    report = Report(tmp_path)
    taken_by_the_report_loop = report._numbered_snapshot()  # handed to a worker thread that runs late
    report.state = "done"
    report.write_progress()  # the run's end, on the loop
    report._write_snapshot(*taken_by_the_report_loop)  # the late worker
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["state"] == "done"
    report.state = "failed"
    report.write_progress()  # a newer snapshot is still written
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["state"] == "failed"
