"""Inside the detached regeneration process: ``python -m sessions.regeneration.runner --job-dir DIR``.

    input rows (not yet written) ─▶ one shared queue ─▶ ``window`` worker threads per server
        each worker: replay the row's user turns in order through /v1/chat/completions, appending each
        regenerated answer before the next turn ─▶ one whole row to <out>.jsonl / _error / _skipped

The process is started, paused, cancelled and watched with the extraction job's machinery
(`sessions.extraction.job`: spawn, control.json, progress.json, pid + create time), composed here, not
inherited.  SIGTERM stops taking rows, lets the conversations in flight finish and exits ``cancelled``; a
SIGKILL loses only the conversations in flight, which the resume redoes (`output.OutputFiles`).  At the end
``success + error + skipped == input`` is checked; a job that does not add up ends ``failed``.
"""
from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from sessions import server_answers
from sessions.extraction.job import CONTROL_FILE, SPEC_FILE, update_progress
from sessions.extraction.progress import RateMeter
from sessions.home import read_json
from sessions.regeneration.output import OutputFiles
from sessions.regeneration.rows import (
    InputRow,
    has_think_marker,
    input_problem,
    messages_of,
    output_problem,
    output_row,
    read_rows,
)
from sessions.regeneration.spec import RegenSpec, load_regen_spec
from sessions.regeneration.stats import RegenStats, RowStats

REPORT_INTERVAL_S = 0.5
SERVERS_FILE = "servers.json"  # the resolved server URLs (sessions are looked up when the job is created)


# The size cap of one chat answer: its JSON around the text, plus a generous size per token asked for
# (a token is a few bytes of text; JSON escapes can make one up to 12, reasoning text comes on top).
ANSWER_BASE_BYTES = 1 << 20
ANSWER_BYTES_PER_TOKEN = 64

class RowFailed(Exception):
    """The server refused or kept failing a turn: the row goes to ``_error.jsonl`` with this message."""


class RegenRun:
    def __init__(self, job_dir: Path, resume: bool) -> None:
        self.job_dir = job_dir
        self.resume = resume
        self.spec: RegenSpec = load_regen_spec(job_dir / SPEC_FILE)
        self.servers: list[str] = list((read_json(job_dir / SERVERS_FILE, default={}) or {}).get("servers")
                                       or self.spec.servers)
        self.files = OutputFiles(self.spec.output, self.spec.error_path, self.spec.skipped_path)
        self.stats = RegenStats(job_dir)
        self.stop = threading.Event()  # no new rows (cancel)
        self.paused = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.total = 0
        self.model = self.spec.model
        self.meter = RateMeter()
        self.log_lock = threading.Lock()

    def log(self, text: str) -> None:
        with self.log_lock:
            print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}", flush=True)

    # -- the server side -------------------------------------------------------------------------------

    def _model_name(self, url: str) -> str:
        reply = server_answers.fetch(f"{url}/v1/models", deadline_s=30.0)
        if reply.error is not None or reply.status != 200:
            raise ValueError(reply.error or f"HTTP {reply.status}")
        return str(answer_json(reply.body)["data"][0]["id"])

    def _probe(self) -> None:
        """Every server must answer /v1/models (and give the model name when the spec has none)."""
        alive = []
        for url in self.servers:
            try:
                name = self._model_name(url)
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                self.log(f"server {url} does not answer /v1/models ({exc}); leaving it out")
                continue
            self.model = self.model or name
            alive.append(url)
        if not alive:
            raise RowFailed("no server answers /v1/models: " + ", ".join(self.servers))
        self.servers = alive

    def _body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        spec = self.spec
        messages = [{k: v for k, v in m.items() if not (k == "reasoning_content" and m["role"] == "assistant")}
                    for m in history]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": spec.max_tokens,
                                "temperature": spec.temperature, "stream": False}
        if spec.top_p is not None:
            body["top_p"] = spec.top_p
        if spec.top_k is not None:
            body["top_k"] = spec.top_k
        if spec.seed is not None:
            body["seed"] = spec.seed
        if spec.reasoning == "disable":
            body["chat_template_kwargs"] = {"enable_thinking": False}
        elif spec.reasoning == "save":
            body["chat_template_kwargs"] = {"enable_thinking": True}
        return body

    def _turn(self, url: str, history: list[dict[str, Any]]) -> dict[str, Any]:
        """One answer; retried on a transport error or a 5xx, a 4xx fails the row at once.  Read through the
        one bounded reader (`sessions.server_answers`): a total deadline of the spec's request timeout and a
        size cap from the tokens asked for, so a trickling or flooding server fails the attempt."""
        attempt = 0
        cap = ANSWER_BASE_BYTES + ANSWER_BYTES_PER_TOKEN * self.spec.max_tokens
        while True:
            body = json.dumps(self._body(history)).encode()
            reply = server_answers.fetch(f"{url}/v1/chat/completions", method="POST", body=body,
                                         headers={"content-type": "application/json"},
                                         deadline_s=self.spec.request_timeout_s, max_bytes=cap)
            text = reply.body[:300].decode("utf-8", errors="replace")
            try:
                if reply.error is not None:
                    raise ValueError(reply.error)
                assert reply.status is not None
                if reply.status < 500:
                    data = answer_json(reply.body)
                    if reply.status != 200:
                        message = data.get("message") if isinstance(data, dict) else None
                        if message is None and isinstance(data, dict) and isinstance(data.get("error"), dict):
                            message = data["error"].get("message")
                        raise RowFailed(f"HTTP {reply.status} from {url}: {message or text}")
                    if not isinstance(data, dict):
                        raise ValueError(f"the answer is {server_answers.kind_of(data)}, not an object")
                    return dict(data)
                problem = f"HTTP {reply.status} from {url}: {text}"
            except ValueError as exc:
                problem = f"{type(exc).__name__} from {url}: {exc}"
            attempt += 1
            if attempt > self.spec.max_retries:
                raise RowFailed(f"{problem} (after {attempt} attempts)")
            time.sleep(min(30.0, self.spec.retry_backoff_s * 2 ** (attempt - 1)))

    # -- one row -------------------------------------------------------------------------------------

    def _regenerate(self, url: str, row: InputRow) -> tuple[str, dict[str, Any], RowStats]:
        stats = RowStats(row.row_id, "skipped", url)
        if row.data is None:
            return "skipped", output_row(row, "skipped"), stats
        key, messages = messages_of(row.data, self.spec.dataset_format)
        problem = input_problem(messages)
        if problem:
            return "skipped", output_row(row, "skipped", error=problem, source_key=key), stats
        history: list[dict[str, Any]] = []
        for message in messages:
            role = message["role"]
            if role == "assistant":
                stats.before_chars.append(len(message["content"]))
                continue  # replaced by the target's own answer to the same history
            history.append({"role": role, "content": message["content"]})
            if role != "user":
                continue
            try:
                reply = self._turn(url, history)
                choice = reply["choices"][0]
                answer = choice.get("message") or {}
                content = answer.get("content") or ""
                thought = answer.get("reasoning_content")
                finish = str(choice.get("finish_reason"))
                tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
            except RowFailed as exc:
                stats.status = "error"
                return "error", output_row(row, "error", error=str(exc), source_key=key), stats
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                stats.status = "error"
                return "error", output_row(row, "error", error=f"unexpected reply from {url}: {exc!r}",
                                           source_key=key), stats
            stats.finish[finish] = stats.finish.get(finish, 0) + 1
            stats.after_tokens += tokens
            stats.after_chars.append(len(content))
            why = None
            if not content.strip():
                stats.empty += 1
            thought = thought if isinstance(thought, str) else None
            if self.spec.reasoning == "save" and (not content.strip() or not (thought or "").strip()):
                # SpecForge's regenerate_train_data.py --reasoning save: such a row is an error, not skipped.
                stats.status = "error"
                return "error", output_row(row, "error", error="Reasoning generation requires non-empty assistant "
                                           "content and reasoning_content", source_key=key), stats
            if self.spec.reasoning == "save" and (has_think_marker(content) or has_think_marker(thought or "")):
                why = "Reasoning response contains a residual thinking marker"
            elif self.spec.reasoning == "disable" and (not content.strip() or has_think_marker(content)):
                why = "Non-reasoning assistant response is empty or contains a thinking marker"
            elif not content.strip():
                why = "empty assistant answer"
            elif has_think_marker(content):
                why = "assistant answer contains a thinking marker"
            elif finish == "length" and self.spec.on_length == "skip":
                why = f"answer cut at max_tokens={self.spec.max_tokens}"
            if why:
                return "skipped", output_row(row, "skipped", error=why, source_key=key), stats
            new = {"role": "assistant", "content": content}
            if self.spec.reasoning == "save":
                new["reasoning_content"] = thought  # kept as the server split it (SpecForge's resp_msg)
            history.append(new)
        out = output_row(row, "success", conversations=history, source_key=key)
        problem = output_problem(out, self.spec.reasoning)
        if problem:  # never write a success row SpecForge's validation would refuse
            out = output_row(row, "skipped", error=f"fails SpecForge validation: {problem}", source_key=key)
            return "skipped", out, stats
        stats.status = "success"
        return "success", out, stats

    def _worker(self, url: str, rows: queue.Queue) -> None:
        while not self.stop.is_set():
            while self.paused.is_set() and not self.stop.is_set():
                time.sleep(0.1)
            try:
                row = rows.get_nowait()
            except queue.Empty:
                return
            if self.stop.is_set():
                return
            with self.lock:
                self.in_flight += 1
            try:
                status, out, stats = self._regenerate(url, row)
                with self.lock:
                    self.files.write(status, out)  # the whole conversation, in one write
                self.stats.record(stats)
            except Exception:  # noqa: BLE001 - a bug on one row must not lose the others
                self.log(f"row {row.row_id} (line {row.line}): {traceback.format_exc()}")
                with self.lock:
                    self.files.write("error", output_row(row, "error", error="internal error; see job.log"))
            finally:
                with self.lock:
                    self.in_flight -= 1

    # -- the job -------------------------------------------------------------------------------------

    def _progress(self, state: str, **extra: Any) -> None:
        counts = self.files.counts
        done = self.files.total()
        rows_s, tokens_s, _ = self.meter.rates()
        left = self.total - done
        fields: dict[str, Any] = {
            "state": state, "mode": "regenerate", "total": self.total, "done": done, "ok": counts["success"],
            "skipped": counts["skipped"], "failed_lines": counts["error"], "tokens": self.stats.tokens,
            "samples_per_s": rows_s, "tokens_per_s": tokens_s,
            "eta_s": (left / rows_s) if rows_s > 0 and left > 0 else None, "in_flight": self.in_flight,
            "output_dir": str(self.spec.output), "dataset": str(self.spec.dataset),
            "server_url": self.servers[0] if self.servers else None, "stats": self.stats.snapshot(),
            "last_progress_at": time.time()}
        fields.update(extra)
        update_progress(self.job_dir, **fields)

    def _read_control(self) -> None:
        control = read_json(self.job_dir / CONTROL_FILE, default={}) or {}
        if control.get("cancel"):
            self.stop.set()
        if control.get("pause"):
            self.paused.set()
        else:
            self.paused.clear()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: self.stop.set())
        try:
            self.files.open_for_append(self.resume)
            self.stats.load(set(self.files.done_ids))
            self.stats.open_for_append()
            todo: queue.Queue = queue.Queue()
            for row in read_rows(self.spec.dataset, self.spec.num_samples):
                self.total += 1
                if row.row_id not in self.files.done_ids:
                    todo.put(row)
            self.log(f"{'resuming' if self.resume else 'starting'}: {self.total} input rows, "
                     f"{self.files.total()} already written, {todo.qsize()} to do")
            self._probe()
            self.log(f"model {self.model!r} on {len(self.servers)} server(s): {', '.join(self.servers)}")
            self.meter.start(self.files.total(), self.stats.tokens, 0)
            workers = [threading.Thread(target=self._worker, args=(url, todo), name=f"regen-{n}", daemon=True)
                       for url in self.servers for n in range(self.spec.window)]
            self._progress("running", reason=None)
            for worker in workers:
                worker.start()
            while any(w.is_alive() for w in workers):
                self._read_control()
                self.meter.add(self.files.total(), self.stats.tokens, 0)
                self._progress("paused" if self.paused.is_set() else "running",
                               paused_by_user=self.paused.is_set())
                for worker in workers:
                    worker.join(timeout=REPORT_INTERVAL_S / max(1, len(workers)))
            self.files.sync()
            done = self.files.total()
            if self.stop.is_set() and done < self.total:
                self._progress("cancelled", reason="cancelled; `regenerate resume` continues it",
                               finished_at=time.time())
                self.log(f"cancelled with {done}/{self.total} rows written")
                return 0
            if done != self.total:
                reason = f"accounting: success + error + skipped = {done}, input = {self.total}"
                self._progress("failed", reason=reason, finished_at=time.time())
                self.log(reason)
                return 1
            counts = self.files.counts
            self._progress("done", reason=None, finished_at=time.time(), eta_s=None)
            self.log(f"done: {counts['success']} success + {counts['error']} error + {counts['skipped']} skipped "
                     f"= {self.total} input rows")
            from sessions.regeneration.handover import hand_over

            hand_over(self.job_dir, self.log)  # a pipeline's first stage starts its extraction stage
            return 0
        except Exception as exc:  # noqa: BLE001 - the job's own failure: recorded for status, then exit 1
            self.log(traceback.format_exc())
            self._progress("failed", reason=f"{type(exc).__name__}: {exc}", finished_at=time.time())
            return 1
        finally:
            self.files.close()
            self.stats.close()


def answer_json(body: bytes) -> Any:
    """A server's JSON answer read by `sessions.server_answers.parse_json` (adv22: ``reply.json()`` raised
    RecursionError, not the ValueError the retry catches, for a 100,000-deep answer, and took NaN)."""
    from sessions.server_answers import parse_json

    value, why = parse_json(body, expect=None)
    if why is not None:
        raise ValueError(f"the answer {why}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessions.regeneration.runner")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    job_dir = args.job_dir.resolve()
    try:
        run = RegenRun(job_dir, args.resume)
    except Exception as exc:  # noqa: BLE001 - an unreadable spec copy: say so in the progress file
        traceback.print_exc()
        update_progress(job_dir, state="failed", reason=f"{type(exc).__name__}: {exc}", finished_at=time.time())
        return 1
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
