"""Stop the running jobs at once when Snakemake itself is interrupted.

With the local executor Snakemake runs each shell job as ``bash -c ...`` in a thread of its own
process, in its own process group. What it does when only its own pid is signalled (9.27):

* SIGINT raises KeyboardInterrupt in its scheduler, which says "Terminating processes on user
  request" and then waits for the job threads to end, without signalling the jobs;
* SIGTERM sets a "graceful" flag: it waits for the running jobs to finish.

Either way a serve job went on measuring for minutes, wrote its complete-looking outputs, and
left Snakemake's incomplete markers on them, so the next run demanded ``--rerun-incomplete``.
A Ctrl-C at a terminal does not have the problem, because the terminal signals the whole
foreground group, jobs included.

``install()`` (called from the workflow's ``onstart`` hook, in Snakemake's main process) makes
a signal to Snakemake alone behave like that: on SIGINT or SIGTERM it sends SIGTERM to every
job process in Snakemake's process group (the job shells excepted, so that they live to report
the job's exit status and the tail of its log), then lets Snakemake's own handling go on. The
stages turn SIGTERM into their normal clean-up (servers and containers stopped, leases released,
no result file written) and ignore any repeat of the signal while they clean up; processes that
a stage put in a session of its own (servers, the tuner) are stopped by that stage. Snakemake
then removes the failed jobs' outputs, so the next run simply runs those jobs again.
"""

from __future__ import annotations

import os
import signal
from typing import Any

SHELLS = {"bash", "sh", "dash", "zsh"}


def job_processes(root_pid: int) -> list[Any]:
    """The processes ``root_pid`` started (at any depth) that are still in its process group,
    shells excluded: the jobs' own commands. Those in another session are left to their owner."""
    import psutil

    try:
        pgid = os.getpgid(root_pid)
        children = psutil.Process(root_pid).children(recursive=True)
    except (ProcessLookupError, psutil.NoSuchProcess):
        return []
    found = []
    for child in children:
        try:
            if os.getpgid(child.pid) == pgid and child.name() not in SHELLS:
                found.append(child)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_jobs(root_pid: int, sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to the job processes of ``root_pid``; return the pids signalled."""
    import psutil

    sent = []
    for proc in job_processes(root_pid):
        try:
            proc.send_signal(sig)
            sent.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sent


def _say(text: str) -> None:
    # os.write, not print: a signal handler may run while the main thread is inside a print.
    try:
        os.write(2, f"cellbench: {text}\n".encode())
    except OSError:
        pass


def install() -> None:
    """Forward SIGINT and SIGTERM received by this process (Snakemake's main process) to its
    running jobs, then hand the signal to the handler that was there before (Snakemake's)."""
    root = os.getpid()
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        before = signal.getsignal(sig)
        if before == signal.SIG_IGN:
            continue  # started with the signal ignored (nohup, a background job): keep it so
        previous[sig] = before

    def on_signal(signum: int, frame: Any) -> None:
        pids = stop_jobs(root)
        name = signal.Signals(signum).name
        if pids:
            _say(
                f"{name} received: sent SIGTERM to {len(pids)} running job process(es) "
                f"({', '.join(map(str, pids))}); they stop their servers and write no result"
            )
        before = previous[signum]
        if callable(before):
            before(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(root, signum)

    for sig in previous:
        signal.signal(sig, on_signal)


def stage_handler(signum: int, frame: Any) -> None:
    """A handler for a stage process: the first SIGINT or SIGTERM becomes KeyboardInterrupt
    (so every ``finally`` and context manager runs), and later ones are ignored while that
    clean-up runs: a Ctrl-C to the group and the forwarded SIGTERM arrive one after the other,
    and the second must not cut the first one's clean-up short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def install_in_stage() -> None:
    """Install ``stage_handler`` for SIGINT (unless ignored on purpose) and SIGTERM."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        signal.signal(signal.SIGINT, stage_handler)
    signal.signal(signal.SIGTERM, stage_handler)
