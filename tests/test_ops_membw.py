"""The cpu_membw bandwidth probes compute what they claim (the benchmark's GB/s rest on it)."""

import torch

from dslaunch.kernels import load_op


def test_membw_copy_triad_read():
    op = load_op("cpu_membw")
    assert op is not None
    for n in (1, 17, 100_003):
        a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)
        op.copy(a.data_ptr(), b.data_ptr(), n, 2)
        assert torch.equal(a, b)
        op.triad(a.data_ptr(), b.data_ptr(), c.data_ptr(), 3.0, n, 2)
        torch.testing.assert_close(a, b + 3.0 * c, rtol=1e-6, atol=0)
        assert abs(op.read(b.data_ptr(), n, 2) - b.double().sum().item()) <= 1e-4 * n


def test_membw_adam_traffic_updates_three_arrays_from_the_fourth():
    op = load_op("cpu_membw")
    for n in (1, 17, 100_003):
        a, b, c, d = (torch.rand(n) for _ in range(4))
        want = [x + d for x in (a, b, c)]
        op.adam_traffic(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), n, 2)
        for got, w in zip((a, b, c), want):
            assert torch.equal(got, w)
