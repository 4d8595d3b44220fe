"""A counting CPU allocator, for measuring what a forward pass really allocates on the CPU, in every thread.

The PyTorch profiler's memory events record only the allocations of the thread that started it, and the runtime
runs the groups of a concurrent stage on worker threads; so the bench measures through torch's own allocator
instead. :func:`install` compiles (once, cached by torch's extension builder) and installs a ``c10::Allocator``
that wraps the default CPU allocator (``c10::SetCPUAllocator``): every CPU tensor allocated afterwards, in any
thread, goes through it. Between :func:`start` and :func:`stop` it records each allocation and free; a global
``RecordFunction`` callback follows which top-level ATen op each thread is in, and a block freed by the same
top-level op that allocated it (oneDNN's reorders of a conv's input and output into its blocked layout, a
kernel's workspace) is scratch, not an activation. :func:`stop` replays the record: the highest bytes live at once,
activations only and everything, on top of what was live at :func:`start` (weights, the input batch).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Sequence

from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {
c10::Allocator* inner = nullptr;
std::atomic<int64_t> next_op{1};
std::atomic<int64_t> next_block{1};
thread_local int depth = 0;
thread_local int64_t current_op = 0;

struct Block { void* ctx; c10::DeleterFnPtr deleter; int64_t bytes; int64_t id; int64_t op; };
std::mutex lock;
std::unordered_map<void*, Block> blocks;
bool recording = false;
// (block id, bytes: positive allocated, negative freed); ids freed inside the top-level op that made them
std::vector<std::pair<int64_t, int64_t>> events;
std::vector<int64_t> scratch;

void release(void* data) {
  Block block;
  {
    std::lock_guard<std::mutex> guard(lock);
    auto found = blocks.find(data);
    if (found == blocks.end()) {  // allocated before install: the inner allocator frees it, uncounted
      block = Block{data, inner->raw_deleter(), 0, 0, 0};
    } else {
      block = found->second;
      blocks.erase(found);
      if (recording && block.id > 0) {
        events.emplace_back(block.id, -block.bytes);
        if (block.op != 0 && block.op == current_op) scratch.push_back(block.id);
      }
    }
  }
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
      int64_t id = recording ? next_block++ : 0;
      blocks[data] = Block{ctx, deleter, static_cast<int64_t>(bytes), id, current_op};
      if (recording) events.emplace_back(id, static_cast<int64_t>(bytes));
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

Counting counting;

std::unique_ptr<at::ObserverContext> op_started(const at::RecordFunction&) {
  if (depth++ == 0) current_op = next_op++;
  return nullptr;
}

void op_ended(const at::RecordFunction&, at::ObserverContext*) {
  if (--depth == 0) current_op = 0;
}
}

void install() {
  if (inner == nullptr) {
    inner = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    at::addGlobalCallback(at::RecordFunctionCallback(&op_started, &op_ended).scopes({at::RecordScope::FUNCTION}));
  }
}

void start() {
  std::lock_guard<std::mutex> guard(lock);
  events.clear();
  scratch.clear();
  recording = true;
}

int64_t mark() {
  std::lock_guard<std::mutex> guard(lock);
  return static_cast<int64_t>(events.size());
}

// Per segment between marks: activations live at its start and at its highest point; then the peaks of the whole
// record (activations, everything).
std::vector<int64_t> stop(std::vector<int64_t> marks) {
  std::lock_guard<std::mutex> guard(lock);
  recording = false;
  std::unordered_map<int64_t, bool> skip;
  for (int64_t id : scratch) skip[id] = true;
  int64_t live = 0, top = 0, live_all = 0, top_all = 0;
  std::vector<int64_t> segments;
  size_t next = 0;
  for (size_t i = 0; i <= events.size(); ++i) {
    while (next < marks.size() && static_cast<size_t>(marks[next]) == i) {
      segments.push_back(live);
      segments.push_back(live);
      ++next;
    }
    if (i == events.size()) break;
    auto& event = events[i];
    live_all += event.second;
    top_all = std::max(top_all, live_all);
    if (skip.count(event.first)) continue;
    live += event.second;
    top = std::max(top, live);
    if (!segments.empty()) segments.back() = std::max(segments.back(), live);
  }
  segments.push_back(top);
  segments.push_back(top_all);
  return segments;
}
"""


@functools.cache
def _module() -> ModuleType:
    """The compiled extension (built on first use)."""
    return load_inline("ios_ray_allocator_counter4", cpp_sources=_SOURCE,
                       functions=["install", "start", "mark", "stop"], verbose=False)


def install() -> None:
    """Route every later CPU allocation through the counting allocator and follow top-level ATen ops."""
    _module().install()


def start() -> None:
    """Start recording allocations and frees."""
    _module().start()


def mark() -> int:
    """A mark between two parts of a record (for :func:`stop`'s ``marks``): the events recorded so far."""
    return int(_module().mark())


def stop(marks: Sequence[int] = ()) -> tuple[int, int]:
    """Stop recording; the highest bytes allocated at once since :func:`start` by activations (scratch freed in
    the top-level op that made it left out), and by everything."""
    *_, activations, everything = _module().stop(list(marks))
    return int(activations), int(everything)


def stop_in_parts(marks: Sequence[int]) -> list[tuple[int, int]]:
    """Stop recording; for each part of the record from one of ``marks`` (ascending, from :func:`mark`) to the next
    (the last to the end): the activation bytes live at its start and at its highest point, counted from
    :func:`start`."""
    found = _module().stop(list(marks))[:-2]
    return [(int(found[i]), int(found[i + 1])) for i in range(0, len(found), 2)]
