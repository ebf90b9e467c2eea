"""`python -m sandbox judge`: judge programs from a JSONL file, for people and scripts."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from pydantic import ValidationError

from sandbox.judge import SyncJudge
from sandbox.models import JudgeRequest, Limits, SandboxConfig, Verdict
from sandbox.pool import SandboxUnavailable

DESCRIPTION = """\
Judge Python programs against tests in a sandbox.

Input rows (JSONL):  {"id": str, "code": str,
                      "tests": {"inputs": [str], "outputs": [str], "fn_name": str|null}}
Output rows (JSONL, input order):
                     {"id", "passed": [bool per test], "pass_rate", "status",
                      "feedback": [str per test], "seconds", "outcomes": [status per test]}
A malformed row (not UTF-8, not JSON, a missing or mistyped field) gives an output row with
status "invalid_request" and an "error" that names the line and the field; it never stops the run. Results are written to OUTPUT.partial as they complete and moved
to OUTPUT at the end; --resume continues from OUTPUT.partial after a crash.

When a sandbox server runs (`python -m sandbox serve`), programs go to its warm workers and
--concurrency is the server's; otherwise this process starts workers of its own, while it reads
the input.
"""

SERVE_DESCRIPTION = """\
Keep sandbox workers warm for every judge of this user on this machine: `python -m sandbox judge`,
the pipeline's stages and scripts (anything that builds a SyncJudge) send their programs here
instead of starting workers of their own, whenever this server answers on its socket.

The socket: --socket, else env COBALT_SANDBOX_SOCKET, else /tmp/cobalt-sandbox-<uid>/sandbox.sock
(mode 0600 in a 0700 directory; only this user, or root, may connect). Clients that set
COBALT_SANDBOX_SOCKET=off, --no-server or SandboxConfig(use_server=False) never use it. Stop it
with Ctrl-C, SIGTERM or --stop.

The server decides how programs are judged, from its own settings below (the backend, the image:
env COBALT_SANDBOX_IMAGE, the limits; the namespace backend's cgroup: env COBALT_SANDBOX_CGROUP);
a client only asks for judging. A client whose own settings differ (another backend, image or
limits) judges with workers of its own, so verdicts are the same either way. --concurrency
workers are started at once; at most that many programs run at once in all.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    judge = sub.add_parser(
        "judge",
        help="judge programs from a JSONL file",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    judge.add_argument("--input", "-i", required=True, help="programs JSONL ('-' for stdin)")
    judge.add_argument("--output", "-o", required=True, help="verdicts JSONL ('-' for stdout)")
    judge.add_argument(
        "--backend",
        choices=["auto", "docker", "namespace"],
        default="auto",
        help="isolation: docker (default where an engine is reachable) or "
        "namespace (Linux namespaces + rlimits)",
    )
    judge.add_argument(
        "--concurrency",
        "-j",
        type=int,
        default=os.cpu_count() or 1,
        help="programs judged at once (default: CPU count)",
    )
    add_limit_args(judge)
    judge.add_argument(
        "--fail-fast",
        action="store_true",
        help="skip a program's remaining tests after its first failure",
    )
    judge.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of OUTPUT.partial from an interrupted run",
    )
    judge.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    server = judge.add_mutually_exclusive_group()
    server.add_argument(
        "--server",
        metavar="ADDRESS",
        help="judge through the sandbox server at ADDRESS (unix:/path) when it answers "
        "(default: env COBALT_SANDBOX_SOCKET, else the per-user socket)",
    )
    server.add_argument(
        "--no-server",
        action="store_true",
        help="always judge with workers of this process, even if a sandbox server runs",
    )

    serve = sub.add_parser(
        "serve",
        help="keep sandbox workers warm for every judge of this user (a local server)",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--socket", metavar="ADDRESS", help="where to listen (unix:/path)")
    serve.add_argument(
        "--backend",
        choices=["auto", "docker", "namespace"],
        default="auto",
        help="isolation: docker (default where an engine is reachable) or namespace",
    )
    serve.add_argument(
        "--concurrency",
        "-j",
        type=int,
        default=os.cpu_count() or 1,
        help="workers per pool, and programs judged at once in all (default: CPU count)",
    )
    add_limit_args(serve)
    serve.add_argument(
        "--max-processes",
        type=int,
        default=Limits().max_processes,
        help=f"processes and threads a test may have at once (default {Limits().max_processes})",
    )
    control = serve.add_mutually_exclusive_group()
    control.add_argument("--status", action="store_true", help="print a running server's status")
    control.add_argument("--stop", action="store_true", help="stop a running server")
    return parser


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    """The per-test limits both `judge` and `serve` take: --timeout, --suite-timeout,
    --memory-mb (defaults: `Limits()`)."""
    d = Limits()
    parser.add_argument(
        "--timeout",
        type=float,
        default=d.timeout_s,
        help=f"seconds per test, wall and CPU (default {d.timeout_s:g})",
    )
    parser.add_argument(
        "--suite-timeout",
        type=float,
        default=d.suite_timeout_s,
        help=f"seconds for all tests of a program (default {d.suite_timeout_s:g})",
    )
    parser.add_argument(
        "--memory-mb",
        type=int,
        default=d.memory_mb,
        help=f"memory per test process (default {d.memory_mb})",
    )


def open_input(path: str) -> BinaryIO:
    """The input's bytes ('-': stdin); OSError for a file that is missing or unreadable."""
    return sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115


def read_rows(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of each non-blank line, as bytes: a line that is not UTF-8 becomes
    its row's verdict (`parse_row`), not the end of the run."""
    with stream:
        for number, line in enumerate(stream, 1):
            if line.strip():
                yield number, line


def parse_row(number: int, line: bytes | str) -> JudgeRequest | Verdict:
    """A request, or an `invalid_request` verdict that names the line and the field."""
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
    except UnicodeDecodeError as e:
        byte = f"0x{line[e.start]:02x}"
        return _invalid(
            f"line-{number}", f"line {number}: not UTF-8 (byte {byte} at column {e.start + 1})"
        )
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        at = e.msg if e.msg.endswith(" at") else f"{e.msg} at"
        return _invalid(f"line-{number}", f"line {number}: not JSON ({at} column {e.colno})")
    except RecursionError:
        return _invalid(f"line-{number}", f"line {number}: not readable (JSON nested too deeply)")
    row_id = str(raw.get("id", f"line-{number}")) if isinstance(raw, dict) else f"line-{number}"
    try:
        return JudgeRequest.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'row'}: {err['msg']}" for err in e.errors()
        )
        return _invalid(row_id, f"line {number}: {problems}")


def _invalid(row_id: str, message: str) -> Verdict:
    return Verdict(
        id=row_id,
        passed=[],
        pass_rate=0.0,
        status="invalid_request",
        feedback=[message],
        seconds=0.0,
        error=message,
    )


class OrderedWriter:
    """Writes verdicts in input order as soon as each one's predecessors are done."""

    def __init__(self, stream, skip: int = 0):
        self.stream = stream
        self.next = skip
        self.pending: dict[int, Verdict] = {}

    def put(self, index: int, verdict: Verdict) -> None:
        self.pending[index] = verdict
        while self.next in self.pending:
            self.stream.write(self.pending.pop(self.next).model_dump_json() + "\n")
            self.next += 1
        self.stream.flush()


def judge_command(args: argparse.Namespace) -> int:
    try:
        limits = Limits(
            timeout_s=args.timeout, suite_timeout_s=args.suite_timeout, memory_mb=args.memory_mb
        )
        config = SandboxConfig(
            backend=args.backend,
            concurrency=args.concurrency,
            limits=limits,
            use_server=not args.no_server,
            server=args.server,
        )
    except ValidationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:  # a file that cannot be read or written: one line, before any worker starts
        stream = open_input(args.input)
    except OSError as e:
        print(f"error: --input {args.input}: {e.strerror or e}", file=sys.stderr)
        return 2
    partial = None if args.output == "-" else Path(args.output + ".partial")
    done = _count_complete_rows(partial) if args.resume and partial and partial.exists() else 0
    mode = "a" if done else "w"
    try:
        out = open(partial, mode, encoding="utf-8") if partial else sys.stdout  # noqa: SIM115
    except OSError as e:
        stream.close()
        print(f"error: --output {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    judge = SyncJudge(config).start()  # workers come up while the input is read
    try:
        return _judge_rows(args, judge, stream, out, done)
    finally:
        judge.close()


def _judge_rows(
    args: argparse.Namespace, judge: SyncJudge, stream: BinaryIO, out: TextIO, done: int
) -> int:
    rows = [parse_row(n, line) for n, line in read_rows(stream)]
    writer = OrderedWriter(out, skip=done)
    todo = [(i, r) for i, r in enumerate(rows) if i >= done]
    invalid = [(i, r) for i, r in todo if isinstance(r, Verdict)]
    requests = [(i, r) for i, r in todo if isinstance(r, JudgeRequest)]
    bar = _progress(len(todo), args.quiet)
    start = time.perf_counter()
    try:
        for i, verdict in invalid:
            writer.put(i, verdict)
            bar.update(1)
        if requests:
            with judge:
                where = f", server {judge.server}" if judge.server else ""
                bar.set_description(f"judging ({judge.backend_name}{where})")

                def on_done(k: int, verdict: Verdict) -> None:
                    writer.put(requests[k][0], verdict)
                    bar.update(1)

                judge.judge_many(
                    [r for _, r in requests], fail_fast=args.fail_fast, on_done=on_done
                )
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    finally:
        bar.close()
        if out is not sys.stdout:
            out.close()
    if out is not sys.stdout:
        os.replace(out.name, args.output)
    elapsed = time.perf_counter() - start
    n_tests = sum(len(r.tests.inputs) for _, r in requests)
    print(
        f"judged {len(requests)} programs ({n_tests} tests, {len(invalid)} invalid rows) "
        f"in {elapsed:.1f}s",
        file=sys.stderr,
    )
    return 0


def _count_complete_rows(path: Path) -> int:
    """Rows of a partial output that are whole JSON lines; a torn last line is dropped."""
    good = b""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                json.loads(line)
            except json.JSONDecodeError:
                break
            good += line
    with open(path, "wb") as f:
        f.write(good)
    return good.count(b"\n")


def _progress(total: int, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="prog", disable=quiet, file=sys.stderr, desc="judging")


def serve_command(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from sandbox import client, server, transport

    address = args.socket or transport.default_address()
    if address is None:
        print(
            "error: no socket: COBALT_SANDBOX_SOCKET is 'off' and --socket is not given",
            file=sys.stderr,
        )
        return 2
    if args.status or args.stop:
        message = {"op": "status"} if args.status else {"op": "shutdown"}
        try:
            reply = asyncio.run(client.request(address, message))
        except (OSError, TimeoutError, ValueError) as e:
            print(f"error: no sandbox server answers on {address}: {e}", file=sys.stderr)
            return 1
        print(json.dumps(reply.get("status", reply), indent=1))
        return 0
    try:
        config = SandboxConfig(
            backend=args.backend,
            concurrency=args.concurrency,
            limits=Limits(
                timeout_s=args.timeout,
                suite_timeout_s=args.suite_timeout,
                memory_mb=args.memory_mb,
                max_processes=args.max_processes,
            ),
        )
    except ValidationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        asyncio.run(
            server.serve(
                address, config, announce=lambda text: print(text, file=sys.stderr, flush=True)
            )
        )
    except (SandboxUnavailable, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "judge":
        return judge_command(args)
    if args.command == "serve":
        return serve_command(args)
    return 2  # pragma: no cover - argparse requires a command
