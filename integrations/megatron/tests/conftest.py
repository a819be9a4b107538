"""Shared set-up for the uccl-ep-megatron tests: Megatron-Core 0.19.2 sources and this package on
sys.path (spawned ranks inherit it), a sitecustomize dir for subprocesses on Python 3.11."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_shims  # noqa: E402

cpu_shims.add_paths()


@pytest.fixture
def hook():
    """The hook installed for one test, removed afterwards (it patches process-wide classes)."""
    import uccl_ep_megatron
    from uccl_ep_megatron import settings

    uccl_ep_megatron.install()
    yield uccl_ep_megatron
    uccl_ep_megatron.uninstall()
    settings.reset()


@pytest.fixture(scope="session")
def subprocess_env(tmp_path_factory):
    """Environment for `python -m uccl_ep_megatron ...` subprocesses."""
    site = tmp_path_factory.mktemp("site")
    # NOTES: Python 3.11 lacks typing.override (megatron.training uses it); the CI venv is 3.11.
    (site / "sitecustomize.py").write_text(
        "import typing\n"
        "if not hasattr(typing, 'override'):\n"
        "    import typing_extensions\n"
        "    typing.override = typing_extensions.override\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), cpu_shims.INTEGRATION, cpu_shims.MEGATRON_SRC,
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONWARNINGS"] = "ignore"
    return env


_EXECUTORS: list = []


@pytest.fixture
def executor_summary() -> list:
    """Tests append "what ran: executor" lines; pytest prints them in its summary."""
    return _EXECUTORS


def pytest_terminal_summary(terminalreporter):
    if _EXECUTORS:
        terminalreporter.write_sep("-", "uccl_ep executors that ran under Megatron-Core / Primus-Turbo")
        for line in _EXECUTORS:
            terminalreporter.write_line(line)
