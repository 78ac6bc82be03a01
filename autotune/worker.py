"""Worker: candidates run in a child process that owns its own GPU device.

A shader that never finishes, a driver that aborts the process, or a lost device then
costs one trial, not the tuning run: the tuner waits for each answer with a deadline,
kills and restarts the worker when it is late (`timeout`), restarts it when it died
(`crashed`), and when the worker reports its device lost (`device-lost`).

    tuner (Worker)                                  worker (autotune.worker.main)
    prepare(problem, seed, checks) ── setup ──────► the tuner's adapter (by its index and
                                                     fingerprint); Reference(problem, seed)
                                   ◄─ ready ───────  (inputs + float64 product, once)
    evaluate(config, ...)          ── evaluate ───► evaluate.evaluate: render, compile,
                                   ◄─ Outcome ─────  verify, time
    compile_ahead(next config)     ── compile ────► compile_shader in a thread, while
                                                     the current candidate is timed
    retime(finalists)              ── retime ─────► evaluate.retime: the fastest, timed
                                   ◄─ Outcome ─────  again back to back

The worker is long-lived: it is started once, builds the verification reference once
per problem, and answers each candidate over a socket pair (pickled small dataclasses,
between two processes of ours). It is a plain subprocess rather than a multiprocessing
child so that a user's script without an `if __name__ == "__main__"` guard still works.
It ignores Ctrl-C (the tuner stops it) and exits when the tuner goes away.

The Worker is the default Evaluator (autotune.evaluate). Its child runs `main` of the
module `Worker.child` names, which serves with `evaluate.evaluate` unless it hands
`serve` another function: the seam through which the tests plant faults (tests/faulty).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection

from .evaluate import Outcome, evaluate, retime
from .problem import Problem
from .space import Config

STARTUP_S = 600.0  # importing, opening the device and the float64 reference of a big problem
CANDIDATE_S = 60.0  # default deadline of one candidate (compile, verify, time)
# (-c rather than -m: the package imports this module first)
_ENTRY = "import sys; from {module} import main; sys.exit(main(sys.argv[1:]))"
# A trivial shader: compiling it fails only when the device is gone.
_PROBE = "@compute @workgroup_size(1) fn main() {}"


class WorkerError(RuntimeError):
    """The worker could not be started (no adapter, another device, a broken install)."""


class Worker:
    """The tuner's handle on one worker process; restarts it as needed. An Evaluator."""

    child = "autotune.worker"  # the module whose main(argv) the worker process runs

    def __init__(
        self,
        fingerprint: dict | None = None,
        startup_s: float = STARTUP_S,
        candidate_timeout: float = CANDIDATE_S,
        features: tuple[str, ...] | None = None,
        index: int | None = None,
    ):
        self.expected_fingerprint = fingerprint  # the tuner's device: the worker must match
        self.index = index  # the adapter's in device.list_adapters() (None: the first match)
        self.features = features  # the tuner's device's (None: the adapter's)
        self.startup_s = startup_s
        self.candidate_timeout = candidate_timeout  # a candidate's deadline (compile to time)
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None
        self.setup: tuple | None = None  # (problem, seed, checks) the worker should hold
        self.ready_for: tuple | None = None  # what the running worker holds
        self.starts = 0
        self._log = None
        self.abandoned = False  # abandon(): the tune is stopping, no new worker is started
        self._starting = threading.Lock()  # a start and abandon() one at a time

    # --- lifecycle ----------------------------------------------------------------------

    @classmethod
    def for_gpu(cls, gpu, candidate_timeout: float = CANDIDATE_S, index=None) -> Worker:
        """A worker measuring as `gpu` does: its adapter (by fingerprint, and `index`, by
        default gpu's own) and its device's kernel features."""
        return cls(
            gpu.fingerprint.as_dict(),
            candidate_timeout=candidate_timeout,
            features=tuple(sorted(gpu.kernel_features)),
            index=getattr(gpu, "index", None) if index is None else index,
        )

    def prepare(self, problem: Problem, seed: int, checks: bool) -> None:
        """Make the worker hold this problem's reference (started now, not at first use)."""
        self.setup = (problem, int(seed), bool(checks))
        self._ensure()

    def prepared_for(self, problem: Problem, checks: bool) -> bool:
        return self.setup is not None and self.setup[::2] == (problem, bool(checks))

    def abandon(self) -> None:
        """Kill the worker, from any thread, and start no other: the tune is stopping
        (Ctrl-C, or a failure elsewhere). The thread waiting for its answer gets it at
        once (`crashed`); the next evaluate or prepare raises WorkerError."""
        with self._starting:
            self.abandoned = True
            process = self.process  # (its own thread may forget it meanwhile)
            if process is not None and process.poll() is None:
                process.kill()

    def _ensure(self) -> None:
        if self.abandoned:
            raise WorkerError("the tune was interrupted: no worker is started again")
        if self.process is not None and self.process.poll() is not None:
            self._stop()  # it died between candidates
        if self.process is None:
            self._start()
        if self.ready_for != self.setup:
            try:
                device = (self.expected_fingerprint, self.features, self.index)
                self.connection.send(("setup", *self.setup, *device))
            except OSError:
                pass  # it died at start: _answer sees that
            answer = self._answer(self.startup_s)
            if answer is None or answer[0] != "ready":
                detail = (
                    answer[1]
                    if answer and answer[0] == "error"
                    else (self._death() if answer else f"no answer within {self.startup_s:g} s")
                )
                self._stop()
                raise WorkerError(f"the worker could not prepare {self.setup[0]}: {detail}")
            if self.expected_fingerprint and answer[1] != self.expected_fingerprint:
                self._stop()
                raise WorkerError(
                    f"the worker opened another adapter ({answer[1].get('device')}) than the "
                    f"tuner ({self.expected_fingerprint.get('device')})"
                )
            self.ready_for = self.setup

    def _start(self) -> None:
        with self._starting:
            if self.abandoned:
                raise WorkerError("the tune was interrupted: no worker is started again")
            self._spawn()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        self._log = tempfile.TemporaryFile()  # its stderr, quoted when it dies
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _ENTRY.format(module=self.child), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
            )
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())
        self.ready_for = None
        self.starts += 1

    def _stop(self) -> None:
        """Kill the worker (if alive) and forget it; the next candidate starts another."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        if self.connection is not None:
            self.connection.close()
        if self._log is not None:
            self._log.close()
        self.process, self.connection, self.ready_for, self._log = None, None, None, None

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within a few seconds."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.connection.send(("exit",))
                self.process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self.close()
        else:  # interrupted (Ctrl-C) or failing: do not wait for the worker's candidate
            self._stop()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # --- one candidate ------------------------------------------------------------------

    def evaluate(self, config: Config, *, max_dispatch_s: float | None = None) -> Outcome:
        """Render, compile, verify and time `config` in the worker: an Outcome, always.

        No answer within `candidate_timeout` kills the worker (reason `timeout`); a
        worker that dies is `crashed`; one that lost its device says so (`device-lost`)
        and exits. The next candidate gets a fresh worker.
        """
        timeout_s = self.candidate_timeout
        self._ensure()
        try:
            self.connection.send(("evaluate", config, max_dispatch_s))
        except OSError:
            pass  # it died just now: _answer sees that
        answer = self._answer(timeout_s)
        if answer is None:
            self._stop()
            return Outcome(
                config,
                reason="timeout",
                detail=f"no answer within {timeout_s:g} s: the worker was killed and restarted",
            )
        if answer[0] == "dead":
            detail = self._death()
            self._stop()
            return Outcome(config, reason="crashed", detail=detail)
        outcome = answer[1]
        if outcome.reason == "device-lost":
            self._stop()  # it exits by itself; the next candidate opens a new device
        return outcome

    def compile_ahead(self, config: Config) -> None:
        """Let the worker start compiling `config` (in a thread) while it works on the
        current candidate; a later evaluate(config) uses that compile. No answer: if the
        worker dies meanwhile, evaluate compiles anew in the next one."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.connection.send(("compile", config))
        except OSError:
            pass  # it died just now: the next evaluate sees that

    def retime(self, configs: list[Config]) -> Outcome | None:
        """evaluate.retime in the worker: the fastest of `configs` timed again, or None
        (also when the worker fails meanwhile: the search's own timings then stand)."""
        self._ensure()
        try:
            self.connection.send(("retime", list(configs)))
        except OSError:
            pass
        answer = self._answer(self.candidate_timeout * len(configs))
        if answer is None or answer[0] != "outcome":
            self._stop()
            return None
        return answer[1]

    def _answer(self, timeout_s: float):
        """The worker's next message; ("dead",) if it died; None if silent for timeout_s."""
        try:
            if not self.connection.poll(timeout_s):
                return None
            return self.connection.recv()
        except (EOFError, OSError):
            return ("dead",)

    def _death(self) -> str:
        """How the worker ended (exit code or signal) and the end of what it printed."""
        try:
            code = self.process.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        self._log.seek(0)
        tail = self._log.read()[-400:].decode(errors="replace").strip()
        return f"worker died ({how})" + (f": {tail}" if tail else "")


# --- the worker process -------------------------------------------------------------------


def _watch_parent() -> None:
    """Exit when the tuner is gone (killed with SIGKILL, say), even mid-candidate."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _device_lost(gpu) -> bool:
    try:
        gpu.device.create_shader_module(code=_PROBE)
    except Exception:
        return True
    return False


def _render_and_compile(config: Config, problem: Problem, gpu, checks: bool):
    from .compile import compile_shader
    from .render import render

    return compile_shader(render(config, problem), gpu, checks=checks)


def serve(connection: Connection, evaluate=evaluate) -> int:
    """Answer the tuner's messages until it says exit or goes away; candidates are
    measured with `evaluate` (evaluate.evaluate's signature)."""
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from .device import gpu_matching
    from .verify import Reference

    gpu = problem = reference = checks = None
    compiler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="compile")
    compiling = {}  # config text -> Future of its compile, started by a "compile" message
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return 0
        kind = message[0]
        if kind == "exit":
            return 0
        if kind == "setup":
            _, problem, seed, checks, fingerprint, features, index = message
            compiling.clear()
            try:  # the tuner's adapter (one of identical GPUs: by index) and features
                gpu = gpu_matching(fingerprint, features, index)
                reference = Reference(problem, seed)
            except Exception as error:
                connection.send(("error", f"{type(error).__name__}: {error}"))
                return 1
            connection.send(("ready", gpu.fingerprint.as_dict()))
        elif kind == "compile":
            config = message[1]
            if str(config) not in compiling:
                compiling[str(config)] = compiler.submit(
                    _render_and_compile, config, problem, gpu, checks
                )
        elif kind == "evaluate":
            _, config, max_dispatch_s = message
            outcome = evaluate(
                config,
                problem,
                gpu,
                checks=checks,
                max_dispatch_s=max_dispatch_s,
                reference=reference,
                compiling=compiling.pop(str(config), None),
            )
            if not outcome.ok and _device_lost(gpu):
                # Whatever the candidate seemed to do, the device is gone: say so and exit,
                # so that the tuner's next candidate gets a fresh process and device.
                detail = f"the device was lost ({outcome.reason}: {outcome.detail})"[:500]
                connection.send(("outcome", replace(outcome, reason="device-lost", detail=detail)))
                return 3
            connection.send(("outcome", outcome))
        elif kind == "retime":
            connection.send(("outcome", retime(message[1], problem, gpu, checks, reference)))


def main(argv: list[str], evaluate=evaluate) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the tuner, which stops us
    _watch_parent()
    return serve(Connection(int(argv[0])), evaluate)
