#!/usr/bin/env python3
"""Runs a uccl-ep job directory (ray_driver.py + plan.json) on a Ray cluster through Ray's job
submission API: the cluster's dashboard address (http://HEAD:8265), no connection to its GCS needed.

    python THIS_FILE --address http://HEAD:8265 --dir JOB_DIR [--python PY] [--timeout S]
                     [--placement-timeout S]

1. submits the directory as the job's working_dir, with the entrypoint `PY ray_driver.py --plan
   plan.json` (PY: the interpreter on the cluster that has Ray, default `python`);
2. prints the job's log as it grows (streamed from the dashboard; polled if the stream breaks), and
   its final status;
3. bounds it: past the plan's timeout plus the placement wait (and a margin for Ray's own start-up),
   or on SIGTERM / SIGINT here, the job is stopped (the driver then stops every node) before this
   script returns.
Exit status: 0 when the job succeeded, else the driver's exit code (1 when Ray gives none), 124 on
the deadline.

NOTES: like ray_driver.py it needs only the standard library and `ray` (with its job client:
`ray[default]`), so `uccl-ep launch ray` runs it with whichever interpreter has Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
import time

_POLL_S = 1.0
_MARGIN_S = 120.0  # Ray's runtime-env set-up and the driver's teardown, beyond the job's own bounds


def _say(msg: str) -> None:
    print(f"[uccl-ep ray] {msg}", flush=True)


class _Stop(Exception):
    pass


def _raise_stop(signum, _frame):
    raise _Stop(signal.Signals(signum).name)


def submit_and_follow(address: str, job_dir: str, python: str, timeout_s: float, placement_timeout_s: float) -> int:
    try:
        from ray.job_submission import JobStatus, JobSubmissionClient
    except ImportError:
        _say("the job submission API needs Ray's job client: pip install 'ray[default]'")
        return 3
    client = JobSubmissionClient(address)
    entrypoint = " ".join(shlex.quote(a) for a in (
        python, "ray_driver.py", "--plan", "plan.json", "--timeout", str(timeout_s),
        "--placement-timeout", str(placement_timeout_s)))
    job = client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": job_dir},
                            metadata={"launcher": "uccl-ep"})
    _say(f"submitted job {job} to {address}: {entrypoint}")
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    deadline = time.monotonic() + timeout_s + placement_timeout_s + _MARGIN_S
    shown = 0

    def show_new_lines() -> None:
        nonlocal shown
        logs = client.get_job_logs(job)
        if len(logs) > shown:
            sys.stdout.write(logs[shown:])
            sys.stdout.flush()
            shown = len(logs)

    def stop(why: str) -> None:
        _say(f"{why}; stopping job {job}")
        client.stop_job(job)
        until = time.monotonic() + 60
        while client.get_job_status(job) not in terminal and time.monotonic() < until:
            time.sleep(_POLL_S)
        show_new_lines()

    async def stream() -> None:  # the log as the dashboard pushes it; ends with the job
        nonlocal shown
        async for chunk in client.tail_job_logs(job):
            sys.stdout.write(chunk)
            sys.stdout.flush()
            shown += len(chunk)

    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            asyncio.run(asyncio.wait_for(stream(), max(1.0, deadline - time.monotonic())))
        except (RuntimeError, OSError) as e:  # the stream broke (proxy, dashboard restart): poll instead
            _say(f"log stream ended ({e}); following by polling")
        except asyncio.TimeoutError:
            pass  # the deadline: checked below
        while True:
            status = client.get_job_status(job)
            show_new_lines()
            if status in terminal:
                break
            if time.monotonic() > deadline:
                stop(f"the job did not end within {timeout_s + placement_timeout_s + _MARGIN_S:.0f}s")
                return 124
            time.sleep(_POLL_S)
    except _Stop as sig:
        stop(f"{sig} here")
        return 143
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    info = client.get_job_info(job)
    if status == JobStatus.SUCCEEDED:
        _say(f"job {job} succeeded")
        return 0
    code = getattr(info, "driver_exit_code", None)
    _say(f"job {job} {status.value.lower()}" + (f" (driver exit code {code})" if code is not None else "")
         + (f": {info.message.splitlines()[0]}" if info.message else ""))
    return code if isinstance(code, int) and code != 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", required=True, help="the cluster's dashboard, http://HEAD:8265")
    ap.add_argument("--dir", required=True, help="job directory: ray_driver.py and plan.json")
    ap.add_argument("--python", default="python", help="interpreter on the cluster that runs the driver (has Ray)")
    ap.add_argument("--timeout", type=float, required=True, help="seconds for the job itself (the plan's)")
    ap.add_argument("--placement-timeout", type=float, default=300, help="seconds to wait for the node slots")
    a = ap.parse_args(argv)
    return submit_and_follow(a.address, a.dir, a.python, a.timeout, a.placement_timeout)


if __name__ == "__main__":
    sys.exit(main())
