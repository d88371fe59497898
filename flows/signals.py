"""Stopping `igrpo` when told: SIGINT (Ctrl-C) or SIGTERM (`timeout`, systemd, Kubernetes, a Prefect worker).

The first signal unwinds the program from wherever it is: a KeyboardInterrupt from the handlers here, or,
inside a flow, Prefect's TerminationSignal (its SIGTERM bridge, which marks the flow run crashed or, when a
worker cancels it, cancelled). On the way out a phase's atomic writes drop their temp files, its MLflow runs
end KILLED (`pipeline.tracking.ending`) and the run lock is released, so `igrpo run` again resumes.

A second signal exits at once, and so does a cleanup still going `GRACE_S` after the first one (after the save point
of the training step in flight, where one is: a real model's step can outlast the grace): a terminal's
Ctrl-C reaches the whole process group, Prefect's ephemeral server included, and the flow's crash report
then retries against a dead server for a minute. Exiting then loses nothing a resume would need: outputs
are whole or absent, and the manifest records a phase only once it is whole.

A watchdog thread sees every signal through `signal.set_wakeup_fd`, whichever Python handler takes it
(ours, or Prefect's inside a flow), and sets `pipeline.rundir.STOP`: where library code swallowed the signal's
exception, the run stops at the next phase boundary, the phase that ran not recorded.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time

from pipeline.rundir import STEP_CLOCK, STOP

GRACE_S = 20.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopper:
    """The process's stop state: which signal came first, how many our handlers took."""

    def __init__(self, grace_s: float = GRACE_S):
        self.grace_s = grace_s
        self.signum: int | None = None  # the first stop signal, seen by any handler
        self.handled = 0  # stop signals our handlers took (Prefect's bridge takes SIGTERM inside a flow)
        self.tidy: list = []  # what a hard exit still does (`at_hard_exit`)
        self.lost = threading.Event()  # the stop exception was swallowed (raised inside a weakref callback)
        self.previous_hook = sys.unraisablehook
        self._done = threading.Event()

    def unraisable(self, hook_args) -> None:
        """`sys.unraisablehook`: a signal's exception raised while Python ran a weakref callback or a `__del__`
        is printed and dropped there, and the program runs on; send the signal again, to land in the program.
        Prefect's SIGTERM bridge raises before the watchdog has seen the signal: its TerminationSignal names it."""
        signum = self.signum or getattr(hook_args.exc_value, "signal", None)
        if signum and not issubclass(hook_args.exc_type, Exception):
            self.signum = signum
            if signal.getsignal(signum) == self.handler:  # else it lands in Prefect's bridge, which raises again
                self.lost.set()
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
        else:
            self.previous_hook(hook_args)

    def at_hard_exit(self, fn) -> None:
        """`fn()` runs before an exit at once: what the unwinding would have done, had it got there."""
        self.tidy.append(fn)

    def handler(self, signum: int, frame) -> None:
        if self.lost.is_set():  # the one we raised was swallowed: this is `unraisable` sending it again
            self.lost.clear()
            raise KeyboardInterrupt
        self.handled += 1
        self.signum = self.signum or signum
        if self.handled > 1:
            hard_exit(signum, "a second signal", self.tidy)
        # Inside a flow, Prefect re-sends a SIGTERM it already turned into TerminationSignal once the flow has
        # unwound: it lands here as the first one we take, and the unwinding just goes on.
        raise KeyboardInterrupt

    def watch(self, fd: int) -> None:
        """The watchdog's loop: the first stop signal arms the grace period (our handler may have run first)."""
        while not self._done.is_set():
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if stops := [b for b in data if b in STOP_SIGNALS]:
                self.signum = self.signum or stops[0]
                STOP.set()
                print(f"igrpo: {signal.Signals(stops[0]).name}: stopping (the run resumes where it stopped); "
                      "a second signal exits at once", file=sys.stderr, flush=True)
                self._wait_for_cleanup(stops[0])
                return

    def _wait_for_cleanup(self, signum: int) -> None:
        """Exit at once if the cleanup is still running `grace_s` after the signal or, where a training's step was in
        flight, `grace_s` after that step reached its save point (`STEP_CLOCK`; while it runs, after the time it is
        expected by): the step ends and saves a checkpoint, where an exit at once would lose every step since the
        last periodic one."""
        signalled, told = time.monotonic(), False
        while True:
            boundary = STEP_CLOCK.next_boundary()
            if boundary is not None and not told:
                told = True
                print(f"igrpo: the training step in flight ends and saves a checkpoint first (within about "
                      f"{max(0.0, boundary - signalled):.0f} s)", file=sys.stderr, flush=True)
            deadline = (boundary if boundary is not None else max(signalled, STEP_CLOCK.ended)) + self.grace_s
            now = time.monotonic()
            if now >= deadline:
                hard_exit(signum, f"cleanup still running after {self.grace_s:.0f} s", self.tidy)  # no return
            if self._done.wait(min(0.5, deadline - now)):
                return

    def exit_code(self, error: BaseException) -> int | None:
        """128 + the signal for a program stopped by one (`error` its KeyboardInterrupt or TerminationSignal)."""
        if isinstance(error, Exception):
            return None
        signum = getattr(error, "signal", None) or self.signum
        return 128 + signum if signum else None


@contextlib.contextmanager
def stop_on_signals(grace_s: float = GRACE_S):
    """SIGINT and SIGTERM stop the body (see the module doc); yields the `Stopper` (None off the main thread,
    where Python cannot take signals: the caller's own handling stands)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stopper = Stopper(grace_s)
    STOP.clear()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    old_handlers = {s: signal.signal(s, stopper.handler) for s in STOP_SIGNALS}
    sys.unraisablehook = stopper.unraisable
    watchdog = threading.Thread(target=stopper.watch, args=(read_fd,), name="igrpo-stop-watchdog", daemon=True)
    watchdog.start()
    try:
        yield stopper
    finally:
        stopper._done.set()
        STOP.clear()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        sys.unraisablehook = stopper.previous_hook
        signal.set_wakeup_fd(old_fd)
        os.close(write_fd)  # the watchdog's read returns empty
        watchdog.join(timeout=1)
        os.close(read_fd)


def hard_exit(signum: int, why: str, tidy=()) -> None:
    """Exit now (128 + `signum`) after `tidy`, stopping Prefect's ephemeral server so that it does not outlive us."""
    print(f"igrpo: stopped at once ({why}); `igrpo run` resumes the run", file=sys.stderr, flush=True)
    for fn in tidy:
        with contextlib.suppress(Exception):
            fn()
    server_module = sys.modules.get("prefect.server.api.server")  # started one only if it was imported
    with contextlib.suppress(Exception):
        for server in list(server_module.SubprocessASGIServer._instances.values() if server_module else ()):
            if server.server_process is not None:
                server.server_process.kill()
    os._exit(128 + signum)


def ephemeral_server_apart() -> None:
    """Start Prefect's ephemeral API server, when the run uses one, in a session of its own that dies with us.

    Prefect starts it as a child in our process group, so a terminal's Ctrl-C (sent to the whole group) used to
    stop it with the run: the flow then could not record its crash, and its client retried for a minute. Apart,
    the server outlives the signal and stops with the run as usual; the kernel stops it if this process dies
    any other way (PR_SET_PDEATHSIG). Registered under the key Prefect looks its server up by, as Prefect's own
    test harness does. Linux only; elsewhere Prefect's default stands.
    """
    if sys.platform != "linux":
        return
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:  # the run talks to a server of the user's: none to start (nor to import)
        return
    from prefect.server.api import server

    if None in server.SubprocessASGIServer._instances:  # a harness, or an earlier call, registered one
        return

    class Apart(server.SubprocessASGIServer):
        def _run_uvicorn_command(self):
            popen = subprocess.Popen
            subprocess.Popen = functools.partial(popen, preexec_fn=_own_session_dying_with_parent)
            try:
                return super()._run_uvicorn_command()
            finally:
                subprocess.Popen = popen

    Apart()  # registers itself under None: Prefect's `SubprocessASGIServer()` returns it


def _own_session_dying_with_parent() -> None:
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
