"""Arrays in and out of MLX by their raw bits, for the MLX ranks of the interop tests
(engine/tests/interop/mlx_rank.py, and tests/interop/mlx_rank.py, which imports this file
from here).

Every array goes through its raw bits both ways, so NaN payloads and signed zeros reach MLX
untouched (numpy float64 would otherwise be converted to MLX's default float32).
"""

import mlx.core as mx
import numpy as np

# dtype name -> (MLX dtype, unsigned numpy type of the same width).
DTYPES = {
    "bool": (mx.bool_, np.bool_),
    "uint8": (mx.uint8, np.uint8),
    "uint16": (mx.uint16, np.uint16),
    "uint32": (mx.uint32, np.uint32),
    "uint64": (mx.uint64, np.uint64),
    "int8": (mx.int8, np.uint8),
    "int16": (mx.int16, np.uint16),
    "int32": (mx.int32, np.uint32),
    "int64": (mx.int64, np.uint64),
    "float16": (mx.float16, np.uint16),
    "bfloat16": (mx.bfloat16, np.uint16),
    "float32": (mx.float32, np.uint32),
    "float64": (mx.float64, np.uint64),
    "complex64": (mx.complex64, np.uint64),
}
BITS = {np.bool_: mx.bool_, np.uint8: mx.uint8, np.uint16: mx.uint16, np.uint32: mx.uint32, np.uint64: mx.uint64}


def load(path, dtype, shape=None):
    """The array of `dtype` whose raw little-endian bits `path` holds, row-major, in
    `shape` (one dimension when it is None)."""
    mx_dtype, np_bits = DTYPES[dtype]
    host = np.fromfile(path, dtype=np.uint8).view(np_bits)
    if shape is not None:
        host = host.reshape(shape)
    arr = mx.array(host, dtype=BITS[np_bits])
    return arr if mx_dtype == BITS[np_bits] else arr.view(mx_dtype)


def store(path, arr, dtype):
    """Writes the raw bits of `arr` (of `dtype`) to `path`, row-major."""
    _, np_bits = DTYPES[dtype]
    if arr.dtype != BITS[np_bits]:
        arr = arr.view(BITS[np_bits])
    np.ascontiguousarray(np.asarray(arr)).tofile(path)
