"""The profiler: timing protocol, sim device model, Ray actors per device, and the dispatch of stages to them."""

from ios_ray.profiler.dispatch import MeasureReport
from ios_ray.profiler.jobs import CheckJob, DeviceIdentity, MeasureJob, ModelSource
from ios_ray.profiler.pool import DevicePool

__all__ = ["CheckJob", "DeviceIdentity", "DevicePool", "MeasureJob", "MeasureReport", "ModelSource"]
