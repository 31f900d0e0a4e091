"""TensorFlow's own values in the cross-device strategies: ``tf.distribute.ReduceOp``,
``tf.Tensor``, ``tf.Variable`` and ``tf.IndexedSlices``.

TensorFlow is never imported here: an object is TensorFlow's when its type comes from a
``tensorflow`` module (an object of a framework that was never imported cannot exist), and the
module that makes results is the one already in ``sys.modules``. Values are read with their
``numpy()`` method (a variable's current value); results are made with ``tf.convert_to_tensor``.
Symbolic tensors inside ``tf.function`` have no values and are refused.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

import numpy as np

_TF_MODULE = "tensorflow"


def is_tf(value: Any) -> bool:
    """Whether ``value`` is an object of TensorFlow's (judged by its type's module)."""
    module = type(value).__module__
    return module == _TF_MODULE or module.startswith(_TF_MODULE + ".")


def op_name(value: Any) -> str | None:
    """``"SUM"``/``"MEAN"`` for a ``tf.distribute.ReduceOp``, else None."""
    return value.value if is_tf(value) and isinstance(value, enum.Enum) else None


def is_slices(value: Any) -> bool:
    """Whether ``value`` is a ``tf.IndexedSlices``."""
    return is_tf(value) and type(value).__name__ == "IndexedSlices"


def to_numpy(value: Any, argument: str, fn: str) -> np.ndarray:
    """The values of a ``tf.Tensor`` or ``tf.Variable`` as a numpy array.

    Raises:
        TypeError: a symbolic tensor (inside ``tf.function``), or an object without values.
    """
    try:
        return np.asarray(value.numpy())
    except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
        raise TypeError(f"{fn}: {argument} is a TensorFlow {type(value).__name__} without values "
                        f"(a symbolic tensor inside tf.function?); call eagerly: {exc}") from exc


def tensor(array: np.ndarray) -> Any:
    """A new ``tf.Tensor`` holding ``array``."""
    return sys.modules[_TF_MODULE].convert_to_tensor(array)


def indexed_slices(values: np.ndarray, indices: np.ndarray, dense_shape: tuple[int, ...]) -> Any:
    """A new ``tf.IndexedSlices`` (int64 indices and dense shape, as TF's gradients use)."""
    tf = sys.modules[_TF_MODULE]
    return tf.IndexedSlices(tf.convert_to_tensor(values), tf.convert_to_tensor(indices, dtype=tf.int64),
                            tf.convert_to_tensor(np.asarray(dense_shape, dtype=np.int64)))
