"""A counting CPU allocator, for measuring what a forward pass really allocates on the CPU, in every thread.

The PyTorch profiler's memory events record only the allocations of the thread that started it, and the runtime
runs the groups of a concurrent stage on worker threads; so the bench measures through torch's own allocator
instead. :func:`install` compiles (once, cached by torch's extension builder) and installs a ``c10::Allocator``
that wraps the default CPU allocator (``c10::SetCPUAllocator``): every CPU tensor allocated afterwards, in any
thread, goes through it, and it keeps the bytes live and their highest point. :func:`reset_peak` restarts the
count at what is live now, so a measurement counts what a pass allocates on top of its weights and input.
Memory that kernels take outside torch's allocator (oneDNN's scratch) is not seen: activations only.
"""

from __future__ import annotations

import functools
from types import ModuleType

from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <atomic>
#include <mutex>
#include <unordered_map>

namespace {
std::atomic<int64_t> live{0};
std::atomic<int64_t> top{0};
c10::Allocator* inner = nullptr;

struct Block { void* ctx; c10::DeleterFnPtr deleter; int64_t bytes; };
std::mutex lock;
std::unordered_map<void*, Block> blocks;

void release(void* data) {
  Block block;
  {
    std::lock_guard<std::mutex> guard(lock);
    auto found = blocks.find(data);
    if (found == blocks.end()) {  // allocated before install: the inner allocator frees it, uncounted
      block = Block{data, inner->raw_deleter(), 0};
    } else {
      block = found->second;
      blocks.erase(found);
    }
  }
  live -= block.bytes;
  if (block.deleter != nullptr) block.deleter(block.ctx);
}

struct Counting final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr found = inner->allocate(bytes);
    void* data = found.get();
    c10::DeleterFnPtr deleter = found.get_deleter();
    c10::Device device = found.device();
    void* ctx = found.release_context();
    if (data == nullptr) return {data, ctx, deleter, device};
    {
      std::lock_guard<std::mutex> guard(lock);
      blocks[data] = Block{ctx, deleter, static_cast<int64_t>(bytes)};
    }
    int64_t now = (live += static_cast<int64_t>(bytes));
    int64_t seen = top.load();
    while (now > seen && !top.compare_exchange_weak(seen, now)) {}
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

Counting counting;
}

void install() {
  if (inner == nullptr) {
    inner = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  }
}
void reset_peak() { top = live.load(); }
int64_t live_bytes() { return live.load(); }
int64_t peak_bytes() { return top.load(); }
"""


@functools.cache
def _module() -> ModuleType:
    """The compiled extension (built on first use)."""
    return load_inline("ios_ray_allocator_counter", cpp_sources=_SOURCE,
                       functions=["install", "reset_peak", "live_bytes", "peak_bytes"], verbose=False)


def install() -> None:
    """Route every later CPU allocation through the counting allocator."""
    _module().install()


def reset_peak() -> None:
    """Restart the highest point at the bytes live now."""
    _module().reset_peak()


def live_bytes() -> int:
    """Bytes allocated through the counting allocator and not yet freed."""
    return int(_module().live_bytes())


def peak_bytes() -> int:
    """The most bytes live at once since the last :func:`reset_peak`."""
    return int(_module().peak_bytes())
