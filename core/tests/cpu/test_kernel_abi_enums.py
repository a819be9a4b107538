"""The host names device error codes and phases from kernel_abi.h itself (runtime.abi_enum), not
from a copy: every phase the executor's error mapping tests for exists in the header, and the codes
it compares with are the header's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from uccl_ep.cuda import executor
from uccl_ep.cuda.runtime import abi_enum

pytestmark = pytest.mark.cpu


def test_phases_and_codes_come_from_the_header():
    phases = executor.phase_names()
    assert phases[1] == "ll_dispatch_recv" and phases[3] == "ht_notify" and phases[11] == "ll_proxy_copy"
    assert len(phases) == len(abi_enum("Phase")) and len(set(phases.values())) == len(phases)
    err = executor.error_codes()
    assert (err.none, err.timeout, err.protocol, err.proxy, err.topk_duplicate, err.peer_gone) == (0, 1, 2, 3, 4, 5)


def test_every_phase_the_executor_names_exists():
    src = (Path(executor.__file__)).read_text()
    named = set(re.findall(r'what (?:==|in) \(?"([a-z_]+)"', src)) | set(re.findall(r'"([a-z]+_[a-z_]+_copy)"', src))
    assert named and named <= set(executor.phase_names().values()), sorted(named - set(executor.phase_names().values()))


def test_missing_enum_is_named():
    with pytest.raises(KeyError, match="NoSuchEnum"):
        abi_enum("NoSuchEnum")
