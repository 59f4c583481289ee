"""Extraction jobs as detached processes: create, spawn, status, pause, continue, cancel, resume.

Job state lives under ``<home.jobs_dir>/<job-id>/`` and never in the output dir (DESIGN §6):
``spec.toml`` (the resolved spec: absolute paths), ``job.json`` (id, creation time, dataset fingerprint),
``progress.json`` (written by the job process; read by ``progress.read_progress``), ``control.json``
(pause/cancel requests from the CLI or the TUI), ``job.log`` (the process's stdout and stderr).

The process is ``python -m sessions.extraction.runner --job-dir DIR`` started with ``start_new_session``,
stdin from /dev/null and the job dir as working directory, so it outlives the TUI and the SSH session, and
a user's own ``sessions/`` folder cannot shadow ours.  It is identified by pid + create time.  Nothing
here imports torch: the TUI calls these functions.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sessions.capture.plugin.eagle3_capture.spec import DEFAULT_RID_PREFIX
from sessions.extraction.progress import (
    PROGRESS_FILE,
    JobProgress,
    list_jobs,
    process_alive,
    read_progress,
)
from sessions.extraction.spec import JOB_DATASET_PREFIX, JobSpec, JobSpecError, check_paths, load_job_spec
from sessions.home import (
    Home,
    atomic_write_json,
    atomic_write_text,
    ensure_private_dir,
    read_json,
    resolve_home,
)

if TYPE_CHECKING:
    from sessions.extraction.servers import ServerEndpoint

CONTROL_FILE = "control.json"
JOB_FILE = "job.json"
SPEC_FILE = "spec.toml"
LOG_FILE = "job.log"


SpecT = TypeVar("SpecT")  # the spec type a loader returns (`JobSpec`, `RegenSpec`)


class JobError(RuntimeError):
    """A job action that cannot be done; ``code`` is the CLI exit code (1 failed, 2 bad input)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def job_dir(job_id: str, home: Home | None = None) -> Path:
    home = home or resolve_home()
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise JobError(f"not a job id: {job_id!r}", code=2)
    return home.jobs_dir / job_id


def find_job(job_id: str, home: Home | None = None) -> Path:
    path = job_dir(job_id, home)
    if not (path / JOB_FILE).is_file():
        raise JobError(f"no job {job_id!r} under {path.parent}", code=2)
    return path


def write_spec_copy(spec: JobSpec, path: Path) -> None:
    import tomli_w

    atomic_write_text(path, tomli_w.dumps(spec.to_toml_dict()))


def resolve_spec(spec: JobSpec, home: Home) -> JobSpec:
    """Fill server_url, capture_dir, rid_prefix and model_path from ``session`` (the spec's own values win).

    With ``servers`` (`sessions.extraction.servers`) they are filled from the first server, and every entry
    must resolve (a missing session, a group without members, two servers on one capture dir: refused)."""
    if spec.servers:
        first = resolve_endpoints(spec, home)[0]
        if first.session is not None:
            one = resolve_spec(replace(spec, servers=(), session=first.session, server_url=None, capture_dir=None),
                               home)
            return replace(one, servers=spec.servers, session=None)
        return replace(spec, server_url=first.url, capture_dir=first.capture_dir, rid_prefix=first.rid_prefix,
                       model_path=spec.model_path or first.model_path)
    if not spec.session:
        return replace(spec, rid_prefix=spec.rid_prefix or DEFAULT_RID_PREFIX)
    from sessions.server import ServerSession, SessionNotFound

    try:
        session = ServerSession.load(spec.session, home)
        profile = session.profile
    except SessionNotFound as exc:
        from sessions.extraction.nodes import multi_node_refusal

        across = multi_node_refusal(spec.session, home)  # the id of a server across nodes: not here
        raise JobError(f"job.session: {across or exc}", code=2) from None
    except Exception as exc:  # noqa: BLE001 - a damaged session folder: say which
        raise JobError(f"job.session: cannot read session {spec.session}: {exc}", code=2) from None
    from sessions.extraction.nodes import worker_node_refusal

    worker = worker_node_refusal(spec.session, int(profile.server.tp_size), profile.server.extra_args)
    if worker:  # a worker node of a server across nodes: its ranks write nothing, so nothing would come
        raise JobError(f"job.session: {worker}", code=2)
    capture = profile.capture
    if not capture.enabled:
        raise JobError(f"job.session: session {spec.session} runs profile {profile.name!r} with capture "
                       "off; turn capture on and restart it", code=2)
    host = profile.server.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    port = session.state_record.get("port") or profile.server.port
    if spec.capture_dir is not None:
        capture_dir = spec.capture_dir
    else:
        from sessions.profiles.capture_launch import capture_dir as profile_capture_dir

        capture_dir = Path(profile_capture_dir(profile))  # the profile's, or the default the launch used
    python = spec.python
    if python is None and not _is_this_python(profile.server.python):
        python = Path(profile.server.python)  # the server's interpreter: it has torch on a GPU host
    return replace(
        spec,
        python=python,
        server_url=f"http://{host}:{port}",
        capture_dir=Path(capture_dir),
        rid_prefix=spec.rid_prefix or capture.rid_prefix or DEFAULT_RID_PREFIX,
        model_path=spec.model_path or Path(profile.server.model_path),
        capture_layers=tuple(capture.layers) if capture.layers else None,
    )


def resolve_endpoints(spec: JobSpec, home: Home) -> list[ServerEndpoint]:
    """The servers of a spec with ``servers`` (`sessions.extraction.servers`); JobError (code 2) naming the
    entry for one that cannot serve the job."""
    from sessions.extraction.servers import ServersError, resolve_servers

    def one_session(session_id: str) -> JobSpec:
        try:
            return resolve_spec(replace(spec, servers=(), session=session_id, server_url=None, capture_dir=None),
                                home)
        except JobError as exc:
            raise JobError(f"job.servers: {session_id}: {str(exc).removeprefix('job.session: ')}", code=2) from None

    try:
        return resolve_servers(spec, home, one_session)
    except ServersError as exc:
        raise JobError(str(exc), code=2) from None


def capture_dir_problem(capture_dir: Path | None) -> str | None:
    """Why the job's capture dir would be refused (the plugin's own rules: a symlink, not a folder, another
    user's, group/other bits), or None.  Checked before anything is sent: a refused dir would fail every
    sample.  A missing one is fine (the server makes it 0700 on its first dump)."""
    if capture_dir is None:
        return None
    from sessions.capture.writer import CaptureDirError, check_capture_dir

    try:
        check_capture_dir(capture_dir)
    except CaptureDirError as exc:
        return (f"job.capture_dir: {exc}; nothing was sent. Give a private folder of yours (0700, not a "
                "link), the one the server captures into")
    return None


def _write_progress(path: Path, **fields: Any) -> None:
    current = read_json(path / PROGRESS_FILE, default={}) or {}
    current.update(fields)
    current["updated_at"] = time.time()
    atomic_write_json(path / PROGRESS_FILE, current)


def _preflight_output_dir(spec: JobSpec, home: Home) -> None:
    """Refuse, before spawning, an output dir that holds anything (a fresh job needs an empty one).

    The hint says what the data there is: a finished job's (run again into another folder, or delete it),
    or an unfinished one's (resume that job).  Resuming a done job does nothing, so it is never offered."""
    out = spec.output_dir
    if out.is_dir() and any(out.iterdir()):
        from sessions.extraction.output import OutputDir

        owner = OutputDir(out).owner_job_id()
        again = "delete it or set another output_dir to run the spec again"
        hint = f"; {again}"
        if owner:
            try:
                owner_progress: JobProgress | None = read_progress(job_dir(owner, home))
            except JobError:
                owner_progress = None
            if owner_progress is not None and owner_progress.state == "done" \
                    and not owner_progress.extraction_failures:
                hint = f"; it holds the finished dataset of job {owner} (done); {again}"
            elif owner_progress is not None:
                hint = (f"; it holds job {owner}'s unfinished dataset ({owner_progress.state}): "
                        f"`eagle3-tui extract resume {owner}` continues it, or {again}")
            else:
                hint = f"; it holds the dataset of job {owner}, which this home does not know; {again}"
        raise JobError(f"output_dir {out} is not empty{hint}", code=1)


def resolve_job_dataset(spec: JobSpec, home: Home) -> JobSpec:
    """``dataset = "job:<id>"``: the success file of that (finished) regeneration job, with the sample ids
    following its row ids."""
    text = str(spec.dataset)
    if not text.startswith(JOB_DATASET_PREFIX):
        return spec
    source_id = text[len(JOB_DATASET_PREFIX):]
    try:
        progress = job_status(source_id, home)  # the regeneration job records its output path there
    except JobError as exc:
        raise JobError(f"job.dataset: {exc}", code=2) from None
    if progress.mode != "regenerate":
        raise JobError(f"job.dataset: job {source_id} is an extraction job, not a regeneration job", code=2)
    output = Path(progress.output_dir)
    if progress.state != "done":
        raise JobError(f"job.dataset: regeneration job {source_id} is {progress.state}, not done; extract from "
                       "it once it has finished (`eagle3-tui regenerate status " + source_id + "`)", code=2)
    return replace(spec, dataset=output, sample_ids="row")


def load_spec_for_job(spec_path: Path | str, load: Callable[[Path | str], SpecT]) -> SpecT:
    """``load(spec_path)`` for a new job of either kind, with a missing file or a bad spec as a
    `JobError` of exit code 2 that names it."""
    try:
        return load(spec_path)
    except FileNotFoundError:
        raise JobError(f"job spec {spec_path} not found", code=2) from None
    except JobSpecError as exc:
        raise JobError(str(exc), code=2) from None


def create_job(spec_path: Path | str, home: Home | None = None,
               servers: tuple[str, ...] | None = None) -> tuple[str, Path]:
    """Check the spec and make the job dir (no process yet); returns (job id, job dir).

    ``servers`` (``extract run --servers``) replaces whatever servers the spec names."""
    home = (home or resolve_home()).ensure()
    if servers:
        from sessions.extraction.spec import SpecProblem, server_ref_problem

        for entry in servers:
            problem = server_ref_problem(entry)
            if problem:
                raise JobError(str(JobSpecError("--servers", [SpecProblem("--servers", f"{entry!r}: {problem}")])),
                               code=2)
        spec = load_spec_for_job(spec_path, lambda p: load_job_spec(p, servers_given=True))
        spec = replace(spec, servers=tuple(servers), session=None, server_url=None)
    else:
        spec = load_spec_for_job(spec_path, load_job_spec)
    spec = resolve_job_dataset(spec, home)
    problems = check_paths(spec)
    if problems:
        raise JobError(f"{spec_path}: " + "; ".join(str(p) for p in problems), code=2)
    resolved = resolve_spec(spec, home)  # a named session must exist and have capture on
    check_job_python(job_python(resolved))
    problem = capture_dir_problem(resolved.capture_dir)
    if problem:
        raise JobError(f"{spec_path}: {problem}", code=2)
    if spec.servers:
        for endpoint in resolve_endpoints(spec, home):  # resolve_spec above already refused what cannot resolve
            problem = capture_dir_problem(endpoint.capture_dir)
            if problem:
                raise JobError(f"{spec_path}: server {endpoint.name}: {problem}", code=2)
    _preflight_output_dir(spec, home)
    job_id = new_job_id(spec.name)
    path = ensure_private_dir(home.jobs_dir / job_id)
    write_spec_copy(replace(spec, python=resolved.python), path / SPEC_FILE)
    atomic_write_json(path / JOB_FILE, {"job_id": job_id, "created_at": time.time(),
                                         "spec_source": str(spec.source_path), "home_demo": home.demo})
    _write_progress(path, job_id=job_id, name=spec.name, state="starting", output_dir=str(spec.output_dir),
                    dataset=str(spec.dataset), server_url=spec.server_url, started_at=time.time())
    return job_id, path


# What the job process imports besides our own `sessions` package (torch only once it collects).
JOB_MODULES = ("torch", "transformers", "safetensors", "tokenizers", "jinja2", "httpx", "psutil")


def _is_this_python(python: str) -> bool:
    # By path, not by realpath: every venv's python is a link to the same base interpreter.
    return os.path.abspath(os.path.expanduser(python)) == os.path.abspath(sys.executable)


def job_python(spec: JobSpec) -> str:
    """The interpreter that runs the job: the spec's `python`, or the session profile's (see resolve_spec),
    or this one."""
    return str(spec.python) if spec.python is not None else sys.executable


def check_job_python(python: str) -> None:
    """Refuse a job whose interpreter lacks what extraction imports, naming the interpreter and the modules.

    For this interpreter the check only looks the modules up; another one (SGLang's) is asked in a child
    process, since its packages are not ours to import."""
    if _is_this_python(python):
        import importlib.util

        missing = [m for m in JOB_MODULES if importlib.util.find_spec(m) is None]
    else:
        probe = ("import importlib.util, sys; "
                 f"print(' '.join(m for m in {JOB_MODULES!r} if importlib.util.find_spec(m) is None))")
        try:
            done = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JobError(f"job.python: cannot run {python}: {exc}", code=2) from None
        if done.returncode != 0:
            raise JobError(f"job.python: {python} is not a working Python interpreter: "
                           f"{(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}",
                           code=2)
        missing = done.stdout.split()
    if missing:
        raise JobError(
            f"job.python: {python} cannot import {', '.join(missing)}, which extraction needs. Point the job "
            "spec's `python` (or the session profile's server.python) at SGLang's interpreter, which has "
            "them, or install eagle3-tui[extract] next to this one", code=2)


def _job_pythonpath(python: str, home_state: Path) -> str:
    """PYTHONPATH entry that makes our `sessions` package importable in the job's interpreter.

    Under this interpreter it is the folder holding the package.  Under another one (SGLang's venv) it is a
    private folder holding only a link to the package, so none of this venv's other packages (its textual,
    httpx, ...) shadow the ones that interpreter has."""
    package = Path(__file__).resolve().parents[1]
    if _is_this_python(python):
        return str(package.parent)
    folder = ensure_private_dir(home_state / "job-pythonpath")
    link = folder / package.name
    if not (link.is_symlink() and os.readlink(link) == str(package)):
        tmp = folder / f".{package.name}.{secrets.token_hex(4)}"
        os.symlink(package, tmp)
        os.replace(tmp, link)
    return str(folder)


def open_job_log(path: Path) -> int:
    """``job.log`` for appending, private (0600) like everything else in the home: it holds the job's
    paths, server URL and tracebacks.  A log left 0644 by an older version is made private too; a link
    in its place is refused (O_NOFOLLOW)."""
    fd = os.open(path / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def update_progress(path: Path, **fields: Any) -> None:
    """Merge ``fields`` into the job's progress file (the regeneration job writes the same file)."""
    _write_progress(path, **fields)


# The job process of each kind of job (job.json's "mode"), so that pause/resume/cancel serve both.
RUNNERS = {"extract": "sessions.extraction.runner", "regenerate": "sessions.regeneration.runner"}


def spawn(path: Path, resume: bool, accept_server: bool = False, allow_partial: bool = False,
          module: str | None = None, python: str | None = None) -> int:
    """Start the job process (``python -m <module> --job-dir DIR``) detached; return its pid (also recorded
    in progress.json).  By default the module is the one of the job's mode and ``python`` the extraction
    spec's interpreter (a regeneration job needs only httpx: this one).

    ``allow_partial`` (``--allow-partial``): the job starts although its storage estimate does not fit
    (`sessions.extraction.storage`); it writes what fits and pauses when the disk is full."""
    import psutil

    mode = str((read_json(path / JOB_FILE, default={}) or {}).get("mode") or "extract")
    module = module or RUNNERS.get(mode, RUNNERS["extract"])
    if python is None:
        python = sys.executable if mode == "regenerate" else job_python(load_job_spec(path / SPEC_FILE))
    env = dict(os.environ)
    entry = _job_pythonpath(python, path.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (entry, env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")  # local files only: a job never reaches a hub
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    argv = [python, "-m", module, "--job-dir", str(path)]
    if resume:
        argv.append("--resume")
    atomic_write_json(path / CONTROL_FILE, {"pause": False, "cancel": False, "accept_server": accept_server,
                                            "allow_partial": allow_partial})
    log_fd = open_job_log(path)
    try:
        proc = subprocess.Popen(argv, cwd=path, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, close_fds=True)
    finally:
        os.close(log_fd)
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = None
    _write_progress(path, pid=proc.pid, create_time=create_time, state="starting", reason=None,
                    paused_by_user=False, python=python)
    # Reap it when it ends, so a long-lived parent (the TUI) does not collect zombies; nothing waits on it.
    threading.Thread(target=proc.wait, name=f"reap-{path.name}", daemon=True).start()
    return proc.pid


def run_job(spec_path: Path | str, home: Home | None = None, allow_partial: bool = False,
            servers: tuple[str, ...] | None = None) -> str:
    """``extract run``: create and spawn; returns the job id."""
    job_id, path = create_job(spec_path, home, servers=servers)
    spawn(path, resume=False, allow_partial=allow_partial)
    return job_id


def job_status(job_id: str, home: Home | None = None) -> JobProgress:
    path = find_job(job_id, home)
    progress = read_progress(path)
    if progress is None:
        raise JobError(f"job {job_id} has no progress file yet", code=1)
    return progress


def all_jobs(home: Home | None = None) -> list[JobProgress]:
    return list_jobs(home or resolve_home())


def _control(path: Path, **changes: bool) -> None:
    current = read_json(path / CONTROL_FILE, default={}) or {}
    current.update(changes)
    atomic_write_json(path / CONTROL_FILE, current)


def pause_job(job_id: str, home: Home | None = None) -> JobProgress:
    progress = job_status(job_id, home)
    if not progress.is_live:
        raise JobError(f"job {job_id} is {progress.state}, not running", code=1)
    _control(Path(progress.job_dir), pause=True)
    return progress


def resume_job(job_id: str, home: Home | None = None, accept_server: bool = False,
               allow_partial: bool = False) -> JobProgress:
    """``extract resume``: a live job paused by the user continues; a stopped one (or a done one with failed
    samples, which are retried) gets a new process that continues from the manifest under the same id.

    ``accept_server`` (``--accept-server``): the server that answers at the job's URL now becomes the job's,
    even where its identity differs from the one the job started with; the job records the change."""
    progress = job_status(job_id, home)
    path = Path(progress.job_dir)
    if progress.is_live:
        if accept_server:
            _control(path, accept_server=True, pause=False)
            return progress
        if progress.paused_by_user or (read_json(path / CONTROL_FILE, default={}) or {}).get("pause"):
            _control(path, pause=False)
            return progress
        raise JobError(f"job {job_id} is already {progress.state} (pid {progress.pid})", code=1)
    if progress.state == "done" and not progress.extraction_failures:
        raise JobError(f"job {job_id} is done: nothing to resume", code=1)
    spawn(path, resume=True, accept_server=accept_server, allow_partial=allow_partial)
    return job_status(job_id, home)


def cancel_job(job_id: str, home: Home | None = None, grace_s: float = 30.0) -> JobProgress:
    """Stop the job: it finishes the requests in flight, records them, and exits as ``cancelled``.

    A job that does not exit within ``grace_s`` is killed; its partial work is redone on resume (the
    output dir reconciles against the manifest), so nothing is lost either way.
    """
    progress = job_status(job_id, home)
    path = Path(progress.job_dir)
    if not progress.is_live:
        if progress.state in ("done", "cancelled"):
            # Nothing runs: saying "cancelled" of a done job would misreport its data.
            raise JobError(f"job {job_id} is already {progress.state}: nothing to cancel", code=1)
        _write_progress(path, state="cancelled", reason="cancelled while not running", finished_at=time.time())
        return job_status(job_id, home)
    _control(path, cancel=True)
    pid, create_time = progress.pid, progress.create_time
    if pid and process_alive(pid, create_time):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and process_alive(pid, create_time):
        time.sleep(0.1)
    if pid and process_alive(pid, create_time):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.2)
    latest = read_progress(path)
    if latest is None or latest.state != "cancelled":
        _write_progress(path, state="cancelled", reason="cancelled (the process was stopped)",
                        finished_at=time.time())
    return job_status(job_id, home)

