"""uccl_ep.Tuning: the kernel tuning a Buffer takes as an argument (it replaced env switches)."""

import pytest

import uccl_ep
from uccl_ep import tuning as tuning_mod
from uccl_ep.errors import InvalidArgument
from uccl_ep.tuning import Tuning

pytestmark = pytest.mark.cpu


def test_defaults_are_the_measured_ones():
    t = Tuning()
    assert (t.ll_combine_recv_threads, t.ll_pdl, t.ll_own_rows_in_y, t.ll_stage_split, t.ll_proxy_parts) == \
        (512, True, True, 4, 1)
    assert (t.ipc_copy_blocks, t.proxy_write_kb) == (16, 16383)
    assert (t.ht_warps, t.ht_combine_warps, t.ht_defines, t.ht_combine_ce, t.ht_dispatch_ce) == \
        (16, 16, "", True, "auto")
    assert (t.ht_ce_chunk_kb, t.ht_combine_ce_max_mb) == (8192, 2048)
    assert uccl_ep.Tuning is Tuning and tuning_mod.resolve(None) == t


@pytest.mark.parametrize("field,value,expect", [
    ("ht_warps", 4, ">= 8"), ("ht_warps", 33, "<= 32"), ("ht_warps", "16", "an int"), ("ht_warps", True, "an int"),
    ("ht_combine_warps", 40, "<= 32"), ("ll_combine_recv_threads", 16, ">= 32"),
    ("ll_proxy_parts", 9, "<= 8"), ("proxy_write_kb", 16384, "<= 16383"), ("ht_ce_chunk_kb", 32, ">= 64"),
    ("ll_pdl", 1, "a bool"), ("ht_combine_ce", "yes", "a bool"), ("ht_dispatch_ce", "true", "one of auto, 1, 0"),
    ("ht_defines", 8, "a str"),
])
def test_bad_values_name_the_argument(field, value, expect):
    with pytest.raises(InvalidArgument) as e:
        Tuning(**{field: value})
    assert f"tuning.{field}" in str(e.value) and expect in str(e.value)


def test_from_pairs_parses_by_field_type():
    t = Tuning.from_pairs(["ht_warps=24", "ll_pdl=0", "ht_defines=UCCL_EP_HT_PUBLISH_EVERY=8 UCCL_EP_HT_RELAXED_HEAD=1",
                           "ht_dispatch_ce=1", "proxy_write_kb=0x10"])
    assert (t.ht_warps, t.ll_pdl, t.ht_dispatch_ce, t.proxy_write_kb) == (24, False, "1", 16)
    assert t.ht_defines == "UCCL_EP_HT_PUBLISH_EVERY=8 UCCL_EP_HT_RELAXED_HEAD=1"
    for bad, name in (("ht_warps", "--tune"), ("nope=1", "--tune"), ("ht_warps=many", "tuning.ht_warps"),
                      ("ll_pdl=maybe", "tuning.ll_pdl"), ("ht_warps=64", "tuning.ht_warps")):
        with pytest.raises(InvalidArgument, match=name.replace(".", r"\.")):
            Tuning.from_pairs([bad])


def test_replace_refuses_unknown_fields():
    with pytest.raises(InvalidArgument, match="tuning.ht_wraps"):
        Tuning().replace(ht_wraps=8)
    assert Tuning().replace(ht_warps=8).ht_warps == 8


def test_resolve_refuses_other_types():
    with pytest.raises(InvalidArgument, match="tuning"):
        tuning_mod.resolve({"ht_warps": 8})


def test_shared_settings_compare_argument_values():
    """What every rank must agree on is compared as Tuning values (not environment values)."""
    from uccl_ep.cuda import ht_ce, ll_proxy
    a, b = Tuning(), Tuning(ll_proxy_parts=2)
    assert ll_proxy.shared_settings(a) == (1, 16383)
    ll_proxy.check_same_shared_settings([ll_proxy.shared_settings(a)] * 2)
    with pytest.raises(InvalidArgument, match=r"tuning.ll_proxy_parts.*rank 1: 2/16383"):
        ll_proxy.check_same_shared_settings([ll_proxy.shared_settings(a), ll_proxy.shared_settings(b)])
    c = Tuning(ht_defines="UCCL_EP_HT_PUBLISH_EVERY=8")
    with pytest.raises(InvalidArgument, match="tuning.ht_defines"):
        ht_ce.check_same_settings([ht_ce.shared_settings(a), ht_ce.shared_settings(c)])


def test_buffer_takes_and_checks_the_tuning_argument(world1):
    """Buffer(tuning=...) keeps a Tuning, means the defaults for None, and refuses anything else naming it."""
    t = Tuning(ht_warps=24)
    buf = uccl_ep.Buffer(world1, 0, 0, backend="reference", tuning=t)
    assert buf.tuning is t and buf._executor.ctx.tuning is t
    assert uccl_ep.Buffer(world1, 0, 0, backend="reference").tuning == Tuning()
    with pytest.raises(InvalidArgument, match="tuning"):
        uccl_ep.Buffer(world1, 0, 0, backend="reference", tuning={"ht_warps": 24})


def test_bench_tune_flag_fills_the_spec():
    import argparse
    from uccl_ep.cli import bench
    sub = argparse.ArgumentParser().add_subparsers()
    bench.add_parser(sub)
    p = sub.choices["bench"]
    args = p.parse_args(["--cpu", "--tune", "ht_warps=24", "--tune", "ll_pdl=0"])
    spec = bench._spec_from_args(args, on_gpu=False)
    assert tuple(spec["tune"]) == ("ht_warps=24", "ll_pdl=0")
    with pytest.raises(InvalidArgument, match="--tune"):
        bench._spec_from_args(p.parse_args(["--cpu", "--tune", "ht_wraps=24"]), on_gpu=False)
    # the NVL buffer (the proxy region's size, so the rings' depth) is a bench flag too
    assert bench._spec_from_args(p.parse_args(["--cpu", "--nvl-mb", "512"]), on_gpu=False)["nvl_bytes"] == 512 << 20
    assert bench._spec_from_args(p.parse_args(["--cpu"]), on_gpu=False)["nvl_bytes"] == 0
    with pytest.raises(InvalidArgument, match="--nvl-mb"):
        bench._spec_from_args(p.parse_args(["--cpu", "--nvl-mb", "-1"]), on_gpu=False)


def test_bench_matrix_takes_tune_and_checks_it():
    """--tune with --matrix reaches the spec (every uccl-ep Buffer of the run gets it); a bad value is
    an error naming the field, not silently ignored."""
    import argparse
    from uccl_ep.cli import bench, bench_matrix
    sub = argparse.ArgumentParser().add_subparsers()
    bench.add_parser(sub)
    args = sub.choices["bench"].parse_args(["--matrix", "ht", "--tune", "ht_warps=24"])
    assert bench_matrix.spec_from_args(args, False)["tune"] == ["ht_warps=24"]
    args = sub.choices["bench"].parse_args(["--matrix", "ht", "--tune", "ht_warps=4"])
    with pytest.raises(InvalidArgument, match="tuning.ht_warps"):
        bench_matrix.spec_from_args(args, False)


def test_proxy_path_partials_setting_must_match_across_ranks():
    """Tuning.ht_partials_bf16 decides the layout of messages another node reads: the executor
    gathers it at Buffer build and refuses a group that disagrees, naming the field."""
    from uccl_ep.cuda import ht_proxy
    assert ht_proxy.shared_settings(Tuning()) == (False,)
    ht_proxy.check_same_shared_settings([(True,), (True,)])
    with pytest.raises(InvalidArgument, match="tuning.ht_partials_bf16"):
        ht_proxy.check_same_shared_settings([(False,), (True,)])
