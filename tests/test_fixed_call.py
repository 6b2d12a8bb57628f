"""FixedSignatureCall (eagle_ms/models/fixed_call.py): compiled once, later calls on MindSpore's predict path
(no per-call compile check), same results as the plain Cell, and a call with another signature refused."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from eagle_ms.models.fixed_call import PREDICT_PHASE, FixedSignatureCall

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


def accumulate_body(*bases):
    """A Cell class on ``bases``: total += x @ w (a Parameter updated in place, as the step graphs' caches
    are); returns the new total."""

    class Accumulate(*bases):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 7), name="w")
            self.total = Parameter(Tensor(np.zeros((2, 4), np.float32)), name="total")

        def construct(self, x):
            return ops.assign(self.total, self.total + ops.matmul(x, self.w))

    return Accumulate


Accumulate, FixedAccumulate = accumulate_body(nn.Cell), accumulate_body(FixedSignatureCall, nn.Cell)


def test_fixed_cell_runs_the_compiled_graph_without_recompiling_and_matches_the_plain_cell(monkeypatch):
    fixed, plain = FixedAccumulate(), Accumulate()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(4)]
    want = np.zeros((2, 4))
    for x in xs:  # NumPy float64 reference of the running total
        want = want + x.astype(np.float64) @ (np.arange(12).reshape(3, 4) / 7)
    got = fixed(Tensor(xs[0])).asnumpy()
    assert fixed.phase == PREDICT_PHASE and PREDICT_PHASE in fixed.phase_cache and len(fixed.compile_cache) == 1

    def no_compile(*args, **kwargs):
        raise AssertionError("a FixedSignatureCall call after the first went through Cell.compile")

    monkeypatch.setattr(fixed, "compile", no_compile)
    for x in xs[1:]:
        got = fixed(Tensor(x)).asnumpy()
    for x in xs:
        plain_out = plain(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(got, plain_out)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fixed_cell_refuses_another_shape_or_dtype_naming_the_argument():
    fixed = FixedAccumulate()
    fixed(Tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match=r"argument 0 has shape/dtype \(\(3, 3\)"):
        fixed(Tensor(np.zeros((3, 3), np.float32)))
    with pytest.raises(ValueError, match="argument 0 has shape/dtype"):
        fixed(Tensor(np.zeros((2, 3), np.float16)))
    with pytest.raises(ValueError, match="2 arguments, compiled for 1"):
        fixed(Tensor(np.zeros((2, 3), np.float32)), Tensor(np.zeros((2, 3), np.float32)))
    np.testing.assert_array_equal(fixed.total.asnumpy(), 0)  # nothing ran
