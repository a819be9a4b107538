"""Regression tests of the smaller holes of the hostile-input review that the suite's refusals do
not show: settings that were ignored, messages that read wrong."""

import pytest

from uccl_ep import Buffer
from uccl_ep.errors import InvalidArgument
from uccl_ep.proxy import native

pytestmark = pytest.mark.cpu


def test_num_proxy_threads_is_honoured_by_the_host_executor(world1):
    # 2 FIFOs per proxy thread; the host executor used to pick its own count (cores / local ranks)
    for threads in (1, 3):
        buf = Buffer(world1, 1 << 20, 0, backend="host", num_proxy_threads=threads, explicitly_destroy=True)
        try:
            assert buf._executor.proxy.num_fifos == 2 * threads
        finally:
            buf.destroy()


def test_native_errors_say_expected_once():
    C = native()
    with pytest.raises(InvalidArgument) as e:
        C.Proxy(dict(num_counters=0, token_digest="0" * 64))
    assert e.value.argument == "num_counters" and e.value.got == "0", str(e.value)
    assert "expected expected" not in str(e.value) and "expected 1..8192, got 0" in str(e.value)
