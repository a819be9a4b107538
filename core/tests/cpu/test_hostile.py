"""The hostile-input suite: >= 300 generated bad calls of every public Buffer method (reference and
host backends, 2 CPU ranks) and of every native binding; each must end in a typed error of the
expected class. Prints ``N cases: N typed, 0 crash, 0 hang, 0 silent``; a crash, hang, silent
pass or untyped error fails the test (the cases are in core/tests/cpu/hostile/)."""

import pytest

from hostile import summary
from hostile.buffer_cases import BACKENDS
from hostile.native_cases import cases as native_cases
from hostile.runner import run_buffer, run_native

pytestmark = pytest.mark.cpu


def test_hostile_inputs_end_in_typed_errors(capsys):
    results = run_native([c.name for c in native_cases()])
    for backend in BACKENDS:
        results += run_buffer(backend)
    line = summary(results)
    with capsys.disabled():
        print(f"\nhostile suite: {line}")
    bad = [f"{outcome}: {name} -- {detail}" for name, outcome, detail in results if outcome != "typed"]
    assert not bad, line + "\n" + "\n".join(bad)
    assert len(results) >= 300, line


def test_runner_counts_crashes_hangs_and_silent_passes():
    """The runner itself: a segfault, a hang and a silent pass are counted as such, and the cases
    after them still run."""
    results = run_native(["typed", "crash", "typed after a crash", "hang", "silent", "untyped"],
                         module="hostile.selftest_cases", bound_s=3.0)
    assert [outcome for _, outcome, _ in results] == ["typed", "crash", "typed", "hang", "silent", "untyped"], results
    assert summary(results) == "6 cases: 2 typed, 1 crash, 1 hang, 1 silent, 1 untyped"
