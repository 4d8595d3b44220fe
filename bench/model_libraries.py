"""Import the real torchvision and timm models and check that ios-ray runs each one as eager does.

    python bench/model_libraries.py --torchvision              # every torchvision classification model
    python bench/model_libraries.py --segmentation             # torchvision's segmentation models (dict outputs)
    python bench/model_libraries.py --backbones                # backbones returning several maps (bench/backbones.py)
    python bench/model_libraries.py --timm resnet50 tf_efficientnet_b0 ...
    python bench/model_libraries.py --timm-families            # one or two timm models of each family below
    python bench/model_libraries.py --smp --ultralytics        # segmentation decoders and YOLO detectors
    python bench/model_libraries.py --edge                     # small models at the edges (tests/edge_models.py)

For each model (random weights, random batch-norm statistics, the same on every run; all in float64): import it at
batch 1 with its own input shape, then run the sequential schedule, the greedy one (concurrent groups) and the DP's
(merged convs included; stage costs from ``SyntheticCost``, made up: no latency is measured here) at batch 2 and
compare with the model's own output; count the opaque units and the distinct candidate stages (r=3, s=8). Prints a
table and a summary; ``--out FILE`` also writes one JSON line per model. Exit code 1 when a model fails to import or
differs from eager.

``--dtype float16`` or ``bfloat16`` checks what a search of a half-precision model does instead: the model converted
to that dtype and imported there (as the driver and every actor import it), and eager in that dtype, are each
compared with the model in float64 on the same input; each schedule must stray from it no more than eager does
(twice eager's error, or ``ios-ray run``'s tolerance for the dtype where that is more). With random weights and
batch-norm statistics a deep model is ill-conditioned in half precision and can overflow float16's range: eager's own
error says how much, and a model whose eager output is not finite is reported as such, not compared.

``--dtype float32`` checks a float32 search's model against float64 the way ``ios-ray run`` does (10x eager's own
error, at least 1e-5), and ``--kernels fused`` runs the schedules with fused kernels (channels-last activations,
oneDNN's fused convs: ios_ray/runtime/kernels.py), as a search that chose them deploys them; in float64 the fused
convs fall back to torch's (oneDNN has none) and only the layout is checked.

``--memory-format channels_last`` holds the model NHWC (``model.to(memory_format=torch.channels_last)``), as a
search of such a model imports it, feeds eager and the schedules an NHWC input, and reports the graph's memory
format (``nhwc``: whether the import recorded channels_last) and the share of the 4-D tensors between units that
stay NHWC in a sequential run (``nhwc_share``: what the stages measured on NHWC inputs will see when deployed).

torchvision's compiled ops may not load against the installed torch (a CPU build, say); classification models do
not use them, so where ``import torchvision`` fails on its two operator schemas (``torchvision::nms``, ``qnms``)
this script defines those schemas first (``--no-torchvision-shim`` leaves them alone).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.backbones import BACKBONES  # noqa: E402
from bench.synthetic import SyntheticCost  # noqa: E402
from ios_ray.runtime.accuracy import FLOAT32_TOLERANCE, HALF_TOLERANCE, OWN_ERROR_MULTIPLE, relative_error  # noqa: E402
from ios_ray.dtypes import MEMORY_FORMATS, example_input, in_memory_format, to_memory_format, torch_dtype  # noqa: E402
from ios_ray.frontend import import_module, opaque_report, output_tensor  # noqa: E402
from ios_ray.ir import GRAPH_INPUT, Graph  # noqa: E402
from ios_ray.models import resolve_model  # noqa: E402
from ios_ray.runtime import Program, ScheduleRunner  # noqa: E402
from ios_ray.schedule import Schedule  # noqa: E402
from ios_ray.scheduler import (SearchParams, greedy, optimize_graph, plan_graph,  # noqa: E402
                               sequential)
from ios_ray.vocabulary import KERNEL_NAMES  # noqa: E402

#: timm models, one or two per family: CNNs of every idiom, and a few hybrids with attention.
TIMM_FAMILIES = (
    "resnet50 resnext50_32x4d seresnet50 ecaresnet50d resnet50d efficientnet_b0 tf_efficientnet_b0 "
    "efficientnetv2_rw_s mobilenetv3_large_100 tf_mobilenetv3_large_100 mobilenetv2_100 regnety_016 regnetz_b16 "
    "densenet121 inception_v3 inception_v4 inception_resnet_v2 xception41 legacy_xception nasnetalarge "
    "pnasnet5large dpn68 ghostnet_100 ghostnetv2_100 mixnet_s tf_mixnet_s convnext_tiny convnextv2_atto "
    "res2net50_26w_4s resnest14d dla34 hrnet_w18_small cspresnet50 cspdarknet53 darknet53 rexnet_100 tresnet_m "
    "ese_vovnet19b_dw selecsls42b skresnet18 hardcorenas_a lcnet_050 fbnetc_100 mnasnet_100 spnasnet_100 tinynet_a "
    "gernet_s repvgg_a0 resnetrs50 nf_resnet50 nfnet_l0 dm_nfnet_f0 bat_resnext26ts botnet26t_256 halonet26t "
    "lambda_resnet26t cs3darknet_s efficientvit_b0 fastvit_t8 mobileone_s0 repghostnet_050 inception_next_tiny "
    "edgenext_xx_small mobilevit_xxs poolformer_s12 sequencer2d_s vgg11 hgnet_tiny hgnetv2_b0 rdnet_tiny starnet_s1"
).split()
#: segmentation-models-pytorch architectures, each over a ResNet and an EfficientNet encoder (those installed).
SMP_ARCHITECTURES = ("Unet", "UnetPlusPlus", "FPN", "PSPNet", "DeepLabV3", "DeepLabV3Plus", "Linknet", "MAnet", "PAN",
                     "UPerNet")
SMP_ENCODERS = ("resnet34", "efficientnet-b0")
#: Ultralytics detectors, built from their yaml configs with the detection head.
ULTRALYTICS_MODELS = ("yolov8n", "yolov8s", "yolo11n")
CHECK_BATCH = 2
TOLERANCE = 1e-9


class _Timeout(Exception):
    pass


def verdict(row: dict[str, Any], dtype: torch.dtype) -> str:
    """``equal`` (every schedule as close as it must be), ``differs``, ``overflow`` (half precision: eager's output
    is not finite), ``slow`` (out of time) or ``failed``."""
    if row.get("failed", "").startswith("still running"):
        return "slow"
    errors = dict(row.get("errors") or {})
    eager = errors.pop("eager", None)
    if "failed" in row or len(errors) < 3:
        return "failed"
    if eager is not None and not math.isfinite(eager):
        return "overflow"
    return "equal" if all(e <= limit(dtype, eager) for e in errors.values()) else "differs"


def limit(dtype: torch.dtype, eager: float | None) -> float:
    """How far a schedule may stray: from eager in float64 (:data:`TOLERANCE`); in float32 from the model in float64,
    as ``ios-ray run`` allows (10x eager's own error, at least 1e-5); in half precision twice eager's own error, at
    least ``ios-ray run``'s tolerance for the dtype."""
    if eager is None:
        return TOLERANCE
    if dtype == torch.float32:
        return max(FLOAT32_TOLERANCE, OWN_ERROR_MULTIPLE * eager)
    return max(HALF_TOLERANCE[dtype], 2 * eager)


def check_model(
    spec: str, timeout_s: int, dtype: torch.dtype = torch.float64, memory_format: str = "contiguous",
    kernels: str = "eager", seed: int = 0,
) -> dict[str, Any]:
    """Import one model spec with random weights drawn from ``seed``, compare its schedules, run with ``kernels``,
    with eager in ``dtype`` and ``memory_format``, count what the search would measure."""
    row: dict[str, Any] = {"model": spec}
    started = time.perf_counter()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Timeout()))
    signal.alarm(timeout_s)
    try:
        resolved = resolve_model(spec)
        torch.manual_seed(seed)  # the same random weights and inputs on every run, so that rows compare run to run
        model = randomised(resolved.build(), seed)
        reference = None if dtype == torch.float64 else copy.deepcopy(model).double()
        model = to_memory_format(model.to(dtype), memory_format)
        imported = import_module(model, example_input(model, resolved.input_shape), spec)
        graph = imported.graph
        if memory_format != "contiguous":
            row.update(nhwc=graph.memory_format == "channels_last",
                       nhwc_share=_nhwc_share(Program.from_imported(imported), example_input(model, graph.input_shape,
                                                                                              CHECK_BATCH)))
        report = opaque_report(graph)
        row.update(units=len(graph.units), opaque=report.opaque, opaque_flops=report.flops_share,
                   opaque_ops=", ".join(f"{op} x{n}" for op, n in report.ops[:3]), import_s=_since(started))
        cache_before = _fx_cache_counts()
        _check_schedules(model, Program.from_imported(imported, "cpu", kernels), row.setdefault("errors", {}),
                         reference)
        if kernels == "inductor":  # regions compiled (miss, bypass) and read from Inductor's cache (hit)
            row["fx_cache"] = {k: n - cache_before.get(k, 0) for k, n in _fx_cache_counts().items()}
        row["stages"] = len(plan_graph(graph, SearchParams(r=3, s=8)).stages)
    except _Timeout:
        row["failed"] = f"still running after {timeout_s} s"
    except Exception as exc:  # noqa: BLE001 - a bench reports every failure and goes on
        row["failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    finally:
        signal.alarm(0)
    row["seconds"] = _since(started)
    return row


def _fx_cache_counts() -> dict[str, int]:
    """How often Inductor's FX graph cache has, in this process, served a compile (hit), missed, or been bypassed."""
    from torch._dynamo.utils import counters

    return {k.removeprefix("fxgraph_cache_"): n for k, n in counters["inductor"].items() if k.startswith("fxgraph_cache_")}


def _check_schedules(model: nn.Module, program: Program, errors: dict[str, float],
                     reference: nn.Module | None = None) -> None:
    """Fill ``errors`` with each schedule's largest relative difference, one by one (the sequential, the greedy and
    the DP's), from eager; or, where a float64 ``reference`` is given, from it, and eager's own under ``eager``."""
    graph: Graph = program.graph
    cost = SyntheticCost(graph)
    x = in_memory_format(example_input(model, graph.input_shape, CHECK_BATCH), graph.memory_format)
    with torch.no_grad():
        expected = output_tensor(model(x) if reference is None else reference(x.double()))
        if reference is not None:
            errors["eager"] = relative_error(output_tensor(model(x)), expected)
    schedules = {
        "sequential": lambda: tuple(sequential(graph, b, cost) for b in graph.blocks),
        "greedy": lambda: tuple(greedy(graph, b, cost) for b in graph.blocks),
        "dp": lambda: optimize_graph(graph, cost, SearchParams(r=3, s=8)).schedules,
    }
    for name, blocks in schedules.items():
        runner = ScheduleRunner(program, Schedule(graph.name, graph.fingerprint, "cpu", CHECK_BATCH, blocks(),
                                                  kernels=program.kernels), "cpu")
        with torch.no_grad():
            errors[name] = relative_error(runner(x), expected)


def _nhwc_share(program: Program, x: torch.Tensor) -> float:
    """The share of the 4-D unit outputs of a sequential run on an NHWC input that are NHWC (not also NCHW)."""
    env = {GRAPH_INPUT: in_memory_format(x, "channels_last")}
    with torch.no_grad():
        for unit in program.graph.units:
            env[unit.id] = program.run_unit(unit.id, env)
    spatial = [t for t in env.values()
               if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[2] * t.shape[3] > 1 and t.shape[1] > 1]
    nhwc = [t for t in spatial if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()]
    return round(len(nhwc) / len(spatial), 3) if spatial else 1.0


def randomised(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random running statistics and affine parameters in every batch-norm, so that folding is exercised, and small
    random values in every parameter initialised to zeros (torchvision's ViTs zero their head: their output would be
    zeros whatever the layers before computed, and a check of it could not fail)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.numel() > 1 and not parameter.any():
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
        for bn in model.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm) and bn.running_mean is not None:
                size = bn.running_mean.shape
                bn.running_mean.copy_(torch.rand(size, generator=generator) - 0.5)
                bn.running_var.copy_(torch.rand(size, generator=generator) + 0.5)
                if bn.affine:
                    bn.weight.copy_(torch.rand(size, generator=generator) + 0.5)
                    bn.bias.copy_(torch.rand(size, generator=generator) - 0.5)
    return model.eval()


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 1)


def _define_torchvision_schemas() -> None:
    """The two operator schemas torchvision's Python needs where its compiled ops do not load (nothing where
    torchvision is not installed)."""
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        return
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
        for name in list(sys.modules):
            if name.startswith("torchvision"):
                del sys.modules[name]
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _define_torchvision_schemas.library = library  # type: ignore[attr-defined]  # keep the definitions alive


def specs(args: argparse.Namespace) -> Iterator[str]:
    """The model specs to check, in order."""
    if args.torchvision:
        import torchvision.models

        yield from (f"torchvision:{name}" for name in torchvision.models.list_models(module=torchvision.models))
    if args.segmentation:
        import torchvision.models.segmentation

        yield from (f"torchvision:{name}" for name in
                    torchvision.models.list_models(module=torchvision.models.segmentation))
    if args.backbones:
        yield from BACKBONES
    if args.smp:
        import segmentation_models_pytorch as smp

        known = {name.lower() for name in getattr(smp, "MODEL_ARCHITECTURES_MAPPING", {})}
        yield from (f"smp:{arch}/{encoder}" for arch in SMP_ARCHITECTURES if arch.lower() in known
                    for encoder in SMP_ENCODERS)
    if args.ultralytics:
        yield from (f"ultralytics:{name}" for name in ULTRALYTICS_MODELS)
    if args.edge:
        from tests.edge_models import EDGE_MODELS

        yield from (f"tests.edge_models:{name}" for name in EDGE_MODELS)
    names = list(args.timm or ()) + (TIMM_FAMILIES if args.timm_families else [])
    if names:
        import timm

        unknown = [name for name in names if not timm.is_model(name)]
        if unknown:
            raise SystemExit(f"error: timm has no model {', '.join(unknown)} (names are separated by spaces).")
        yield from (f"timm:{name}" for name in names)


def print_table(rows: list[dict[str, Any]], console: Console, dtype: torch.dtype = torch.float64) -> None:
    """The per-model table and a summary line."""
    name = str(dtype).removeprefix("torch.")
    half = dtype != torch.float64
    error_column = "max rel. error vs float64 (eager's)" if half else "max rel. error"
    table = Table(title=f"real library models through ios-ray (CPU, {name} check at batch 2)")
    for column in ("model", "units", "opaque", "opaque FLOPs", "most opaque ops", "stages", error_column, "import s",
                   "s"):
        table.add_column(column, justify="left" if column in ("model", "most opaque ops") else "right")
    for row in rows:
        if "failed" in row and "units" not in row:
            table.add_row(row["model"], "", "", "", f"[red]{row['failed']}[/red]", "", "", "", str(row["seconds"]))
            continue
        table.add_row(row["model"], str(row.get("units", "")), str(row.get("opaque", "")),
                      f"{row['opaque_flops']:.1%}" if "opaque_flops" in row else "", row.get("opaque_ops", ""),
                      str(row.get("stages", "")), _error_text(row, dtype), str(row.get("import_s", "")),
                      str(row["seconds"]))
    console.print(table)
    counts = {kind: [r["model"] for r in rows if verdict(r, dtype) == kind]
              for kind in ("equal", "overflow", "slow", "differs", "failed")}
    rule = ("no further from float64 than 10x eager's error, or 1e-5" if dtype == torch.float32 else
            "no further from float64 than twice eager's error, or 1e-2 (float16) / 3e-2 (bfloat16)" if half
            else f"relative error <= {TOLERANCE:g} in float64")
    overflow = f"{len(counts['overflow'])} overflow {name} in eager too; " if half else ""
    console.print(f"{len(rows)} models: {sum('units' in r for r in rows)} import, {len(counts['equal'])} equal eager "
                  f"({rule} under the sequential, greedy and DP schedules); {overflow}{len(counts['slow'])} ran out of "
                  f"time{': ' + ', '.join(counts['slow']) if counts['slow'] else ''}; "
                  f"{len(counts['differs']) + len(counts['failed'])} failed or differ.")
    nhwc = [r for r in rows if "nhwc" in r]
    if nhwc:
        shares = sorted(r["nhwc_share"] for r in nhwc)
        console.print(f"channels_last: recorded by the import of {sum(r['nhwc'] for r in nhwc)} of {len(nhwc)}; "
                      f"4-D tensors between units that stay NHWC: median {shares[len(shares) // 2]:.0%}, least "
                      f"{shares[0]:.0%} ({min(nhwc, key=lambda r: r['nhwc_share'])['model']}).")


def _error_text(row: dict[str, Any], dtype: torch.dtype) -> str:
    """A row's largest schedule error (and eager's, in half precision), or its failure, for the table."""
    if "failed" in row:
        return f"[red]{row['failed']}[/red]"
    errors = dict(row.get("errors") or {})
    eager = errors.pop("eager", None)
    if not errors:
        return ""
    text = f"{max(errors.values()):.1e}" + ("" if len(errors) == 3 else f" ({', '.join(errors)})")
    text += "" if eager is None else f" ({eager:.1e})"
    return text if verdict(row, dtype) in ("equal", "overflow") else f"[red]{text}[/red]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchvision", action="store_true", help="every torchvision classification model")
    parser.add_argument("--segmentation", action="store_true", help="every torchvision segmentation model")
    parser.add_argument("--backbones", action="store_true", help="backbones that return several feature maps")
    parser.add_argument("--timm", nargs="*", metavar="NAME", help="these timm models")
    parser.add_argument("--timm-families", action="store_true", help="one or two timm models per family")
    parser.add_argument("--smp", action="store_true", help="segmentation-models-pytorch decoders, two encoders each")
    parser.add_argument("--ultralytics", action="store_true", help="Ultralytics YOLO detectors from their configs")
    parser.add_argument("--edge", action="store_true", help="small models at the edges of what the import folds and "
                        "fused kernels run (tests/edge_models.py; no library needed)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per model (default 120)")
    parser.add_argument("--out", type=Path, help="also write one JSON line per model here")
    parser.add_argument("--no-torchvision-shim", action="store_true", help="do not define torchvision's schemas")
    parser.add_argument("--dtype", choices=("float64", "float32", "float16", "bfloat16"), default="float64",
                        help="float64: the exact check; float32, float16, bfloat16: the model as a search in that "
                        "dtype runs it, against float64")
    parser.add_argument("--kernels", choices=KERNEL_NAMES, default="eager",
                        help="the kernels the schedules run with (fused: channels-last, oneDNN's fused convs in "
                        "float32 and bfloat16)")
    parser.add_argument("--memory-format", choices=tuple(MEMORY_FORMATS), default="contiguous",
                        help="channels_last: the model held NHWC, as a search of such a model runs it")
    parser.add_argument("--start-at", metavar="SPEC", help="skip the models before this one (to resume a sweep)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the random weights' seed (another, over a warm Inductor cache, checks regions read back "
                             "from it with other weights)")
    args = parser.parse_args()
    dtype = torch.float64 if args.dtype == "float64" else torch_dtype(args.dtype)
    if not (args.torchvision or args.segmentation or args.backbones or args.timm or args.timm_families or args.smp
            or args.ultralytics or args.edge):
        parser.error("name what to check: --torchvision, --segmentation, --backbones, --timm NAME..., --timm-families, "
                     "--smp, --ultralytics, --edge")
    if not args.no_torchvision_shim:
        _define_torchvision_schemas()
    console, rows = Console(width=170), []
    chosen = list(specs(args))
    if args.start_at is not None:
        if args.start_at not in chosen:
            parser.error(f"--start-at {args.start_at} is none of the models named")
        chosen = chosen[chosen.index(args.start_at):]
    for spec in chosen:
        rows.append(check_model(spec, args.timeout, dtype, args.memory_format, args.kernels, args.seed))
        console.print(json.dumps(rows[-1]))
        if args.out:
            with args.out.open("a") as out:
                out.write(json.dumps(rows[-1]) + "\n")
    print_table(rows, console, dtype)
    return 1 if _failures(rows, dtype) else 0


def _failures(rows: list[dict[str, Any]], dtype: torch.dtype = torch.float64) -> list[dict[str, Any]]:
    """Rows that failed other than by running out of time, or whose output differs from eager."""
    return [r for r in rows if verdict(r, dtype) in ("failed", "differs")]


if __name__ == "__main__":
    raise SystemExit(main())
