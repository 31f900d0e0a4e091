"""Adapters in one process: zero-copy views, write-back, new arrays of the caller's kind, refusals.

The multi-rank checks of every collective over each framework's tensors are in
test_framework_collectives.py; this file needs no ranks.
"""

from __future__ import annotations

import array
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from tensorcomm.adapters.registry import ADAPTERS, adapter_for
from tensorcomm.frontends.arrays import Staged


def test_importing_tensorcomm_imports_no_framework() -> None:
    code = ("import sys, numpy as np, tensorcomm, tensorcomm.ops\n"
            "from tensorcomm.adapters.registry import adapter_for\n"
            "for obj in (np.ones(2), bytearray(2)):\n"
            "    adapter_for(obj, 'x')\n"
            "try:\n"
            "    adapter_for(object(), 'x')\n"
            "except TypeError:\n"
            "    pass\n"
            "print(sorted(m for m in ('torch', 'jax', 'mindspore') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("obj", [[1.0, 2.0], 3.0, "text", None, {"a": 1}])
def test_unsupported_objects_get_a_type_error_listing_every_kind(obj: object) -> None:
    with pytest.raises(TypeError) as info:
        adapter_for(obj, "all_reduce: tensor")
    message = str(info.value)
    assert message.startswith("all_reduce: tensor: expected an array")
    for adapter in ADAPTERS:
        assert adapter.name in message


# -- buffer protocol and __array_interface__ --------------------------------------------------

def test_buffer_objects_are_zero_copy_and_writable_when_the_buffer_is() -> None:
    data = bytearray(4)
    staged = Staged(data, "x", writable=True)
    staged.buf[...] = [1, 2, 3, 4]
    staged.commit()
    assert data == bytearray([1, 2, 3, 4])
    floats = array.array("f", [1.0, 2.0])
    assert Staged(floats, "x", writable=False).array.dtype == np.float32
    with pytest.raises(ValueError, match="read-only"):
        Staged(b"abcd", "x", writable=True)


def test_array_interface_objects_are_read_through_it() -> None:
    class Interface:
        def __init__(self, backing: np.ndarray) -> None:
            self.__array_interface__ = backing.__array_interface__

    backing = np.zeros(3, np.int32)
    staged = Staged(Interface(backing), "x", writable=True)
    staged.buf[...] = 7
    staged.commit()
    assert (backing == 7).all()
    assert isinstance(staged.adapter.new_like(staged.obj, np.ones(2)), np.ndarray)


# -- DLPack -----------------------------------------------------------------------------------

class _DLPackOnly:
    """An object known only through DLPack, optionally with an array-API namespace."""

    def __init__(self, backing: np.ndarray, namespace: bool = False) -> None:
        self._backing = backing
        if namespace:
            self.__array_namespace__ = lambda: np

    def __dlpack__(self, **kwargs: object) -> object:
        return self._backing.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._backing.__dlpack_device__()


def test_dlpack_objects_are_written_in_place_and_returned_through_their_namespace() -> None:
    backing = np.zeros(4, np.float64)
    staged = Staged(_DLPackOnly(backing), "x", writable=True)
    assert staged.adapter.name.startswith("objects with __dlpack__")
    staged.buf[...] = 2.5
    staged.commit()
    assert (backing == 2.5).all()
    returned = staged.adapter.new_like(_DLPackOnly(backing, namespace=True), np.ones(3))
    assert isinstance(returned, np.ndarray) and returned.tolist() == [1.0, 1.0, 1.0]


def test_dlpack_objects_off_the_cpu_are_refused() -> None:
    class OnDevice(_DLPackOnly):
        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)  # kDLCUDA

    with pytest.raises(TypeError, match="host memory only"):
        Staged(OnDevice(np.zeros(2)), "x", writable=False)


# -- torch ------------------------------------------------------------------------------------

def test_torch_tensors_are_numpy_views_of_their_memory() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    staged = Staged(tensor, "x", writable=True)
    assert staged.adapter.name == "torch.Tensor (CPU)"
    assert staged.buf.ctypes.data == tensor.data_ptr()  # zero-copy
    staged.buf[...] = 5
    staged.commit()
    assert (tensor == 5).all()


def test_torch_storage_stays_resizable_after_a_call() -> None:
    # FSDP frees gathered parameters by resizing their storage to zero; Tensor.numpy() would
    # forbid that for good ("Trying to resize storage that is not resizable").
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16):
        tensor = torch.ones(8, dtype=dtype)
        staged = Staged(tensor, "x", writable=True)
        staged.buf[...] = 2
        staged.commit()
        del staged
        tensor.untyped_storage().resize_(0)
        assert tensor.untyped_storage().size() == 0


def test_torch_bfloat16_travels_as_raw_16_bit_words() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.tensor([1.5, -2.25, 3e30, 1e-20], dtype=torch.bfloat16)
    view = Staged(tensor, "x", writable=True).array
    assert view.dtype == ml_dtypes.bfloat16 and view.ctypes.data == tensor.data_ptr()
    assert (view.view(np.int16) == tensor.view(torch.int16).numpy()).all()
    returned = adapter_for(tensor, "x").new_like(tensor, view * 2)
    assert returned.dtype == torch.bfloat16 and torch.equal(returned, tensor * 2)


def test_non_contiguous_torch_outputs_are_written_back_through_the_view() -> None:
    torch = pytest.importorskip("torch")
    base = torch.zeros(4, 6)
    column_block = base[:, 1:5:2].t()  # strided and transposed
    staged = Staged(column_block, "x", writable=True)
    assert staged.buf is not staged.array and staged.buf.flags.c_contiguous
    staged.buf[...] = np.arange(8).reshape(2, 4)
    staged.commit()
    assert torch.equal(column_block, torch.arange(8.0).reshape(2, 4))
    assert base.sum().item() == sum(range(8))


def test_torch_lazy_conjugates_are_resolved_and_written_back_with_their_bit() -> None:
    torch = pytest.importorskip("torch")
    source = torch.tensor([1 + 2j, 3 - 1j])
    conj = source.conj()
    staged = Staged(conj, "x", writable=True)
    assert staged.array.tolist() == [1 - 2j, 3 + 1j]
    staged.buf[...] = [5 + 5j, 6 - 6j]
    staged.commit()
    assert conj.tolist() == [5 + 5j, 6 - 6j] and conj.is_conj()


def test_torch_outputs_requiring_grad_are_written_detached_and_their_version_bumped() -> None:
    torch = pytest.importorskip("torch")
    weight = torch.nn.Parameter(torch.ones(3))
    before = weight._version
    staged = Staged(weight, "x", writable=True)
    staged.buf[...] = 4
    staged.commit()
    assert weight.requires_grad and (weight.detach() == 4).all()
    assert weight._version > before  # autograd sees the in-place write


def test_torch_tensors_tensorcomm_cannot_use_are_refused_clearly() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="CPU tensors"):
        Staged(torch.empty(2, device="meta"), "x", writable=False)
    with pytest.raises(TypeError, match="dense"):
        Staged(torch.eye(2).to_sparse(), "x", writable=False)
    with pytest.raises(TypeError, match="float8"):
        Staged(torch.zeros(2, dtype=torch.float8_e4m3fn), "x", writable=False)
    with pytest.raises(ValueError, match="expanded"):
        Staged(torch.zeros(1).expand(3), "x", writable=True)
    assert Staged(torch.zeros(1).expand(3), "x", writable=False).buf.shape == (3,)


# -- JAX --------------------------------------------------------------------------------------

def test_jax_arrays_are_inputs_and_refused_as_in_place_outputs() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.arange(4, dtype=jnp.bfloat16)
    staged = Staged(x, "x", writable=False)
    assert staged.array.dtype == ml_dtypes.bfloat16 and staged.array.tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match=r"tensorcomm\.ops"):
        Staged(x, "all_reduce: tensor", writable=True)
    returned = staged.adapter.new_like(x, np.ones(2, ml_dtypes.bfloat16))
    assert isinstance(returned, jax.Array) and returned.dtype == jnp.bfloat16


def test_traced_jax_values_are_refused() -> None:
    jax = pytest.importorskip("jax")
    errors = []

    def traced(y):  # type: ignore[no-untyped-def]
        try:
            Staged(y, "x", writable=False)
        except TypeError as exc:
            errors.append(str(exc))
        return y

    jax.jit(traced)(jax.numpy.ones(2))
    assert errors and "traced" in errors[0]


# -- MindSpore ---------------------------------------------------------------------------------

def test_mindspore_tensors_round_trip_in_place_and_as_new_tensors() -> None:
    ms = pytest.importorskip("mindspore")
    tensor = ms.Tensor(np.zeros(4, np.float32))
    staged = Staged(tensor, "x", writable=True)
    assert staged.adapter.name == "mindspore.Tensor"
    staged.buf[...] = 3
    staged.commit()
    assert (tensor.asnumpy() == 3).all()
    half = ms.Tensor(np.ones(3, np.float32)).astype(ms.bfloat16)
    staged = Staged(half, "x", writable=True)
    assert staged.array.dtype == ml_dtypes.bfloat16
    staged.buf[...] = 2.5
    staged.commit()
    assert (half.astype(ms.float32).asnumpy() == 2.5).all()
    returned = staged.adapter.new_like(half, np.full(2, 1.5, ml_dtypes.bfloat16))
    assert isinstance(returned, ms.Tensor) and returned.dtype == ms.bfloat16
