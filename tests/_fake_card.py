"""A CPU stand-in for a GPU, for tests of where blochsim puts its tensors on a machine without one.

`card(t)` makes a tensor of class `OnCard`: CPU memory that says it lives on cuda:0 (`device`, `is_cpu`,
`is_cuda`). Inside `fake_card()`:

* an operation that meets an `OnCard` tensor and a CPU tensor of one or more dimensions raises `Mismatch`,
  as torch does on a GPU ("Expected all tensors to be on the same device"); a CPU scalar (0-d) is
  accepted, except by the operations in `_STRICT` (cat, stack, indexing ops, equal), and CPU index tensors
  are accepted by `t[index]`. `.numpy()` of a card tensor raises torch's TypeError.
* `.to("cuda")`, `.cuda()` and torch's factories given `device="cuda"` make `OnCard` tensors (the factories as
  blochsim's modules call them: their `torch` is a proxy for the duration); `.cpu()` and `.to("cpu")` make
  plain ones, and record a host read in `SYNCS`, as do `item`, `tolist`, `bool`, `float`, `int` and `equal`
  of a card tensor (`TRACE = True` records where).
* the kernel passes (`blochsim.engine.kernels.forward`, `jvp`, `vjp`, `vjp_jvp`) of a `Static` on cuda run
  the host build on the same memory, in float32 only, as the CUDA build: float64 raises, and a forward or
  JVP input that is a plain CPU tensor raises `Mismatch`.

Results of operations on `OnCard` tensors are `OnCard` (torch's subclass rules), so the devices propagate
through blochsim as they would on a GPU, with the host's arithmetic. What the stand-in cannot place: the
tensors autograd makes itself (gradients, and saved tensors whose Python object died), which stay plain,
so gradient devices are checked on a GPU only, and backward kernel passes are not checked for plain inputs.
"""

import contextlib
import dataclasses
import sys
import traceback
import types

import torch
from torch.utils._pytree import tree_flatten

CARD = torch.device("cuda", 0)
CPU = torch.device("cpu")
SYNCS: list = []
TRACE = False


def _card_device(d) -> bool:
    if isinstance(d, int) and not isinstance(d, bool):
        return True
    if isinstance(d, str):
        return d.split(":")[0] == "cuda"
    return isinstance(d, torch.device) and d.type == "cuda"


def _host_device(d) -> bool:
    if isinstance(d, str):
        return d == "cpu"
    return isinstance(d, torch.device) and d.type == "cpu"


class Mismatch(RuntimeError):
    """Tensors of the card and of the host met in one operation (torch raises RuntimeError on a GPU)."""


#: Operations that take no CPU scalar beside a GPU tensor either.
_STRICT = {"cat", "stack", "index_select", "equal", "index_add", "index_add_", "scatter_reduce", "scatter",
           "scatter_", "index_put", "index_put_"}
#: Operations that read a value of the card on the host (on a GPU: a wait for the card).
_SYNCS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "equal"}


def _note(name):
    SYNCS.append(name if not TRACE else (name, "".join(traceback.format_stack(limit=8)[:-2])))


_DEVICE, _IS_CPU, _IS_CUDA = torch.Tensor.device.__get__, torch.Tensor.is_cpu.__get__, torch.Tensor.is_cuda.__get__


class OnCard(torch.Tensor):
    """A CPU tensor playing a tensor on cuda:0 (module doc)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func == _DEVICE:
            return CARD
        if func == _IS_CPU:
            return False
        if func == _IS_CUDA:
            return True
        if name == "numpy":
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if name in _SYNCS:
            _note(name)
        if name not in ("copy_", "__setitem__", "__getitem__", "_to_copy"):
            plain = [t for t in tensors if not isinstance(t, OnCard) and (t.dim() > 0 or name in _STRICT)]
            if plain:
                raise Mismatch(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! ({name})")
        elif name == "__setitem__":
            value = args[2] if len(args) > 2 else None
            if isinstance(value, torch.Tensor) and not isinstance(value, OnCard) and value.dim() > 0:
                raise Mismatch("index_put: values on cpu, tensor on cuda:0")
        return super().__torch_function__(func, types, args, kwargs)


_ORIGINAL = {}


def _moved(self, out, target_card: bool):
    if target_card:
        if isinstance(out, OnCard):
            return out
        return out.as_subclass(OnCard)
    if isinstance(self, OnCard):
        _note("to_host")
    if isinstance(out, OnCard):
        with torch._C.DisableTorchFunctionSubclass():
            out = out.view_as(out) if out is self else out
        return torch.Tensor.as_subclass(out, torch.Tensor)
    return out


def _to(self, *args, **kwargs):
    target = kwargs.pop("device", None)
    rest = []
    for a in args:
        if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool)):
            target = a
        elif isinstance(a, torch.Tensor):
            target = a.device
            rest.append(a.dtype)
        else:
            rest.append(a)
    if target is None:
        with torch._C.DisableTorchFunctionSubclass():
            out = _ORIGINAL["to"](self, *rest, **kwargs)
        return out if not isinstance(self, OnCard) or isinstance(out, OnCard) else out.as_subclass(OnCard)
    with torch._C.DisableTorchFunctionSubclass():
        out = _ORIGINAL["to"](self, *rest, **kwargs)
    return _moved(self, out, _card_device(target))


def _cuda(self, *args, **kwargs):
    return _moved(self, self, True)


def _cpu(self, *args, **kwargs):
    return _moved(self, self, False)


_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "linspace", "eye", "zeros_like",
              "ones_like", "empty_like", "full_like", "rand", "randn")


def _factory(original):
    def make(*args, **kwargs):
        device = kwargs.get("device")
        if _card_device(device):
            kwargs["device"] = CPU
            out = original(*args, **kwargs)
            if isinstance(out, OnCard):
                return out
            return out.as_subclass(OnCard)
        if _host_device(device) and args and isinstance(args[0], OnCard) and original.__name__ == "as_tensor":
            return _cpu(args[0]).to(kwargs.get("dtype") or args[0].dtype)
        return original(*args, **kwargs)
    return make


def _plain(x):
    if isinstance(x, OnCard):
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.as_subclass(x, torch.Tensor)
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        raise Mismatch("a kernel input on the host, the kernel on cuda:0")
    return x


def _on_card(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_on_card(v) for v in x)
    return x.as_subclass(OnCard) if isinstance(x, torch.Tensor) and not isinstance(x, OnCard) else x


def _kernel(original):
    """The host build serving a pass whose data is on the stand-in card: float32 only, as the CUDA build."""

    def run(st, *args, **kwargs):
        if st.device.type != "cuda":
            return original(st, *args, **kwargs)
        if st.dtype != torch.float32:
            raise RuntimeError("the CUDA kernels take float32 (dtype 0); float64 runs on the host build")
        host = dataclasses.replace(st, device=CPU, action=_plain(st.action), record=_plain(st.record),
                                   interval=None if st.interval is None else _plain(st.interval))

        def down(x, strict):
            if isinstance(x, (list, tuple)):
                return type(x)(down(v, strict) for v in x)
            if not isinstance(x, torch.Tensor):
                return x
            return _plain(x) if strict or isinstance(x, OnCard) else x

        # A forward pass's inputs (and a JVP's tangents) must be on the card. A backward pass (vjp, vjp_jvp)
        # reads what autograd kept and made, which the stand-in cannot place: a saved tensor whose Python
        # object died comes back as a plain one, and cotangents are plain. The same inputs were checked by
        # the forward pass that saved them.
        strict = {"forward": 1, "jvp": 2}.get(original.__name__, 0)
        return _on_card(original(host, *[down(a, i < strict) for i, a in enumerate(args)],
                                 **{k: down(v, False) for k, v in kwargs.items()}))
    return run


class _TorchOnCard(types.ModuleType):
    """`torch` as blochsim's modules see it under the stand-in: its factories place `device="cuda"` on the
    card. (Patching torch itself would reach torch's own scripted code, which cannot take a wrapper.)"""

    def __init__(self):
        super().__init__("torch")
        for name in _FACTORIES:
            setattr(self, name, _factory(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def fake_card():
    """Tensors of class OnCard play CUDA tensors; the host build's kernels serve them, refusing float64 as
    the CUDA build does. Records host reads of card values in SYNCS."""
    from blochsim.engine import kernels as K

    passes = {name: getattr(K, name) for name in ("forward", "jvp", "vjp", "vjp_jvp")}
    for name, original in passes.items():
        setattr(K, name, _kernel(original))
    for name in ("to", "cuda", "cpu"):
        _ORIGINAL[name] = getattr(torch.Tensor, name)
    torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu = _to, _cuda, _cpu
    proxy = _TorchOnCard()
    modules = [m for name, m in list(sys.modules.items())
               if (name == "blochsim" or name.startswith("blochsim.")) and getattr(m, "torch", None) is torch]
    for module in modules:
        module.torch = proxy
    SYNCS.clear()
    try:
        yield SYNCS
    finally:
        for name, original in passes.items():
            setattr(K, name, original)
        for name in ("to", "cuda", "cpu"):
            setattr(torch.Tensor, name, _ORIGINAL[name])
        for module in modules:
            module.torch = torch


def card(t, requires_grad=None):
    """`t` (a CPU tensor) on the stand-in card, as a leaf."""
    out = t.detach().clone().as_subclass(OnCard)
    return out.requires_grad_(t.requires_grad if requires_grad is None else requires_grad)
