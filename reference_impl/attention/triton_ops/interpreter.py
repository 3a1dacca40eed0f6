"""Triton's interpreter with a ``tl.dot`` whose every output element is computed the same way at any tile shape.

The interpreter computes ``tl.dot`` with ``np.matmul``, that is with the BLAS numpy links. Some BLAS
kernels sum one output element in an order that depends on the operands' shape: OpenBLAS's Haswell
sgemm (what ``OPENBLAS_CORETYPE=Haswell`` selects, also on AVX-512 machines) gives row i of a 16-row
product other bits than row i of a 64-row one. Kernels that cut the same rows into other tiles then
disagree bitwise, and a request alone and in a batch differ: the batch-invariance oracle would report
the BLAS, not the data plane. ``np.einsum`` (without ``optimize``) never calls BLAS; it sums each
element over k in one fixed order, whatever the tile's other dimensions, on every machine.
"""
from __future__ import annotations

import numpy as np
from triton.runtime import interpreter


def _tile_invariant_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    a_data, b_data = a.data, b.data
    if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
       (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
        a_data = interpreter._convert_float(a_data, a.dtype, interpreter.tl.float16, None).view(np.float16)
        b_data = interpreter._convert_float(b_data, b.dtype, interpreter.tl.float16, None).view(np.float16)
    product = np.einsum("...mk,...kn->...mn", a_data, b_data, dtype=d.data.dtype, optimize=False)
    return interpreter.TensorHandle(product + d.data, d.dtype.scalar)


def install() -> None:
    """Route every interpreted ``tl.dot`` of this process through ``_tile_invariant_dot``."""
    interpreter.InterpreterBuilder.create_dot = _tile_invariant_dot
