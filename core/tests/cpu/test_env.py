"""The env-var registry: typed parsing, clear errors, docs in sync, never writes os.environ."""

import os
import pathlib

import pytest

from uccl_ep import env
from uccl_ep.errors import InvalidArgument

pytestmark = pytest.mark.cpu


def test_defaults_when_unset():
    assert env.get("UCCL_EP_TIMEOUT_S", environ={}) == 100.0
    assert env.get("UCCL_EP_BACKEND", environ={}) == "auto"
    assert env.get("UCCL_EP_FORCE_PROXY", environ={}) is False


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("ON", True), ("0", False), ("no", False)])
def test_bool_parsing(raw, value):
    assert env.get("UCCL_EP_FORCE_PROXY", environ={"UCCL_EP_FORCE_PROXY": raw}) is value


def test_int_float_choice_parsing():
    assert env.get("UCCL_EP_NUM_PROXY_THREADS", environ={"UCCL_EP_NUM_PROXY_THREADS": "0x8"}) == 8
    assert env.get("UCCL_EP_TIMEOUT_S", environ={"UCCL_EP_TIMEOUT_S": "2.5"}) == 2.5
    assert env.get("UCCL_EP_BACKEND", environ={"UCCL_EP_BACKEND": "reference"}) == "reference"


@pytest.mark.parametrize("name,raw,expect", [
    ("UCCL_EP_NUM_PROXY_THREADS", "four", "an integer"),
    ("UCCL_EP_NUM_PROXY_THREADS", "0", ">= 1"),
    ("UCCL_EP_PROXY_WRITE_KB", "16384", "<= 16383"),
    ("UCCL_EP_TIMEOUT_S", "soon", "a number"),
    ("UCCL_EP_BACKEND", "nccl", "one of auto, reference, host, cuda"),
    ("UCCL_EP_FORCE_PROXY", "maybe", "a boolean"),
    ("UCCL_EP_HT_DISPATCH_CE", "true", "one of auto, 1, 0"),  # was a bool once: refused, not ignored
    ("UCCL_EP_LL_PUSH_FENCE", "none", "one of auto, system"),
])
def test_bad_values_name_the_variable(name, raw, expect):
    with pytest.raises(InvalidArgument) as e:
        env.get(name, environ={name: raw})
    assert name in str(e.value) and expect in str(e.value)


def test_listed_choices_are_checked():
    """A variable that lists choices is parsed as a choice (a `str` kind would let any text through)."""
    assert [v.name for v in env.REGISTRY.values() if v.choices and v.kind != "choice"] == []


def test_unknown_variable_is_refused():
    with pytest.raises(InvalidArgument, match="registered uccl_ep env var"):
        env.get("UCCL_EP_NOT_A_THING")


def test_snapshot_does_not_write_environ():
    before = dict(os.environ)
    snap = env.snapshot()
    assert set(snap) == set(env.REGISTRY)
    assert dict(os.environ) == before


def test_docs_env_md_is_generated_from_registry():
    doc = pathlib.Path(__file__).resolve().parents[3] / "docs" / "env.md"
    assert doc.read_text() == env.render_markdown(), \
        "docs/env.md is stale: run `python -m uccl_ep.env > docs/env.md`"


@pytest.mark.parametrize("raw,ns", [("spin", -1), ("0", 0), ("2.5", 2500), ("auto", None)])
def test_proxy_idle_sleep(monkeypatch, raw, ns):
    """UCCL_EP_PROXY_IDLE_SLEEP_US: `spin` never yields (-1), a number is the sleep cap in ns, `auto`
    follows the CPU count; anything else is refused naming the variable."""
    from uccl_ep.proxy import bootstrap
    monkeypatch.setenv("UCCL_EP_PROXY_IDLE_SLEEP_US", raw)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert bootstrap.idle_sleep_ns() == (50_000 if ns is None else ns)
    monkeypatch.setenv("UCCL_EP_PROXY_IDLE_SLEEP_US", "-3")
    with pytest.raises(InvalidArgument, match="UCCL_EP_PROXY_IDLE_SLEEP_US"):
        bootstrap.idle_sleep_ns()
