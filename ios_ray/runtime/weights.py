"""Noticing that a module's weights changed since they were last compiled: :class:`WeightWatch`.

What the runtime runs is compiled from a snapshot of a module's weights (batch-norms folded into convs, weights the
import evaluates once), so a deployed model must notice when the weights change under it. A watch is armed on the
module as it is when it is compiled; :meth:`WeightWatch.changed` then answers per call, cheaply:

* a parameter changed in place (``p.mul_(0.9)``, an optimizer step, ``torch.nn.init``, ``load_state_dict``): its
  version counter, which every in-place change increases, differs from the one recorded (read per call for every
  parameter: the only per-tensor cost);
* a buffer loaded (``load_state_dict`` on the module or any submodule) or updated by a forward in training mode
  (batch-norm statistics): a hook on each submodule holding buffers has marked the watch;
* a parameter, buffer or submodule replaced (assignment, ``load_state_dict(assign=True)``): torch's global
  registration hooks count every registration in the process, and where the count moved since the last check the
  watch compares the module's tensors and submodules by identity;
* the whole module converted in place (``model.half()``, ``model.to("cuda")``,
  ``model.to(memory_format=torch.channels_last)``, which swap each tensor's data under it): the data pointer of its
  first parameter or of its first 4-D one moved.

Not seen: changes made through ``tensor.data`` (which bypasses the version counter) and in-place edits of a buffer
by hand outside ``load_state_dict`` (``bn.running_var.fill_(1)``); after those, drop the compiled form by hand. The
hooks live on the user's module: a copy or a pickle of it carries inert ones, and they are removed when the watch is
disarmed.
"""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

_version = attrgetter("_version")
#: Registrations of a parameter, buffer or submodule anywhere in the process (once a watch has been armed).
_registrations = [0]
_counting: list[RemovableHandle] = []  # torch's handles of the counting hooks, once registered
_counting_lock = threading.Lock()


class WeightWatch:
    """Whether a module's weights changed since :meth:`arm` (see the module docstring for what it sees)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._marked = False
        self._registrations = -1
        self._params: tuple[torch.Tensor, ...] = ()
        self._versions: tuple[int, ...] = ()
        self._anchors: tuple[torch.Tensor, ...] = ()
        self._pointers: tuple[int, ...] = ()
        self._identities: tuple[int, ...] = ()
        self._hooks: list[RemovableHandle] = []

    def arm(self) -> None:
        """Record the module's weights as they are now (and hook the submodules that hold buffers)."""
        _count_registrations()
        self.disarm()
        self._marked = False
        self._registrations = _registrations[0]
        self._params = tuple(self.module.parameters())
        self._versions = tuple(map(_version, self._params))
        first_4d = [p for p in self._params if p.dim() == 4][:1]
        self._anchors = tuple({id(p): p for p in (*self._params[:1], *first_4d)}.values())
        self._pointers = tuple(p.data_ptr() for p in self._anchors)
        self._identities = _identities(self.module)
        mark = _Mark(self)
        for submodule in self.module.modules():
            if next(submodule.buffers(recurse=False), None) is not None:
                self._hooks.append(submodule.register_forward_pre_hook(mark.forward))
                self._hooks.append(submodule.register_load_state_dict_post_hook(mark.loaded))

    def disarm(self) -> None:
        """Remove the hooks from the module."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def changed(self) -> bool:
        """Whether the module's weights changed since :meth:`arm` (true until it is armed again)."""
        if self._marked:
            return True
        if _registrations[0] != self._registrations:
            if _identities(self.module) != self._identities:
                self._marked = True
                return True
            self._registrations = _registrations[0]
        if tuple(p.data_ptr() for p in self._anchors) != self._pointers:
            return True
        return tuple(map(_version, self._params)) != self._versions

    def mark(self) -> None:
        """Note that the module's weights changed."""
        self._marked = True


class _Mark:
    """The hooks that mark a watch; a copy or a pickle of a hooked module gets inert ones."""

    def __init__(self, watch: WeightWatch | None) -> None:
        self.watch = watch

    def forward(self, module: nn.Module, args: Any) -> None:
        """A forward pre-hook: a forward in training mode may update the module's buffers."""
        if module.training and self.watch is not None:
            self.watch.mark()

    def loaded(self, module: nn.Module, keys: Any) -> None:
        """A load_state_dict post-hook: the module's buffers were loaded."""
        if self.watch is not None:
            self.watch.mark()

    def __reduce__(self) -> tuple[type, tuple[None]]:
        return _Mark, (None,)


def _identities(module: nn.Module) -> tuple[int, ...]:
    """The identities of the module's submodules, parameters and buffers, in order."""
    return tuple(map(id, (*module.modules(), *module.parameters(), *module.buffers())))


def _count_registrations() -> None:
    """Count every registration of a parameter, buffer or submodule in the process, from now on."""
    with _counting_lock:
        if _counting:
            return
        from torch.nn.modules import module as torch_module

        def count(*args: Any) -> None:
            _registrations[0] += 1

        _counting.extend(register(count) for register in (torch_module.register_module_parameter_registration_hook,
                                                          torch_module.register_module_buffer_registration_hook,
                                                          torch_module.register_module_module_registration_hook))
