"""Noticing that a module changed since it was compiled: :class:`WeightWatch`.

What the runtime runs is compiled from a snapshot of a module (batch-norms folded into convs, weights the import
evaluates once, numbers its ``forward`` reads baked into the graph), so a deployed model must notice when the module
changes under it. A watch is armed on the module as it is when it is compiled; :meth:`WeightWatch.changed` then
answers per call, cheaply:

* a parameter, buffer or tensor attribute changed in place (``p.mul_(0.9)``, ``torch.nn.init``, ``load_state_dict``,
  batch-norm statistics updated by a forward in training mode, ``bn.reset_running_stats()``): its version counter,
  which every in-place change increases, differs from the one recorded (read per call for every such tensor: the
  only per-tensor cost);
* an optimizer step, fused ones included (``Adam(..., fused=True)`` writes the parameters without increasing their
  counters): a global optimizer step post-hook increases the counters of every parameter the optimizer holds;
* any other attribute of a submodule set (a number its ``forward`` reads, ``bn.eps``, ``act.negative_slope``,
  ``conv.dilation``): ``nn.Module.__setattr__``, wrapped once for the process, marks the watches of that submodule
  (it is inert while torch.compile or torch.export traces, and costs one dictionary lookup per attribute set on any
  module); a submodule put into training mode is counted instead (:attr:`WeightWatch.training`), since that changes
  what runs (the original module), not what is compiled;
* a forward hook or pre-hook added or removed (on a submodule, or globally): torch numbers every hook handle it
  creates, and where that number moved, or a hook the module had is gone, the watch compares the hooks;
* a parameter, buffer or submodule replaced (assignment, ``load_state_dict(assign=True)``): torch's global
  registration hooks count every registration in the process, and where the count moved since the last check the
  watch compares the module's tensors and submodules by identity;
* the whole module converted in place (``model.half()``, ``model.to("cuda")``,
  ``model.to(memory_format=torch.channels_last)``, which swap each tensor's data under it): the data pointer of its
  first parameter or of its first 4-D one moved.

Not seen: changes through ``tensor.data`` (which bypasses the version counter), attributes written around
``nn.Module.__setattr__`` (``object.__setattr__``, ``module.__dict__[...]``), in place edits of a mutable attribute
(a list or dict the forward reads), state outside the module (globals, another object's attributes, the class's own
code) and tensors created in inference mode (they have no version counter); after those, drop the compiled form by
hand. The watch installs nothing on the user's module: a copy or a pickle of it is unaffected, and a copy of a watch
is unarmed (it reports a change until it is armed on its module).
"""

from __future__ import annotations

import threading
import weakref
from operator import attrgetter
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules import module as torch_module
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

_version = attrgetter("_version")
#: Registrations of a parameter, buffer or submodule anywhere in the process (once a watch has been armed).
_registrations = [0]
#: The watches over each watched submodule, by the submodule's id.
_watchers: dict[int, weakref.WeakSet[WeightWatch]] = {}
_installed: list[Any] = []  # what :func:`_install` installed (torch's hook handles, the wrapped __setattr__)
_install_lock = threading.Lock()
_ABSENT = object()
#: Values equal by ``==`` that are the same setting (a number set again to itself is no change).
_PLAIN = (bool, int, float, complex, str, bytes, tuple, type(None))
#: The hooks a module's call runs around its forward, which an import traces into the graph.
_GLOBAL_HOOKS = (torch_module._global_forward_pre_hooks, torch_module._global_forward_hooks)


class WeightWatch:
    """Whether a module changed since :meth:`arm` (see the module docstring for what it sees)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._marked = True  # until armed
        self._registrations = -1
        self._handles = -1
        self._ids: tuple[int, ...] = ()
        self._training: set[int] = set()
        self._params: tuple[torch.Tensor, ...] = ()
        self._tensors: tuple[torch.Tensor, ...] = ()
        self._versions: tuple[int, ...] = ()
        self._anchors: tuple[torch.Tensor, ...] = ()
        self._pointers: tuple[int, ...] = ()
        self._identities: tuple[int, ...] = ()
        self._hooks: tuple[tuple[int, ...], ...] = ()
        self._hooked: tuple[tuple[dict[int, Any], int], ...] = ()

    def arm(self) -> None:
        """Record the module as it is now."""
        _install()
        self._forget()
        modules = tuple(self.module.modules())
        self._ids = tuple(map(id, modules))
        for key in self._ids:
            _watchers.setdefault(key, weakref.WeakSet()).add(self)
        self._training = {id(m) for m in modules if m.training}
        self._registrations = _registrations[0]
        self._params = tuple(p for p in self.module.parameters() if not p.is_inference())
        attributes = (v for m in modules for v in vars(m).values() if isinstance(v, torch.Tensor))
        tensors = {id(t): t for t in (*self._params, *self.module.buffers(), *attributes) if not t.is_inference()}
        self._tensors = tuple(tensors.values())
        self._versions = tuple(map(_version, self._tensors))
        first_4d = [p for p in self._params if p.dim() == 4][:1]
        self._anchors = tuple({id(p): p for p in (*self._params[:1], *first_4d)}.values())
        self._pointers = tuple(p.data_ptr() for p in self._anchors)
        self._identities = _identities(self.module)
        self._handles = RemovableHandle.next_id
        self._hooks = _hook_keys(modules)
        self._hooked = tuple((d, len(d)) for d in _hook_dicts(modules) if d)
        self._marked = False

    def changed(self) -> bool:
        """Whether the module changed since :meth:`arm` (true until it is armed again)."""
        if self._marked:
            return True
        if _registrations[0] != self._registrations:
            if _identities(self.module) != self._identities:
                self._marked = True
                return True
            self._registrations = _registrations[0]
        if RemovableHandle.next_id != self._handles or any(len(d) != n for d, n in self._hooked):
            if _hook_keys(self.module.modules()) != self._hooks:
                self._marked = True
                return True
            self._handles = RemovableHandle.next_id
        if tuple(p.data_ptr() for p in self._anchors) != self._pointers:
            return True
        return tuple(map(_version, self._tensors)) != self._versions

    @property
    def training(self) -> bool:
        """Whether the module or any of its submodules is in training mode (kept as modes are set)."""
        return bool(self._training)

    def mark(self) -> None:
        """Note that the module changed."""
        self._marked = True

    def _set(self, module: nn.Module, name: str, old: Any, value: Any) -> None:
        """A submodule's attribute ``name`` was set from ``old`` to ``value`` (:data:`_ABSENT`: it had none)."""
        if name == "training":
            (self._training.add if value else self._training.discard)(id(module))
        elif not (old is value or (old is _ABSENT and name not in vars(module)) or _same(old, value)):
            self._marked = True  # (a parameter, buffer or submodule is not in vars(): its registration is counted)

    def _forget(self) -> None:
        """Stop hearing of the attributes set on the submodules watched so far."""
        for key in self._ids:
            watches = _watchers.get(key)
            if watches is not None:
                watches.discard(self)
                if not watches:
                    del _watchers[key]
        self._ids = ()

    def __getstate__(self) -> dict[str, Any]:
        return {"module": self.module}  # a copy is unarmed: it watches the copied module once armed there

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["module"])  # type: ignore[misc]


def _same(old: Any, value: Any) -> bool:
    """Whether an attribute set from ``old`` to ``value`` keeps its setting (a number set to an equal one)."""
    if type(old) is not type(value) or not isinstance(old, _PLAIN):
        return False
    try:
        return bool(old == value)
    except Exception:  # noqa: BLE001 - a tuple holding something without a plain ==
        return False


def _identities(module: nn.Module) -> tuple[int, ...]:
    """The identities of the module's submodules, parameters and buffers, in order."""
    return tuple(map(id, (*module.modules(), *module.parameters(), *module.buffers())))


def _hook_dicts(modules: Any) -> list[dict[int, Any]]:
    """The forward hook and pre-hook dictionaries of ``modules``, then the global ones."""
    return [d for m in modules for d in (m._forward_pre_hooks, m._forward_hooks)] + list(_GLOBAL_HOOKS)


def _hook_keys(modules: Any) -> tuple[tuple[int, ...], ...]:
    """The handles of the forward hooks and pre-hooks on ``modules`` and of the global ones."""
    return tuple(tuple(d) for d in _hook_dicts(modules))


def _install() -> None:
    """From now on, count every registration of a parameter, buffer or submodule in the process, increase the
    version counters of the parameters an optimizer steps, and tell watches of the attributes set on their
    submodules."""
    with _install_lock:
        if _installed:
            return

        def count(*args: Any) -> None:
            _registrations[0] += 1

        _installed.extend(register(count) for register in (torch_module.register_module_parameter_registration_hook,
                                                           torch_module.register_module_buffer_registration_hook,
                                                           torch_module.register_module_module_registration_hook))
        _installed.append(register_optimizer_step_post_hook(_stepped))
        _installed.append(_wrap_setattr(nn.Module.__setattr__))
        nn.Module.__setattr__ = _installed[-1]  # type: ignore[method-assign]


def follow_optimizer_steps() -> None:
    """Make every optimizer step, fused ones included, increase the version counters of the parameters it holds
    (as an unfused step does), so that whoever compares version counters sees it."""
    _install()


def _stepped(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """A global optimizer step post-hook: a fused step writes the parameters without increasing their version
    counters, so increase them (one more increase after an unfused step changes nothing). Nothing while
    torch.compile traces a step: the counters are increased as its compiled code writes the parameters."""
    if torch.compiler.is_compiling():
        return
    torch.autograd.graph.increment_version([p for group in optimizer.param_groups for p in group["params"]])


def _wrap_setattr(setattr_before: Callable[[nn.Module, str, Any], None]) -> Callable[[nn.Module, str, Any], None]:
    """``nn.Module.__setattr__`` that also tells the watches of a module of each attribute set on it."""

    def __setattr__(module: nn.Module, name: str, value: Any) -> None:
        watches = None if torch.compiler.is_compiling() else _watchers.get(id(module))
        if not watches:
            setattr_before(module, name, value)
            return
        old = vars(module).get(name, _ABSENT)
        setattr_before(module, name, value)
        for watch in list(watches):
            watch._set(module, name, old, value)

    __setattr__.__doc__ = setattr_before.__doc__
    __setattr__.__wrapped__ = setattr_before  # type: ignore[attr-defined]
    return __setattr__
