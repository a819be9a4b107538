"""Bad input gets a typed error that names the argument and says what was expected."""

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep import Buffer, Config, EventOverlap
from uccl_ep.errors import InvalidArgument, LimitExceeded, Unsupported

pytestmark = pytest.mark.cpu

H, E, K, T = 256, 8, 2, 6


@pytest.fixture()
def normal(world1):
    cfg = Buffer.get_dispatch_config(1)
    return Buffer(world1, cfg.get_nvl_buffer_size_hint(H * 4, 1), 0, backend="reference")


@pytest.fixture()
def ll(world1):
    return Buffer(world1, 0, Buffer.get_low_latency_rdma_size_hint(16, H, 1, E), low_latency_mode=True,
                  enable_shrink=True, backend="reference")


def _topk():
    return torch.randn(T, E).topk(K, dim=-1).indices


def _layout(buf, topk):
    ntpr, ntprr, ntpe, in_rank, _ = buf.get_dispatch_layout(topk, E)
    return dict(num_tokens_per_rank=ntpr, num_tokens_per_rdma_rank=ntprr, is_token_in_rank=in_rank,
                num_tokens_per_expert=ntpe)


def _raises(exc, argument, fn, *args, match=None, **kwargs):
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    if argument is not None:
        assert getattr(e.value, "argument", None) == argument, str(e.value)
    if match is not None:
        assert match in str(e.value), str(e.value)
    return e.value


# --- constructor --------------------------------------------------------------------------------
def test_constructor_errors(world1):
    _raises(InvalidArgument, "group", Buffer, None)
    _raises(Unsupported, None, Buffer, None, comm=object(), match="mpi4py")
    _raises(InvalidArgument, "group", Buffer, "not a group")
    _raises(InvalidArgument, "num_nvl_bytes", Buffer, world1, 100, match="multiple of 128")
    _raises(InvalidArgument, "num_rdma_bytes", Buffer, world1, 0, -128)
    _raises(InvalidArgument, "num_qps_per_rank", Buffer, world1, 0, 0, False, 0)
    _raises(InvalidArgument, "backend", Buffer, world1, backend="gpu-magic", match="one of auto")
    _raises(InvalidArgument, "timeout_s", Buffer, world1, timeout_s=0)
    _raises(Unsupported, None, Buffer, world1, some_fork_feature=True, match="some_fork_feature")


def test_constructor_forms_and_attributes(world1):
    a = Buffer(world1, 1 << 20, 0, False, 8, True, False, False, True, False, None, backend="reference")
    b = Buffer(group=world1, num_nvl_bytes=1 << 20, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=8,
               allow_nvlink_for_low_latency_mode=True, allow_mnnvl=True, use_fabric=True, explicitly_destroy=True,
               enable_shrink=False, backend="reference",
               # kwargs that framework forks pass; accepted when they ask for nothing
               is_intranode=True, some_future_flag=None, other_flag=False)
    for buf in (a, b):
        assert buf.group is world1 and buf.group_size == 1 and buf.rank == 0
        assert buf.num_nvl_bytes == 1 << 20 and buf.num_rdma_bytes == 0 and buf.low_latency_mode is False
        assert buf.explicitly_destroy and buf.is_available() and buf.backend == "reference"
        buf.destroy()
        assert not buf.is_available()
        _raises(InvalidArgument, "self", buf.get_dispatch_layout, _topk(), E, match="destroyed")


def test_protocol_limits_checked_at_construction_and_per_call(world1):
    # offsets are 31 bits of 16-byte units: 32 GiB per region
    e = _raises(LimitExceeded, "num_nvl_bytes", Buffer, world1, 64 << 30, backend="reference")
    assert e.needed == 64 << 30 and e.limit == 32 << 30
    buf = Buffer(world1, 0, 16 << 30, low_latency_mode=True, backend="reference")
    xb = torch.zeros(4, H, dtype=torch.bfloat16)
    # a fenced atomic counts at most 32766 tokens per (source, expert)
    e = _raises(LimitExceeded, "num_max_dispatch_tokens_per_rank", buf.low_latency_dispatch, xb,
                torch.zeros(4, 1, dtype=torch.int64), 40000, E)
    assert e.limit == 32766


def test_destroy_requires_explicit_flag(world1):
    buf = Buffer(world1, 0, 0, backend="reference")
    _raises(InvalidArgument, "explicitly_destroy", buf.destroy)


# --- normal mode ----------------------------------------------------------------------------------
def test_layout_errors(normal):
    topk = _topk()
    _raises(InvalidArgument, "topk_idx", normal.get_dispatch_layout, topk.int(), E, match="int64")
    _raises(InvalidArgument, "topk_idx", normal.get_dispatch_layout, topk.t(), E, match="contiguous")
    _raises(InvalidArgument, "topk_idx", normal.get_dispatch_layout, topk[0], E, match="2-D")
    bad = topk.clone()
    bad[0, 0] = E
    _raises(InvalidArgument, "topk_idx", normal.get_dispatch_layout, bad, E, match=f"[0, {E})")
    bad[0, 0] = -2
    _raises(InvalidArgument, "topk_idx", normal.get_dispatch_layout, bad, E, match="id -2")
    _raises(InvalidArgument, "num_experts", normal.get_dispatch_layout, topk, 0)
    _raises(InvalidArgument, "allocate_on_comm_stream", normal.get_dispatch_layout, topk, E,
            allocate_on_comm_stream=True)
    _raises(InvalidArgument, "previous_event", normal.get_dispatch_layout, topk, E, previous_event="event")


def test_dispatch_errors(normal, world1):
    topk, x, w = _topk(), torch.randn(T, H), torch.rand(T, K)
    lay = _layout(normal, topk)
    _raises(InvalidArgument, "x", normal.dispatch, x.t(), topk_idx=topk, topk_weights=w, **lay, match="contiguous")
    _raises(InvalidArgument, "x", normal.dispatch, torch.randn(T, 3), topk_idx=topk, topk_weights=w, **lay,
            match="16 bytes")
    _raises(InvalidArgument, "topk_weights", normal.dispatch, x, topk_idx=topk, **lay, match="together")
    _raises(InvalidArgument, "topk_weights", normal.dispatch, x, topk_idx=topk, topk_weights=w.double(), **lay,
            match="float32")
    _raises(InvalidArgument, "num_tokens_per_rank", normal.dispatch, x, topk_idx=topk, topk_weights=w,
            **{**lay, "num_tokens_per_rank": None}, match="get_dispatch_layout")
    _raises(InvalidArgument, "is_token_in_rank", normal.dispatch, x, topk_idx=topk, topk_weights=w,
            **{**lay, "is_token_in_rank": lay["is_token_in_rank"].int()}, match="bool")
    _raises(InvalidArgument, "topk_idx", normal.dispatch, x[:3], topk_idx=topk, topk_weights=w, **{
        **lay, "is_token_in_rank": lay["is_token_in_rank"][:3]}, match="rows")
    _raises(InvalidArgument, "x[1]", normal.dispatch, (x.to(torch.float8_e4m3fn), torch.randn(T + 1, 2)),
            topk_idx=topk, topk_weights=w, **lay)
    _raises(InvalidArgument, "x", normal.dispatch, (x,), **lay, match="pair")
    _raises(InvalidArgument, "config", normal.dispatch, x, topk_idx=topk, topk_weights=w, config={"num_sms": 20},
            **lay)
    _raises(InvalidArgument, "topk_idx", normal.dispatch, x, num_worst_tokens=8, **lay, match="num_worst_tokens")
    e = _raises(LimitExceeded, "num_worst_tokens", normal.dispatch, x, topk_idx=topk, topk_weights=w,
                num_worst_tokens=1, **lay)
    assert e.needed == T and e.limit == 1
    # buffer too small: the error names the size needed
    small = Buffer(world1, 128, 0, backend="reference")
    e = _raises(LimitExceeded, "num_nvl_bytes", small.dispatch, x, topk_idx=topk, topk_weights=w, **lay)
    assert e.needed == Buffer.get_dispatch_config(1).get_nvl_buffer_size_hint(H * 4, 1)
    assert str(e.needed) in str(e)
    # inconsistent layout tensors are caught by the reference
    _raises(InvalidArgument, "num_tokens_per_rank", normal.dispatch, x, topk_idx=topk, topk_weights=w,
            **{**lay, "num_tokens_per_rank": lay["num_tokens_per_rank"] + 1})


def test_handle_errors(normal, ll, world1):
    topk, x, w = _topk(), torch.randn(T, H), torch.rand(T, K)
    lay = _layout(normal, topk)
    _, _, _, _, handle, _ = normal.dispatch(x, topk_idx=topk, topk_weights=w, **lay)
    _raises(InvalidArgument, "topk_idx", normal.dispatch, x, handle=handle, topk_idx=topk, topk_weights=w)
    _raises(InvalidArgument, "x", normal.dispatch, x[:2], handle=handle, match="rows")
    other = Buffer(world1, normal.num_nvl_bytes, 0, backend="reference")
    _raises(InvalidArgument, "handle", other.combine, x, handle, match="another Buffer")
    _raises(InvalidArgument, "handle", normal.combine, x, ("not", "a", "handle"))
    _raises(InvalidArgument, "x", normal.combine, x.long(), handle, match="bfloat16")
    _raises(InvalidArgument, "x", normal.combine, x[:1], handle, match="rows")
    _raises(InvalidArgument, "bias[0]", normal.combine, x, handle, bias=torch.zeros(T, H + 128))
    _raises(InvalidArgument, "bias", normal.combine, x, handle, bias=(x, x, x))
    # a low-latency handle is not a normal handle (and vice versa)
    xb = torch.randn(T, H).bfloat16()
    _, _, ll_handle, _, _ = ll.low_latency_dispatch(xb, topk, 16, E, use_fp8=False)
    _raises(InvalidArgument, "handle", normal.combine, x, ll_handle, match="low_latency")
    _raises(InvalidArgument, "handle", ll.low_latency_combine, torch.zeros(E, 16, H, dtype=torch.bfloat16), topk, w,
            handle, match="normal")


# --- low-latency mode -----------------------------------------------------------------------------
def test_low_latency_errors(ll, normal, world1):
    topk, w = _topk(), torch.rand(T, K)
    xb = torch.randn(T, H).bfloat16()
    _raises(InvalidArgument, "low_latency_mode", normal.low_latency_dispatch, xb, topk, 16, E)
    _raises(InvalidArgument, "x", ll.low_latency_dispatch, xb.float(), topk, 16, E, match="bfloat16")
    _raises(InvalidArgument, "x", ll.low_latency_dispatch, torch.randn(T, 200).bfloat16(), topk, 16, E,
            match="multiple of 128")
    e = _raises(LimitExceeded, "x", ll.low_latency_dispatch, torch.randn(20, H).bfloat16(),
                torch.randn(20, E).topk(K).indices, 16, E)
    assert e.needed == 20 and e.limit == 16
    bad = topk.clone()
    bad[1, 1] = 99
    _raises(InvalidArgument, "topk_idx", ll.low_latency_dispatch, xb, bad, 16, E, match="id 99")
    _raises(InvalidArgument, "use_ue8m0", ll.low_latency_dispatch, xb, topk, 16, E, use_ue8m0=True)
    _raises(InvalidArgument, "async_finish", ll.low_latency_dispatch, xb, topk, 16, E, async_finish=True,
            return_recv_hook=True)
    _raises(InvalidArgument, "cumulative_local_expert_recv_stats", ll.low_latency_dispatch, xb, topk, 16, E,
            cumulative_local_expert_recv_stats=torch.zeros(E, dtype=torch.int64))
    _raises(InvalidArgument, "dispatch_wait_recv_cost_stats", ll.low_latency_dispatch, xb, topk, 16, E,
            dispatch_wait_recv_cost_stats=torch.zeros(1, 1, dtype=torch.int64))
    e = _raises(LimitExceeded, "num_rdma_bytes", ll.low_latency_dispatch, xb, topk, 64, E)
    assert e.needed == Buffer.get_low_latency_rdma_size_hint(64, H, 1, E)
    _raises(Unsupported, None, ll.low_latency_dispatch, xb, topk, 16, E, use_nvfp4=True, match="use_nvfp4")
    # fork kwargs that ask for nothing are accepted
    ll.low_latency_dispatch(xb, topk, 16, E, use_nvfp4=False, x_global_scale=None)
    recv, _, handle, _, _ = ll.low_latency_dispatch(xb, topk, 16, E, use_fp8=False)
    # a shape that fits is checked once per Buffer (off the eager host path); one that does not is
    # refused at every call
    _raises(LimitExceeded, "num_rdma_bytes", ll.low_latency_dispatch, xb, topk, 64, E)
    _raises(InvalidArgument, "zero_copy", ll.low_latency_combine, recv, topk, w, handle, use_logfmt=True,
            zero_copy=True)  # DeepEP refuses the pair too
    _raises(InvalidArgument, "use_logfmt", ll.low_latency_combine, recv, topk, w, handle, use_logfmt="yes")
    _raises(Unsupported, None, ll.low_latency_combine, recv, topk, w, handle, overlap=True, match="overlap")
    _raises(InvalidArgument, "x", ll.low_latency_combine, recv[:, :8], topk, w, handle, match="shape")
    _raises(InvalidArgument, "topk_weights", ll.low_latency_combine, recv, topk, w.bfloat16(), handle)
    _raises(InvalidArgument, "topk_idx", ll.low_latency_combine, recv, topk[:2], w[:2], handle, match="rows")
    _raises(InvalidArgument, "out", ll.low_latency_combine, recv, topk, w, handle, out=torch.zeros(T, H))
    _raises(InvalidArgument, "rank_to_mask", ll.low_latency_update_mask_buffer, 5, True)
    _raises(InvalidArgument, "mask_status", ll.low_latency_query_mask_buffer, torch.zeros(1, dtype=torch.int64))
    plain = Buffer(world1, 0, ll.num_rdma_bytes, low_latency_mode=True, backend="reference")
    _raises(InvalidArgument, "enable_shrink", plain.low_latency_clean_mask_buffer)
    _raises(InvalidArgument, "hidden", ll.clean_low_latency_buffer, 16, 100, E)


class _EqualToFalse:
    """Equal to False and hashed alike, but not a bool: a signature must tell it apart by its type."""

    def __eq__(self, other):
        return other is False

    def __hash__(self):
        return hash(False)

    def __bool__(self):
        return False


def test_low_latency_checks_are_skipped_only_for_a_signature_that_passed(ll):
    """The checks of a repeated LL call are skipped (validate.CheckedCalls); any change of a tensor's
    dtype, shape, device, layout or contiguity, or of a flag's type, checks the call in full."""
    topk, w = _topk(), torch.rand(T, K)
    xb = torch.randn(T, H).bfloat16()
    for _ in range(2):  # the second round: every signature below is in the cache of passed calls
        recv, _, handle, _, _ = ll.low_latency_dispatch(xb, topk, 16, E, use_fp8=False)
        ll.low_latency_combine(recv, topk, w, handle)
    assert len(ll._ll_dispatch_checked) == 1 and len(ll._ll_combine_checked) == 1
    strided = torch.randn(T, 2 * H).bfloat16()[:, ::2]
    _raises(InvalidArgument, "x", ll.low_latency_dispatch, strided, topk, 16, E, use_fp8=False, match="contiguous")
    _raises(InvalidArgument, "x", ll.low_latency_dispatch, torch.empty(T, H, dtype=torch.bfloat16, device="meta"),
            topk, 16, E, use_fp8=False)
    _raises(InvalidArgument, "use_fp8", ll.low_latency_dispatch, xb, topk, 16, E, use_fp8=torch.tensor(False))
    _raises(InvalidArgument, "use_fp8", ll.low_latency_dispatch, xb, topk, 16, E, use_fp8=_EqualToFalse())
    _raises(InvalidArgument, "num_max_dispatch_tokens_per_rank", ll.low_latency_dispatch, xb, topk, 16.0, E,
            use_fp8=False)
    _raises(InvalidArgument, "x", ll.low_latency_dispatch, [[0.0] * H] * T, topk, 16, E, use_fp8=False)
    bad = topk.clone()
    bad[0, 0] = E  # values are checked at every call on the host
    _raises(InvalidArgument, "topk_idx", ll.low_latency_dispatch, xb, bad, 16, E, use_fp8=False, match=f"id {E}")
    _raises(InvalidArgument, "topk_weights", ll.low_latency_combine, recv, topk, torch.rand(K, T).t(), handle,
            match="contiguous")
    _raises(InvalidArgument, "x", ll.low_latency_combine, recv.float(), topk, w, handle)
    _raises(InvalidArgument, "use_logfmt", ll.low_latency_combine, recv, topk, w, handle, use_logfmt=1.0)
    # an unhashable flag has no signature: checked in full, refused by name (not a TypeError of the cache)
    _raises(InvalidArgument, "use_fp8", ll.low_latency_dispatch, xb, topk, 16, E, use_fp8=[False])
    _raises(InvalidArgument, "use_logfmt", ll.low_latency_combine, recv, topk, w, handle, use_logfmt=[False])
    # the handle is checked at every call, whatever the signature
    _raises(InvalidArgument, "handle", ll.low_latency_combine, recv, topk, w, tuple(handle))
    # and the passed signatures still pass
    recv, _, handle, _, _ = ll.low_latency_dispatch(xb, topk, 16, E, use_fp8=False)
    ll.low_latency_combine(recv, topk, w, handle)


def test_normal_mode_checks_are_skipped_only_for_a_signature_that_passed(normal):
    """The checks of a repeated fresh dispatch are skipped (buffer_normal_checks, validate.CheckedCalls);
    a change of any tensor's signature or of a flag's type checks the call in full; the handle, the
    Config and top-k ids on the host are checked at every call, cached dispatch and combine in full."""
    topk, x, w = _topk(), torch.randn(T, H), torch.rand(T, K)
    lay = _layout(normal, topk)
    for _ in range(2):  # the second round: every signature below is in the cache of passed calls
        recv, _, recv_w, _, handle, _ = normal.dispatch(x, topk_idx=topk, topk_weights=w, **lay)
        normal.dispatch(x, handle=handle)
        normal.combine(recv, handle, topk_weights=recv_w)
    assert len(normal._dispatch_checked) == 1
    _raises(InvalidArgument, "x", normal.dispatch, torch.randn(T, 2 * H)[:, ::2], topk_idx=topk, topk_weights=w, **lay,
            match="contiguous")
    _raises(InvalidArgument, "topk_weights", normal.dispatch, x, topk_idx=topk, topk_weights=w.double(), **lay)
    _raises(InvalidArgument, "expert_alignment", normal.dispatch, x, topk_idx=topk, topk_weights=w, **lay,
            expert_alignment=1.0)
    _raises(InvalidArgument, "async_finish", normal.dispatch, x, topk_idx=topk, topk_weights=w, **lay,
            async_finish=_EqualToFalse())
    _raises(InvalidArgument, "topk_idx", normal.dispatch, x, handle=handle, topk_idx=topk, topk_weights=w)
    _raises(InvalidArgument, "x", normal.combine, recv.t(), handle, topk_weights=recv_w)
    _raises(InvalidArgument, "topk_weights", normal.combine, recv, handle, topk_weights=recv_w.double())
    # an unhashable flag has no signature: checked in full, refused by name
    _raises(InvalidArgument, "async_finish", normal.dispatch, x, handle=handle, async_finish=[False])
    bad = topk.clone()
    bad[0, 0] = E  # values are checked at every call on the host
    _raises(InvalidArgument, "topk_idx", normal.dispatch, x, topk_idx=bad, topk_weights=w, **lay, match=f"id {E}")
    _raises(InvalidArgument, "handle", normal.dispatch, x, handle=tuple(handle))
    _raises(InvalidArgument, "handle", normal.combine, recv, tuple(handle), topk_weights=recv_w)
    _raises(InvalidArgument, "config", normal.combine, recv, handle, topk_weights=recv_w, config={"num_sms": 20})
    # and the passed signatures still pass
    recv, _, recv_w, _, handle, _ = normal.dispatch(x, topk_idx=topk, topk_weights=w, **lay)
    normal.combine(recv, handle, topk_weights=recv_w)


def test_checked_calls_stay_bounded():
    from uccl_ep.validate import CheckedCalls
    seen = CheckedCalls(limit=4)
    for i in range(10):
        seen.add((i,))
        assert (i,) in seen and len(seen) <= 4
    seen.add(None)
    assert None not in seen


def test_raw_buffer_views(world1):
    buf = Buffer(world1, 1 << 12, 1 << 13, low_latency_mode=True, backend="reference")
    view = buf.get_local_buffer_tensor(torch.int32, offset=64)
    assert view.numel() == ((1 << 12) - 64) // 4 and view.dtype == torch.int32
    rdma = buf.get_local_buffer_tensor(torch.int8, use_rdma_buffer=True)
    rdma.fill_(3)
    assert buf.get_local_buffer_tensor(torch.int8, size=torch.Size([2, 4]), use_rdma_buffer=True).sum() == 24
    _raises(InvalidArgument, "offset", buf.get_local_buffer_tensor, torch.int32, offset=2)
    _raises(LimitExceeded, "size", buf.get_local_buffer_tensor, torch.int32, size=torch.Size([1 << 20]))
    _raises(InvalidArgument, "dtype", buf.get_local_buffer_tensor, "int8")
    assert buf.get_comm_stream() is None  # CPU buffers have no stream
    ev = Buffer.capture()
    assert isinstance(ev, EventOverlap) and ev.event.event is None
    with ev:
        pass
    ev.current_stream_wait()


def _divisibility_worker(rank, world):
    buf = Buffer(dist.group.WORLD, 1 << 22, Buffer.get_low_latency_rdma_size_hint(8, H, world, 8), True,
                 backend="reference")
    topk = torch.zeros(4, 1, dtype=torch.int64)
    errors = []
    for fn in (lambda: buf.get_dispatch_layout(topk, 7),
               lambda: buf.low_latency_dispatch(torch.zeros(4, H, dtype=torch.bfloat16), topk, 8, 7)):
        try:
            fn()
        except InvalidArgument as e:
            errors.append((e.argument, "multiple of the group size 2" in str(e)))
    # num_max must agree across ranks
    try:
        buf.low_latency_dispatch(torch.zeros(4, H, dtype=torch.bfloat16), topk, 8 - 4 * rank, 8)
    except InvalidArgument as e:
        errors.append((e.argument, "same value on every rank" in str(e)))
    return errors


def test_group_dependent_errors():
    for errors in run_ranks(_divisibility_worker, 2):
        assert errors == [("num_experts", True), ("num_experts", True),
                          ("num_max_dispatch_tokens_per_rank", True)]


def test_config_must_be_a_config(normal):
    assert Config(24, 6, 256) != Config(24, 8, 256)


def test_check_combine_rows_names_the_argument():
    from uccl_ep.validate import check_combine_rows
    x = torch.zeros(6, 8, dtype=torch.bfloat16)
    check_combine_rows(x, 6, torch.zeros(6, 2), "cuda")  # as the handle says: nothing raised
    check_combine_rows(x, 6, None, "cuda")
    with pytest.raises(Unsupported, match="cuda backend combines BF16 only"):
        check_combine_rows(x.float(), 6, None, "cuda")
    with pytest.raises(InvalidArgument) as e:
        check_combine_rows(x, 5, None, "cuda")
    assert e.value.argument == "x" and "5 rows" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        check_combine_rows(x, 6, torch.zeros(4, 2), "cuda")
    assert e.value.argument == "topk_weights" and "6 rows" in str(e.value)
