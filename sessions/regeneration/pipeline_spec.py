"""A pipeline spec: one TOML with a ``[regenerate]`` table, then an ``[extract]`` table (issue 25 item 5).

    [regenerate]            # the keys of a regeneration spec's [job] (sessions.regeneration.spec), no mode
    name = "regen"
    dataset = "chats.jsonl"
    output = "regen/chats.jsonl"
    sessions = ["tiny-llama-..."]

    [extract]               # the keys of an extraction spec's [job] (sessions.extraction.spec), no dataset
    name = "extract"
    session = "tiny-llama-..."
    output_dir = "out"

Each table is checked by its own stage's loader, so the rules stay in one place; a problem is reported
under the stage's table name (``extract.concurency (line 12): unknown key``) with its line in this file.
The extraction reads the regeneration's ``<out>.jsonl``, with the sample ids following its row ids
(``sample_ids = "row"``), so ``extract.dataset`` is refused and ``extract.sample_ids`` may only be ``"row"``.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sessions.extraction.spec import JobSpec, JobSpecError, SpecProblem, parse_job_spec
from sessions.regeneration.spec import MODE as REGENERATE_MODE
from sessions.regeneration.spec import RegenSpec, parse_regen_spec

STAGES = ("regenerate", "extract")


@dataclass(frozen=True)
class PipelineSpec:
    """A checked pipeline: the regeneration stage, then the extraction of its output."""

    regenerate: RegenSpec
    extract: JobSpec
    source_path: Path | None = None

    @property
    def name(self) -> str:
        return self.regenerate.name


def is_pipeline_spec(text: str) -> bool:
    """Whether a spec holds stage tables (``[regenerate]`` or ``[extract]``) rather than one ``[job]``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    return "job" not in data and any(isinstance(data.get(stage), dict) for stage in STAGES)


def is_pipeline_spec_file(path: Path | str) -> bool:
    """Whether the spec file at ``path`` is a pipeline spec (False when it cannot be read: the loader that
    runs next names the problem)."""
    from sessions.safe_files import JOB_SPEC, read_text

    try:
        return is_pipeline_spec(read_text(Path(path).expanduser(), JOB_SPEC))
    except (OSError, UnicodeDecodeError):
        return False


def _table_lines(text: str) -> dict[str, int]:
    """``table.key`` (and ``table``) -> its first line: tomllib keeps no positions."""
    lines: dict[str, int] = {}
    table = ""
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        header = re.match(r"^\[\s*([^\[\]]+?)\s*\]", line)
        if header:
            table = header.group(1).replace('"', "").replace(" ", "")
            lines.setdefault(table, no)
            continue
        key = re.match(r'^("?)([A-Za-z0-9_.-]+)\1\s*=', line)
        if key:
            lines.setdefault(f"{table}.{key.group(2)}" if table else key.group(2), no)
    return lines


def _as_stage(problem: SpecProblem, stage: str, lines: dict[str, int]) -> SpecProblem:
    """A stage loader's ``job.KEY`` problem as ``STAGE.KEY`` at its line in the pipeline file."""
    name = problem.field
    if name == "job" or name.startswith("job."):
        name = stage + name[len("job"):]
    return SpecProblem(name, problem.message, lines.get(name) or lines.get(stage))


def _stage_problems(parse: Any, table: dict[str, Any], stage: str, lines: dict[str, int], source: str,
                    base_dir: Path | None) -> tuple[Any, list[SpecProblem]]:
    """Run a stage's own loader on ``{"job": table}``; (its spec or None, its problems as this file's)."""
    import tomli_w

    try:
        return parse(tomli_w.dumps({"job": table}), source=source, base_dir=base_dir), []
    except JobSpecError as exc:
        return None, [_as_stage(p, stage, lines) for p in exc.problems]


def parse_pipeline_spec(text: str, source: str = "<pipeline spec>", base_dir: Path | None = None) -> PipelineSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"at line (\d+)", str(exc))
        raise JobSpecError(source, [SpecProblem("toml", str(exc), int(at.group(1)) if at else None)]) from None
    lines = _table_lines(text)
    problems = [SpecProblem(top, "unknown table or key; a pipeline spec has [regenerate], then [extract]",
                            lines.get(top)) for top in data if top not in STAGES]
    tables: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        table = data.get(stage)
        if not isinstance(table, dict):
            problems.append(SpecProblem(stage, f"missing [{stage}] table", lines.get(stage)))
        else:
            tables[stage] = dict(table)
    if len(tables) == 2 and lines.get("extract", 0) < lines.get("regenerate", 0):
        problems.append(SpecProblem("extract", "put [extract] after [regenerate]: the stages run in the "
                                    "order they are written", lines.get("extract")))
    regen: RegenSpec | None = None
    if "regenerate" in tables:
        table = tables["regenerate"]
        if "mode" in table:
            problems.append(SpecProblem("regenerate.mode", "leave it out: the [regenerate] table is the "
                                        "regeneration stage", lines.get("regenerate.mode")))
            table.pop("mode")
        regen, found = _stage_problems(parse_regen_spec, {"mode": REGENERATE_MODE, **table}, "regenerate", lines,
                                       source, base_dir)
        problems += found
    extract: JobSpec | None = None
    if "extract" in tables:
        table = tables["extract"]
        if "dataset" in table:
            problems.append(SpecProblem("extract.dataset", "leave it out: the extraction reads the "
                                        "[regenerate] stage's output", lines.get("extract.dataset")))
        if table.get("sample_ids", "row") != "row":
            problems.append(SpecProblem("extract.sample_ids", 'must be "row" (or left out): the sample ids '
                                        "follow the regenerated rows' ids", lines.get("extract.sample_ids")))
        # The regeneration's success file is the dataset; a placeholder while that stage has problems, so
        # this stage's own problems are reported too.
        dataset = str(regen.output) if regen is not None else "regenerated.jsonl"
        table = {**table, "dataset": dataset, "sample_ids": "row"}
        extract, found = _stage_problems(parse_job_spec, table, "extract", lines, source, base_dir)
        problems += found
    if problems or regen is None or extract is None:
        raise JobSpecError(source, problems)
    return PipelineSpec(regenerate=regen, extract=extract)


def load_pipeline_spec(path: Path | str) -> PipelineSpec:
    """Read a pipeline spec file; raises ``JobSpecError`` (problems name the stage's key and line) or
    ``OSError``."""
    from sessions.safe_files import JOB_SPEC, read_text

    path = Path(path).expanduser()
    text = read_text(path, JOB_SPEC)
    spec = parse_pipeline_spec(text, source=str(path), base_dir=path.parent.resolve())
    source = path.resolve()
    return PipelineSpec(regenerate=replace(spec.regenerate, source_path=source),
                        extract=replace(spec.extract, source_path=source), source_path=source)
