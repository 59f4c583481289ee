"""`eagle3-tui launch | status | stop | restart | logs`: the server-session commands (DESIGN §1b contract).

`launch` prints only the new session id on stdout; `status --json` prints one JSON array of session
objects; everything meant for people goes to stderr.  A SESSION argument may be a unique id prefix.
Only argparse is imported here; the engine is imported inside the handlers (fast `--help`).
"""
from __future__ import annotations

import argparse
import sys

from app.cli_hosts import add_host_option
from app.cli_options import add_grace_option, add_json_option, command

# `wait` and `launch --wait-ready`: one exit code per outcome (sessions.server.waiting), so a script can
# tell a hang from a crash without parsing text.  0-2 keep the CLI's meanings (ok, failed, bad input).
WAIT_EXIT_CODES = {"ready": 0, "stalled": 3, "crashed": 4, "stopped": 5, "timeout": 6}
_WAIT_CODES_HELP = (
    "Exit status: 0 ready, 3 stalled (the log went silent past the stall limit; the server still runs), "
    "4 crashed or ended on its own, 5 stopped, 6 --timeout passed (the server still runs), 2 bad input "
    "(no such session, a bad profile, or GPUs in use: eagle3-tui launch --force launches anyway), 1 the "
    "launch failed."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(
        subparsers,
        "launch",
        _launch,
        help="start a server from a profile, detached; prints the session id",
        description="Validate PROFILE, start its server detached (it outlives this command), and print "
        "the new session id on stdout.  With --wait-ready, wait until it is ready, stalled, crashed or "
        "stopped.  " + _WAIT_CODES_HELP,
    )
    p.add_argument("profile", metavar="PROFILE",
                   help="a profile name (<config>/profiles/NAME.toml), a path, or - (its TOML on stdin, with --name)")
    p.add_argument("--name", default=None, metavar="NAME",
                   help="with PROFILE -: the profile's name (its copy is kept in <state>/received-profiles)")
    add_host_option(p)
    p.add_argument(
        "--wait-ready", action="store_true",
        help="wait until the server is ready (0), stalled (3), crashed (4) or stopped (5)",
    )
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help="with --wait-ready: give up after S s (exit 6; the server keeps running)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="launch even when other processes hold memory on the GPUs it would use (else: exit 2)",
    )
    p.add_argument(
        "--lock-timeout", type=float, default=None, metavar="S",
        help="wait at most S s for another launch of this home to finish (default 60; then exit 1)",
    )
    p.add_argument(
        "--replicas", type=int, default=None, metavar="N",
        help="start N servers of the profile as one group on disjoint GPUs (--base-gpu-id i*tp*pp) and "
        "ports (port+i); prints one session id a line (default: the profile's server.replicas)",
    )
    p.add_argument("--node-rank", type=int, default=None, metavar="R",
                   help="run node R of a profile with server.nnodes > 1 (set by the multi-node launch)")
    p.add_argument("--dist-init-addr", default=None, metavar="HOST:PORT", help="with --node-rank: the rendezvous")
    p.add_argument("--node-address", default="127.0.0.1", metavar="ADDR",
                   help="with --node-rank: this node's address (a worker binds its dummy health app there)")

    p = command(
        subparsers,
        "wait",
        _wait,
        help="wait until a session is ready; a distinct exit code for stalled, crashed, stopped, timeout",
        description="Wait until SESSION (an id or unique prefix) is ready.  The wait ends at the first "
        "answer: a stall (the log silent past the session's stall limit) ends it at once.  State and "
        "phase changes go to stderr.  " + _WAIT_CODES_HELP,
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--until", choices=("ready",), default="ready", help="what to wait for (ready)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="give up after S s (exit 6)")

    p = command(
        subparsers,
        "prune",
        _prune,
        help="remove ended sessions' folders (never a running one; baselines' good starts are kept)",
        description="Remove the folders of ended sessions (stopped, crashed, exited).  A session whose server "
        "runs is never touched (its main process is checked by pid and create time).  The good starts that "
        "baselines use (the latest ready start of each profile, and of each model and SGLang version) are "
        "kept unless --include-baselines.  Lists what goes and asks y/N on a terminal (--yes otherwise).",
    )
    p.add_argument("--older-than", default=None, metavar="D",
                   help="only sessions that ended at least D ago (90s, 30m, 12h, 7d, 2w; a bare number is days)")
    p.add_argument("--keep", type=int, default=0, metavar="N", help="keep the N newest ended sessions of each profile")
    p.add_argument("--include-baselines", action="store_true", help="remove the baselines' good starts too")
    p.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_json_option(p, "print the removed and kept sessions as JSON")

    p = command(subparsers, "status", _status, help="show sessions (state, phase, ranks, port)")
    p.add_argument("session", nargs="?", metavar="SESSION", help="a session id or unique prefix (default: all)")
    add_json_option(p, "print one JSON array of session objects")
    p.add_argument("--live", action="store_true", help="only sessions whose server is still running")
    p.add_argument("--no-http", action="store_true", help="do not probe /ready and /model_info")
    add_host_option(p)

    p = command(
        subparsers,
        "stop",
        _stop,
        help="stop a session (or a group of replicas): SIGTERM, grace period, then SIGKILL what remains",
        description="SIGTERM the server's main process, wait --grace seconds, SIGKILL the process group and "
        "anything of the session left behind, then check that nothing remains and the port is free.  "
        "SESSION may name a group of replicas (its g-... id): every member is stopped.",
    )
    p.add_argument("session", metavar="SESSION")
    add_grace_option(p)
    add_json_option(p, "print the stop report as JSON on stdout")
    add_host_option(p)

    p = command(
        subparsers,
        "restart",
        _restart,
        help="stop a session and launch its profile as it is now; shows the flag diff first",
        description="Stop SESSION and launch its profile as it is now.  A member of a group restarts alone "
        "(same GPUs, port and group); a group id restarts every member.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_grace_option(p)

    p = command(
        subparsers,
        "logs",
        _logs,
        help="print a session's server log or a log file, filtered like grep (-f follows it)",
        description="Print the server log of SESSION (an id or unique prefix), or the log file PATH, "
        "secrets redacted.  --grep keeps lines containing TEXT (case-insensitive), or matching REGEX when "
        "written /REGEX/ or re:REGEX; --rank keeps the lines of TP rank N (a traceback stays with the rank "
        "that printed it, progress bars are TP0's; 'main' for lines of no rank).  A progress bar redrawn with \\r prints "
        "as one line in its last state, as the TUI shows it.  Exit status as grep: 0 "
        "when lines were printed, 1 when none matched, 2 on an error.",
    )
    p.add_argument("session", metavar="SESSION|PATH", help="a session id or prefix, or a log file path")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C or exit")
    p.add_argument("-n", "--lines", type=int, default=None, metavar="N", help="only the last N (matching) lines")
    p.add_argument("--grep", default=None, metavar="TEXT|/REGEX/", help="only lines with TEXT, or matching REGEX")
    p.add_argument("--rank", default=None, metavar="N", help="only the lines of TP rank N ('main': no rank)")
    add_host_option(p)


# --- handlers ---------------------------------------------------------------------------------------------


def _find(ref: str):
    from app.cli import CliError
    from sessions.server import SessionError, find_session

    try:
        return find_session(ref)
    except SessionError as exc:
        raise CliError(str(exc), exc.code) from None


def _launch(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, CliError
    from app.cli_profile import received_profile
    from sessions.profiles import ProfileError, load_profile
    from sessions.server import LaunchError, ServerSession

    try:
        profile = received_profile(args.name) if args.profile == "-" else load_profile(args.profile)
    except ProfileError as exc:
        raise CliError(_profile_error_text(args.profile, exc), EXIT_BAD_INPUT) from None
    if profile.host is not None and profile.host != "local":
        from app.cli_hosts import launch_on_host

        return launch_on_host(profile, args)
    if args.lock_timeout is not None and not args.lock_timeout >= 0:
        raise CliError(f"--lock-timeout must be 0 or more seconds, got {args.lock_timeout:g}", EXIT_BAD_INPUT)
    if args.timeout is not None and not args.timeout >= 0:
        raise CliError(f"--timeout must be 0 or more seconds, got {args.timeout:g}", EXIT_BAD_INPUT)
    lock_timeout = {} if args.lock_timeout is None else {"lock_timeout_s": args.lock_timeout}
    if profile.server.nnodes > 1 and args.node_rank is None:
        from app.cli_nodes import launch_across_nodes

        return launch_across_nodes(profile)  # one server across nodes (sessions.server.nodes)
    if args.node_rank is not None:
        from sessions.server.nodes import node_profile

        if not (profile.server.nnodes > 1 and 0 <= args.node_rank < profile.server.nnodes and args.dist_init_addr):
            raise CliError(f"--node-rank {args.node_rank}: profile {args.profile!r} has server.nnodes = "
                           f"{profile.server.nnodes} (node ranks 0..{profile.server.nnodes - 1}), and "
                           "--dist-init-addr HOST:PORT must be given", EXIT_BAD_INPUT)
        profile = node_profile(profile, args.node_rank, args.dist_init_addr, args.node_address)
    if args.replicas is not None:
        from sessions.profiles import ProfileError
        from sessions.profiles.fields import MAX_REPLICAS
        from sessions.server.group import with_replicas

        if not 1 <= args.replicas <= MAX_REPLICAS:
            raise CliError(f"--replicas must be between 1 and {MAX_REPLICAS}, got {args.replicas}", EXIT_BAD_INPUT)
        try:
            profile = with_replicas(profile, args.replicas)
        except ProfileError as exc:
            raise CliError(_profile_error_text(args.profile, exc), EXIT_BAD_INPUT) from None
    try:
        sessions = ServerSession.launch_group(profile, force=args.force, **lock_timeout)
    except LaunchError as exc:
        raise CliError(str(exc), exc.code) from None
    for session in sessions:
        print(session.session_id, flush=True)
    for session in sessions:
        rec = session.state_record
        info = session.group
        member = f" (replica {info.index} of group {info.group_id}, GPUs {_gpu_list(info.gpus)})" if info else ""
        print(
            f"launched {session.session_id}{member}: pid {rec.get('pid')}, {rec.get('host')}:{rec.get('port')}, "
            f"log {session.log_path}",
            file=sys.stderr,
        )
    if args.wait_ready:
        codes = [_wait_ready(session, args.timeout) for session in sessions]
        return max(codes)
    return 0


def _gpu_list(gpus) -> str:
    return ",".join(str(g) for g in gpus) or "?"


def _targets(ref: str) -> list:
    """SESSION as a group of replicas (its members) or as one session."""
    from app.cli import CliError
    from sessions.server import SessionError, find_group

    try:
        members = find_group(ref)
    except SessionError as exc:
        raise CliError(str(exc), exc.code) from None
    return members if members is not None else [_find(ref)]


def _wait_ready(session, timeout_s: float | None) -> int:
    """Wait for ``session`` (see `sessions.server.waiting`): print each state/phase change to stderr and
    the outcome, and return the outcome's exit code (`WAIT_EXIT_CODES`)."""
    from sessions.server.waiting import wait_until_ready

    shown: list[tuple[str, str]] = []

    def changed(status) -> None:
        if not shown or shown[-1] != (status.state, status.phase):
            shown.append((status.state, status.phase))
            print(f"{status.state}: {status.phase}", file=sys.stderr, flush=True)

    result = wait_until_ready(session, timeout_s, on_status=changed, on_stall=_save_stall_report)
    print(result.message(), file=sys.stderr)
    return WAIT_EXIT_CODES[result.outcome]


def _save_stall_report(session, status):
    """Save the stall's diagnosis report in the session folder (`sessions.diagnosis.save_stall_report`: once
    per stall, whoever watches) and return its path; None when another watcher claimed this stall first."""
    from sessions.diagnosis import save_stall_report

    try:
        return save_stall_report(session, status)
    except OSError as exc:
        print(f"{session.session_id}: stall report not saved: {exc.strerror or exc}", file=sys.stderr)
        return None


def _wait(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, CliError

    if args.timeout is not None and not args.timeout >= 0:
        raise CliError(f"--timeout must be 0 or more seconds, got {args.timeout:g}", EXIT_BAD_INPUT)
    session = _find(args.session)
    return _wait_ready(session, args.timeout)


def _prune(args: argparse.Namespace) -> int:
    import json

    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, CliError
    from sessions.home import resolve_home
    from sessions.server import LaunchError
    from sessions.server.prune import parse_duration, plan_prune, prune

    if args.keep < 0:
        raise CliError(f"--keep must be 0 or more, got {args.keep}", EXIT_BAD_INPUT)
    try:
        older = parse_duration(args.older_than) if args.older_than is not None else None
    except ValueError as exc:
        raise CliError(f"--older-than: {exc}", EXIT_BAD_INPUT) from None
    home = resolve_home()
    plan = plan_prune(home, older_than_s=older, keep=args.keep, include_baselines=args.include_baselines)
    for item in plan.to_remove:
        print(f"remove {item.session_id} ({item.state})", file=sys.stderr)
    for item in plan.kept:
        print(f"keep   {item.session_id}: {item.why}", file=sys.stderr)
    if plan.running:
        print(f"running, never pruned: {', '.join(plan.running)}", file=sys.stderr)
    removed: list[str] = []
    problems: list[str] = []
    if plan.to_remove and not args.dry_run:
        if not args.yes and not _confirmed("prune", "(or --dry-run)",
                                           f"remove {len(plan.to_remove)} session folder(s)?", "nothing removed"):
            return 0
        try:
            removed, problems = prune(home, plan)
        except LaunchError as exc:
            raise CliError(str(exc), exc.code) from None
    for problem in problems:
        print(f"eagle3-tui: {problem}", file=sys.stderr)
    verb = "would remove" if args.dry_run else "removed"
    count = len(plan.to_remove) if args.dry_run else len(removed)
    print(f"{verb} {count} session(s); kept {len(plan.kept)}, {len(plan.running)} running", file=sys.stderr)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "removed": removed if not args.dry_run else [],
                          "would_remove": [i.session_id for i in plan.to_remove] if args.dry_run else [],
                          "kept": [i.to_json() for i in plan.kept], "running": plan.running,
                          "problems": problems}, indent=2))
    return EXIT_FAILED if problems else 0


def _status(args: argparse.Namespace) -> int:
    """Every session, each read on its own: a damaged one is listed with its problem, never a traceback
    that hides the others."""
    import json

    from sessions.server import list_sessions

    sessions = _targets(args.session) if args.session else list_sessions(include_ended=not args.live)
    gpu = _gpu_snapshot() if any(s.is_alive() for s in sessions) else None
    statuses, read, failures = [], [], []
    for session in sessions:
        try:
            statuses.append(session.status(probe_http=not args.no_http, gpu_snapshot=gpu))
            read.append(session)
        except Exception as exc:  # noqa: BLE001 - one session's failure must not hide the others
            failures.append((session, f"status failed: {type(exc).__name__}: {exc}"))
    _save_stall_reports(read, statuses)
    if args.json:
        from sessions.redaction import Redactor

        # Titles, error lines and the like come from the server: hide each session's secrets by value.
        rows = [Redactor.for_session(se).json(st.to_json()) for se, st in zip(read, statuses)]
        rows += [Redactor.for_session(se).json(_failed_row(se, why)) for se, why in failures]
        print(json.dumps(rows, indent=2))
        return 0
    if not statuses and not failures:
        print("no sessions", file=sys.stderr)
        return 0
    print(_status_table(statuses, failures))
    problems = [(st.session_id, st.problem) for st in statuses if st.problem]
    problems += [(session.session_id, why) for session, why in failures]
    for session_id, problem in problems:
        print(f"{session_id}: {problem}", file=sys.stderr)
    return 0


def _save_stall_reports(sessions, statuses) -> None:
    """A stall this status noticed saves its diagnosis report in the session folder, once per stall
    (whoever notices it first: this command, the TUI, `wait`); named on stderr when this call wrote it."""
    for session, status in zip(sessions, statuses):
        if status.state != "stalled":
            continue
        # `_save_stall_report` imports the diagnosis package only for a stall: it is a third of a plain
        # status's start-up
        path = _save_stall_report(session, status)
        if path is not None:
            print(f"{session.session_id} stalled: diagnosis saved to {path}", file=sys.stderr)


def _gpu_snapshot():
    """The GPU panel's reading (NVML, else emulated GPUs), so each rank's GPU comes from NVML's pids."""
    from sessions.gpus import default_gpu_source, first_reading
    from sessions.home import resolve_home

    home = resolve_home()
    source = default_gpu_source(home, demo=home.demo)
    try:
        snapshot = first_reading(source)
    finally:
        source.close()
    return snapshot if snapshot.available else None


def _failed_row(session, why: str) -> dict:
    return {"session_id": session.session_id, "profile": session.profile_name, "state": "unknown",
            "problem": why, "session_dir": str(session.session_dir)}


def _status_table(statuses, failures=()) -> str:
    """One row a session; the members of a group of replicas under one group row, each member indented
    with its GPUs (a crashed member shows as crashed between live ones)."""
    import time

    from sessions.server.group import GroupInfo

    rows = [("SESSION", "PROFILE", "STATE", "PHASE", "PID", "PORT", "RANKS", "AGE", "SILENT")]
    now = time.time()
    groups: dict[str, list] = {}
    replaced: set[str] = set()
    for st in statuses:
        info = GroupInfo.from_record({"group": st.group}) if st.group else None
        groups.setdefault(info.group_id if info else f"\0{st.session_id}", []).append((info, st))
    ordered = []
    for key, items in groups.items():
        if key.startswith("\0"):
            ordered.append((None, items[0][1]))
            continue
        items.sort(key=lambda pair: (pair[0].index, pair[1].started_at or 0.0))
        # A member restarted alone leaves its ended predecessor: the newest session of an index is the member.
        current = {info.index: st.session_id for info, st in items}
        states = [st.state for info, st in items if current[info.index] == st.session_id]
        summary = ", ".join(f"{states.count(x)} {x}" for x in dict.fromkeys(states))
        first = items[0][1]
        size = items[0][0].size
        rows.append((key, first.profile, f"group of {size}: {summary}", "-", "-", "-", "-",
                     _duration(now - first.started_at) if first.started_at else "?", "-"))
        ordered += [(info, st) for info, st in items]
        replaced.update(st.session_id for info, st in items if current[info.index] != st.session_id)
    for info, st in ordered:
        schedulers = [r for r in st.ranks if r.role == "scheduler"]
        expected = st.summary.ranks_expected
        ranks = f"{len(schedulers)}/{expected}" if expected else str(len(schedulers))
        age = _duration(now - st.started_at) if st.started_at else "?"
        # Silence means something only while a server starts: a ready server is quiet when idle.
        silent = _duration(st.silent_for_s) if st.alive and st.state in ("starting", "stalled") else "-"
        state = f"{st.state} (!)" if st.problem else st.state
        name = st.session_id if info is None else f"  [{info.index}] {st.session_id} GPU {_gpu_list(info.gpus)}"
        if st.session_id in replaced:
            name += " (replaced)"
        rows.append(
            (name, st.profile, state, st.phase, str(st.pid or "-"), str(st.port or "-"), ranks,
             age, silent)
        )
    for session, _why in failures:
        rows.append((session.session_id, session.profile_name, "unknown (!)", "-", "-", "-", "-", "?", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _duration(seconds: float) -> str:
    total = max(0, int(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def _stop(args: argparse.Namespace) -> int:
    import json

    from app.cli import EXIT_FAILED
    from sessions.server import stop_group

    targets = _targets(args.session)
    reports = stop_group(targets, grace_s=args.grace) if len(targets) > 1 else [targets[0].stop(grace_s=args.grace)]
    if args.json:
        docs = [r.to_json() | {"session_id": t.session_id} for t, r in zip(targets, reports)]
        print(json.dumps(docs if len(targets) > 1 else reports[0].to_json(), indent=2))
    for report in reports:
        print(report.message, file=sys.stderr)
    return 0 if all(r.stopped for r in reports) else EXIT_FAILED


def _restart(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.profiles import ProfileError
    from sessions.server import SessionError, find_group, flag_diff

    try:
        members = find_group(args.session)
    except SessionError as exc:
        raise CliError(str(exc), exc.code) from None
    if members is not None:
        return _restart_group(args, members)
    session = _find(args.session)
    try:
        new_profile = session.current_profile()
    except ProfileError as exc:
        source = session.state_record.get("profile_source") or session.session_id
        raise CliError(_profile_error_text(source, exc), EXIT_BAD_INPUT) from None
    info = session.group
    if info is not None:
        from sessions.server.group import member_profile

        diff = flag_diff(session.profile, member_profile(new_profile, info.index))
    else:
        diff = flag_diff(session.profile, new_profile)
    print(f"restart {session.session_id} with profile {new_profile.name}:", file=sys.stderr)
    for line in diff or ["(no flag or env changes)"]:
        print(f"  {line}", file=sys.stderr)
    if not args.yes and not _confirmed("restart", "", "stop it and launch again?", "not restarted"):
        return 0
    try:
        new = session.restart(profile=new_profile, grace_s=args.grace)
    except SessionError as exc:
        raise CliError(str(exc), exc.code) from None
    print(new.session_id, flush=True)
    print(f"restarted as {new.session_id}: pid {new.state_record.get('pid')}", file=sys.stderr)
    return 0


def _restart_group(args: argparse.Namespace, members: list) -> int:
    """Restart every member of a group: stop them all, then launch the group from the profile as it is now."""
    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.profiles import ProfileError
    from sessions.server import SessionError, restart_group

    try:
        new_profile = members[0].current_profile()
    except ProfileError as exc:
        source = members[0].state_record.get("profile_source") or members[0].session_id
        raise CliError(_profile_error_text(source, exc), EXIT_BAD_INPUT) from None
    names = ", ".join(m.session_id for m in members)
    info = members[0].group
    replicas = new_profile.server.replicas if new_profile.is_explicit("server.replicas") or info is None \
        else info.size
    print(f"restart the group of {len(members)} ({names}) with profile {new_profile.name} "
          f"({replicas} replica(s))", file=sys.stderr)
    if not args.yes and not _confirmed("restart", "", "stop them and launch again?", "not restarted"):
        return 0
    try:
        new = restart_group(members, profile=new_profile, grace_s=args.grace)
    except SessionError as exc:
        raise CliError(str(exc), exc.code) from None
    for session in new:
        print(session.session_id, flush=True)
    return 0


def _logs(args: argparse.Namespace) -> int:
    from app.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, CliError
    from sessions.logs import MAIN_RANK, LogFileError, LogFilter

    if args.lines is not None and args.lines < 0:
        raise CliError(f"-n must be 0 or more, got {args.lines}", EXIT_BAD_INPUT)
    rank = _parse_rank(args.rank, MAIN_RANK) if args.rank is not None else None
    try:
        log_filter = LogFilter.parse(args.grep or "", rank)
    except ValueError as exc:
        raise CliError(f"--grep: {exc}", EXIT_BAD_INPUT) from None
    source = _log_source(args.session)
    try:
        printed = _print_log(source, args.lines, args.follow, log_filter if log_filter.active else None,
                             sys.stdout, source.secrets())
    except KeyboardInterrupt:
        return EXIT_OK
    except LogFileError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    except OSError as exc:
        raise CliError(f"{source.log_path}: read failed: {exc.strerror or exc}", EXIT_FAILED) from None
    return EXIT_OK if printed else EXIT_FAILED


def _parse_rank(text: str, main: int) -> int:
    """``--rank``: ``3`` or ``TP3`` is TP rank 3, ``main`` the lines of no rank (``main``)."""
    from app.cli import EXIT_BAD_INPUT, CliError

    value = text.strip().lower()
    if value == "main":
        return main
    digits = value.removeprefix("tp")
    if not digits.isdigit():
        raise CliError(f"--rank must be a TP rank (0, 1, ... or TP3) or 'main', got {text!r}", EXIT_BAD_INPUT)
    return int(digits)


class _LogSource:
    """What `logs` reads: a session's log (followed while its server lives) or a plain file."""

    def __init__(self, log_path, session=None) -> None:
        self.log_path = log_path
        self.session = session

    def is_alive(self) -> bool:
        return self.session.is_alive() if self.session is not None else True

    def secrets(self) -> tuple[str, ...]:
        """The session's secret values (its secrets file and profile), hidden by value; none for a file."""
        from sessions.redaction import Redactor

        return Redactor.for_session(self.session).known if self.session is not None else ()


def _log_source(ref: str) -> _LogSource:
    """A path when ``ref`` names an existing file (or has a slash), else a session id or prefix."""
    import os
    from pathlib import Path

    from app.cli import EXIT_BAD_INPUT, CliError
    from sessions.logs import LogFileError, open_log

    if os.sep in ref or os.path.lexists(ref):
        try:
            os.close(open_log(ref))  # refused at once when it is a FIFO, a device, a directory, a socket
        except FileNotFoundError:
            raise CliError(f"{ref}: no such file", EXIT_BAD_INPUT) from None
        except LogFileError as exc:
            raise CliError(str(exc), EXIT_BAD_INPUT) from None
        return _LogSource(Path(ref))
    session = _find(ref)
    return _LogSource(session.log_path, session)


def _print_log(source: _LogSource, last_n: int | None, follow: bool, log_filter, out, secrets) -> bool:
    """Print the log (or its last N lines, or the lines ``log_filter`` keeps); with ``follow``, keep
    printing until the server has exited (a plain file: until Ctrl-C).  True when a line was printed.

    `sessions.logs.LogFile` does the reading, so truncation and rotation are handled as in the TUI, and
    lines are redacted by the log core's display path.  Lines print as written (colours kept, like
    ``tail``), a bar redrawn with ``\r`` as one line in its last state (`sessions.logs.printed`, what the
    TUI shows); filters match what the line shows.  On a terminal, a tqdm bar still being drawn (no
    newline yet) is redrawn in place; into a pipe only complete lines go.
    """
    import time
    from collections import deque

    from sessions.logs import LogFile, shown
    from sessions.logs import printed as as_printed

    tty = out.isatty()
    printed = False
    shown_partial = ""

    def emit(text: str) -> None:
        out.write(shown(text, secrets))
        out.flush()

    whole = last_n is None and log_filter is None
    with LogFile(source.log_path, follow_from="start" if whole else "end") as log:
        if log_filter is not None:
            # The lines before the follow point, scanned (a plain substring only decodes its hits).
            boundary = log.delivered_offset
            kept: deque | list = deque(maxlen=last_n) if last_n is not None else []
            for line in log.iter_filtered(log_filter):
                if line.offset >= boundary:
                    break
                if last_n is None:
                    emit(as_printed(line) + "\n")
                    printed = True
                else:
                    kept.append(line)
            if kept:
                emit("".join(as_printed(line) + "\n" for line in kept))
                printed = True
        elif last_n:
            tail = log.tail_lines(last_n)
            if tail:
                emit("".join(as_printed(line) + "\n" for line in tail))
                printed = True
        ended = False
        while True:
            result = log.poll()
            if result.truncated or result.rotated:
                what = "truncated" if result.truncated else "rotated"
                print(f"({source.log_path} was {what}; reading it from the top)", file=sys.stderr)
            lines = [x for x in result.lines if log_filter is None or log_filter.matches(x)]
            if lines:
                prefix = "\r" if shown_partial else ""
                shown_partial = ""
                emit(prefix + "".join(as_printed(line) + "\n" for line in lines))
                printed = True
            if result.more:
                continue
            if not follow or ended:
                break
            if tty and log_filter is None and result.partial and result.partial != shown_partial:
                emit("\r" + result.partial)
                shown_partial = result.partial
            # One more poll after the server is gone drains what it wrote last.
            ended = not source.is_alive()
            if not ended and not tty and _reader_gone(out):
                break  # nobody reads any more (`logs -f --host` ended: sshd closed our stdout): don't linger
            if not ended:
                time.sleep(0.2)
        partial = log.partial_line() if log_filter is None else None
        if partial and partial != shown_partial:
            emit(("\r" if shown_partial else "") + partial)
            printed = True
    return printed


def _reader_gone(out) -> bool:
    """The other end of ``out`` (a pipe or a socket) was closed: poll reports POLLERR/POLLHUP on it.  A
    follower on another host would otherwise wait on an idle log for ever after its ssh went away, since
    it learns of the closed pipe only at its next write."""
    import select

    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLERR | select.POLLHUP)
    return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poller.poll(0))


def _profile_error_text(name: str, exc: Exception) -> str:
    problems = getattr(exc, "problems", None) or []
    if not problems:
        return f"profile '{name}': {exc}"
    lines = [f"profile '{name}' has {len(problems)} problem(s):"]
    for p in problems:
        where = f" (line {p.line})" if getattr(p, "line", None) else ""
        lines.append(f"  {p.field}{where}: {p.message}")
    return "\n".join(lines)


def _confirmed(command: str, alternative: str, question: str, declined: str) -> bool:
    """The y/N question of a command without ``--yes``: refused when stdin is no terminal (a script must say
    --yes), else asked on stderr; False (after saying ``declined``) unless the answer is y."""
    from app.cli import EXIT_BAD_INPUT, CliError

    if not sys.stdin.isatty():
        more = f" {alternative}" if alternative else ""
        raise CliError(f"{command} needs --yes when stdin is not a terminal{more}", EXIT_BAD_INPUT)
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() in ("y", "yes"):
        return True
    print(declined, file=sys.stderr)
    return False
