"""ScheduledModule: checking schedules, choosing one per device and batch, eager fallback, saving and loading."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import warnings
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch.utils.hooks import RemovableHandle

from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.ir import Graph
from ios_ray.runtime import ScheduledModule, device_rank, pick_batch, read_schedules, select_schedule
from ios_ray.schedule import Schedule, save_schedule
from tests.helpers import randomise_batchnorm
from tests.idiom_models import StdConvStyle
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny
from ios_ray.vocabulary import KERNEL_NAMES
from ios_ray.zoo import ZOO

SHAPE = Tiny.input_shape


@pytest.fixture(autouse=True)
def without_gradients() -> Iterator[None]:
    """Calls as a served model makes them: with gradients on, the original module runs (tested below)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_module(tiny(), torch.randn(1, *SHAPE)).graph


def schedules_for(graph: Graph, device: str, batches: tuple[int, ...], strategy: str = "ios_like") -> list[Schedule]:
    return [make_schedule(graph, BUILDERS[strategy], b, device=device) for b in batches]


def eager(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x)


def test_pick_batch_takes_the_batch_else_the_next_larger_else_the_largest() -> None:
    assert [pick_batch([1, 8, 32], b) for b in (1, 2, 8, 9, 33)] == [1, 8, 8, 32, 32]
    assert pick_batch([16], 1) == 16


def test_device_rank_accepts_gpu_labels_on_cuda_only() -> None:
    assert device_rank("cpu", "cpu") == 0 and device_rank("v100", "cpu") is None
    assert device_rank("cpu", "cuda") is None and device_rank("cuda", "mps") is None
    name = "NVIDIA H100 80GB HBM3"
    ranks = [device_rank(label, "cuda", name) for label in ("h100", "cuda", "cuda:1", "sim:h100", "v100", "sim:v100")]
    assert ranks == [0, 1, 1, 2, 3, 4]


def test_select_schedule_prefers_the_device_then_picks_the_batch(graph: Graph) -> None:
    pool = schedules_for(graph, "cpu", (1, 8)) + schedules_for(graph, "sim:v100", (4,)) + \
        schedules_for(graph, "cuda", (2,))
    assert select_schedule(pool, "cpu", 4).batch == 8 and select_schedule(pool, "cpu", 64).batch == 8
    assert select_schedule(pool, "cuda", 1, "Tesla V100-SXM2-16GB").device == "cuda"
    assert select_schedule(pool[:3], "cuda", 1, "Tesla V100-SXM2-16GB").device == "sim:v100"
    assert select_schedule(pool[:2], "cuda", 1) is None


def test_forward_runs_the_schedule_for_the_batch_and_equals_eager(graph: Graph) -> None:
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (1, 4, 8)), input_shape=SHAPE)
    for batch, chosen in ((1, 1), (3, 4), (8, 8), (9, 8)):
        x = torch.randn(batch, *SHAPE)
        assert scheduled.schedule_for(x).batch == chosen
        torch.testing.assert_close(scheduled(x), eager(model, x), rtol=1e-5, atol=1e-6)


def test_the_schedule_is_chosen_once_per_device_batch_and_dtype(graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    import ios_ray.runtime.scheduled_module as scheduled_module

    chosen: list[int] = []
    choose = scheduled_module.select_schedule
    monkeypatch.setattr(scheduled_module, "select_schedule", lambda *args: chosen.append(args[2]) or choose(*args))
    scheduled = ScheduledModule(tiny(), schedules_for(graph, "cpu", (1, 4)), input_shape=SHAPE)
    for batch in (1, 3, 1, 3, 1):
        scheduled(torch.randn(batch, *SHAPE))
    assert chosen == [1, 3]  # a served model pays a lookup per call, not a choice
    scheduled.reset()
    scheduled(torch.randn(1, *SHAPE))
    assert chosen == [1, 3, 1]


def test_a_schedule_for_another_graph_is_a_user_error(graph: Graph) -> None:
    foreign = schedules_for(import_module(ZOO["squeezenet"].build(), torch.randn(1, 3, 224, 224)).graph, "cpu", (1,))
    with pytest.raises(UserError, match=r"^schedule 0 \(test, cpu, batch 1\) was made for another graph"):
        ScheduledModule(tiny(), foreign, input_shape=SHAPE)


def test_a_folder_keeps_the_schedules_of_this_graph_only(graph: Graph, tmp_path: Path) -> None:
    other = Schedule("other", "0" * 24, "cpu", 1, ())
    save_schedule(other, tmp_path / "other" / "cpu" / "bs1.json")
    with pytest.raises(UserError, match="no schedule under .* was made for this Tiny"):
        ScheduledModule(tiny(), tmp_path, input_shape=SHAPE)
    for schedule in schedules_for(graph, "cpu", (1, 4)):
        save_schedule(schedule, tmp_path / "tiny" / "cpu" / f"bs{schedule.batch}.json")
    scheduled = ScheduledModule(tiny(), tmp_path, input_shape=SHAPE)
    assert sorted(s.batch for s in scheduled.schedules) == [1, 4]


def test_a_folder_of_several_models_finds_the_input_shape_of_this_ones(tmp_path: Path) -> None:
    other = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.ReLU()).eval()
    for schedule in schedules_for(import_module(other, torch.randn(1, *SHAPE)).graph, "cpu", (1,)):
        save_schedule(schedule, tmp_path / "other" / "cpu" / "bs1.json")
    for schedule in schedules_for(import_module(tiny(), torch.randn(1, 3, 20, 20)).graph, "cpu", (1,)):
        save_schedule(schedule, tmp_path / "tiny" / "cpu" / "bs1.json")
    scheduled = ScheduledModule(tiny(), tmp_path)  # no input_shape: the folder records 3x16x16 and 3x20x20
    assert scheduled.input_shape == (3, 20, 20) and [s.model for s in scheduled.schedules] == ["test"]
    assert ScheduledModule(other, tmp_path).input_shape == SHAPE
    with pytest.raises(UserError, match=r"no schedule under .* was made for this StdConvStyle at any input shape they "
                                        r"record \(3x16x16, 3x20x20\); run ios-ray search for this model"):
        ScheduledModule(StdConvStyle(), tmp_path)


def test_a_folder_of_schedules_made_at_another_input_shape_says_which_and_what_to_pass(tmp_path: Path) -> None:
    for schedule in schedules_for(import_module(tiny(), torch.randn(1, 3, 20, 20)).graph, "cpu", (1,)):
        save_schedule(schedule, tmp_path / "tiny" / "cpu" / "bs1.json")
    with pytest.raises(UserError, match=r"was made for this Tiny \(graph fingerprint \w+\) \(those there were made "
                                        r"for inputs of shape 3x20x20, and this one is imported at 3x16x16: pass the "
                                        r"shape it was searched at, --input-shape on the command line"):
        ScheduledModule(tiny(), tmp_path, input_shape=(3, 16, 16))


def test_a_corrupt_schedule_file_is_a_user_error_naming_it(graph: Graph, tmp_path: Path) -> None:
    save_schedule(schedules_for(graph, "cpu", (1,))[0], tmp_path / "good.json")
    bad = tmp_path / "tiny" / "cpu" / "bs4.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"format": "ios-ray-schedule", "version": 1, "model": ')
    with pytest.raises(UserError, match=f"^{bad} is not a valid ios-ray schedule"):
        ScheduledModule(tiny(), tmp_path, input_shape=SHAPE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no schedule files"):
        read_schedules(tmp_path / "empty")
    with pytest.raises(UserError, match="no schedule file or folder"):
        read_schedules(tmp_path / "missing")


def test_an_unknown_device_label_is_a_user_error(graph: Graph) -> None:
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        ScheduledModule(tiny(), schedules_for(graph, "tpu", (1,)), input_shape=SHAPE)


def test_the_input_shape_comes_from_the_schedules_or_must_be_given(graph: Graph) -> None:
    recorded = schedules_for(graph, "cpu", (1, 4))
    assert ScheduledModule(tiny(), recorded).input_shape == graph.input_shape == SHAPE
    unrecorded = [dataclasses.replace(s, input_shape=None) for s in recorded]
    with pytest.raises(UserError, match=r"pass input_shape=\(C, H, W\)"):
        ScheduledModule(tiny(), unrecorded)
    assert ScheduledModule(tiny(), unrecorded, input_shape=SHAPE).input_shape == SHAPE
    with pytest.raises(UserError, match="at least one schedule"):
        ScheduledModule(tiny(), [], input_shape=SHAPE)


def test_no_fitting_schedule_runs_eager_and_warns_once(graph: Graph) -> None:
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "v100", (1,)), input_shape=SHAPE)
    x = torch.randn(2, *SHAPE)
    with pytest.warns(UserWarning, match="no schedule fits device cpu"):
        torch.testing.assert_close(scheduled(x), eager(model, x), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduled(x)
    with pytest.warns(UserWarning, match=r"no schedule for inputs of shape \(3, 8, 8\)"):
        scheduled(torch.randn(1, 3, 8, 8))


def test_training_mode_runs_the_original_module(graph: Graph) -> None:
    scheduled = ScheduledModule(tiny(), schedules_for(graph, "cpu", (1,)), input_shape=SHAPE)
    assert not scheduled.training and not scheduled.module.training
    scheduled.train()
    x = torch.randn(4, *SHAPE)
    torch.testing.assert_close(scheduled(x), scheduled.module(x), rtol=0, atol=0)


def test_new_weights_rebuild_the_runners(graph: Graph) -> None:
    scheduled = ScheduledModule(tiny(), schedules_for(graph, "cpu", (1,)), input_shape=SHAPE)
    x = torch.randn(1, *SHAPE)
    before = scheduled(x)
    torch.manual_seed(5)
    scheduled.load_state_dict({f"module.{k}": v for k, v in Tiny().state_dict().items()})
    after = scheduled(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, eager(scheduled.module, x), rtol=1e-5, atol=1e-6)


def test_weights_the_import_evaluated_follow_new_weights_and_dtypes() -> None:
    """timm's weight-standardised convs are evaluated once at import: new weights or a new dtype import again."""
    torch.manual_seed(0)
    model = StdConvStyle().eval()
    x = torch.randn(2, 3, 32, 32)
    graph = import_module(model, x[:1]).graph
    scheduled = ScheduledModule(model, [make_schedule(graph, BUILDERS["ios_like"], 2, device="cpu")],
                                input_shape=(3, 32, 32))
    torch.testing.assert_close(scheduled(x), eager(model, x), rtol=1e-5, atol=1e-6)
    scheduled.load_state_dict({f"module.{k}": v for k, v in StdConvStyle().state_dict().items()})
    torch.testing.assert_close(scheduled(x), eager(scheduled.module, x), rtol=1e-5, atol=1e-6)
    scheduled.double()
    with pytest.warns(UserWarning, match="no schedule for float64 inputs on cpu"):
        torch.testing.assert_close(scheduled(x.double()), eager(scheduled.module, x.double()))


def test_save_and_load_round_trip(graph: Graph, tmp_path: Path) -> None:
    scheduled = ScheduledModule(tiny(), schedules_for(graph, "cpu", (1, 4)), input_shape=SHAPE)
    ScheduledModule(tiny(), schedules_for(graph, "cpu", (1, 2, 4)), input_shape=SHAPE).save(tmp_path / "saved")
    scheduled.save(tmp_path / "saved")
    torch.manual_seed(9)
    loaded = ScheduledModule.load(tmp_path / "saved", Tiny())
    assert [s.to_json() for s in loaded.schedules] == [s.to_json() for s in scheduled.schedules]
    assert loaded.input_shape == SHAPE
    x = torch.randn(4, *SHAPE)
    torch.testing.assert_close(loaded(x), scheduled(x), rtol=0, atol=0)
    (tmp_path / "saved" / "scheduled_module.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(UserError, match="not valid ScheduledModule metadata"):
        ScheduledModule.load(tmp_path / "saved", Tiny())
    with pytest.raises(UserError, match="is not a saved ScheduledModule"):
        ScheduledModule.load(tmp_path, Tiny())
    (tmp_path / "a file").write_text("mine")
    with pytest.raises(UserError, match=r"cannot save the scheduled module into .*a file: a file is there; pass a "
                                        r"folder\.$"):
        scheduled.save(tmp_path / "a file")
    with pytest.raises(UserError, match=r"cannot save the scheduled module into the folder .*a file/in it \(Not a "
                                        r"directory\); pass a folder that can be made and written\.$"):
        scheduled.save(tmp_path / "a file" / "in it")
    assert (tmp_path / "a file").read_text() == "mine"


def relative_gap(scheduled: ScheduledModule, model: torch.nn.Module, x: torch.Tensor) -> float:
    """How far the scheduled output is from eager with the model's weights as they are now."""
    with torch.no_grad():
        got, want = scheduled(x), model(x)
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("kernels", KERNEL_NAMES)
def test_weights_changed_in_place_or_loaded_into_the_wrapped_module_are_followed(graph: Graph, kernels: str) -> None:
    """With every kernels: fused ones pack weights per input shape, inductor regions freeze them into their code."""
    model = tiny()
    schedules = [make_schedule(graph, BUILDERS["ios_like"], 1, kernels=kernels)]
    scheduled = ScheduledModule(model, schedules, input_shape=SHAPE)
    x = torch.randn(1, *SHAPE)
    assert relative_gap(scheduled, model, x) < 1e-5
    with torch.no_grad():
        model.b1.weight.mul_(0.5)
        model.head[2].bias.add_(1.0)
    assert relative_gap(scheduled, model, x) < 1e-5
    model.load_state_dict(randomise_batchnorm(Tiny(), seed=3).state_dict())
    assert relative_gap(scheduled, model, x) < 1e-5
    stats = {k: v * 2 for k, v in model.stem[1].state_dict().items() if "running" in k}
    model.stem[1].load_state_dict(stats, strict=False)  # buffers only: no parameter's counter moves
    assert relative_gap(scheduled, model, x) < 1e-5


def test_the_wrapper_loads_the_wrapped_modules_own_state_dict(graph: Graph) -> None:
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (1,)), input_shape=SHAPE)
    x = torch.randn(1, *SHAPE)
    other = randomise_batchnorm(Tiny(), seed=4)
    scheduled.load_state_dict(other.state_dict())
    torch.testing.assert_close(scheduled(x), eager(other, x), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        scheduled.load_state_dict({**other.state_dict(), "stray": torch.zeros(1)})


def test_statistics_updated_in_training_and_replaced_tensors_are_followed(graph: Graph) -> None:
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (1,)), input_shape=SHAPE)
    x = torch.randn(1, *SHAPE)
    model.train()
    model(torch.randn(8, *SHAPE) * 3 + 1)  # batch-norm statistics move
    model.eval()
    assert relative_gap(scheduled, model, x) < 1e-5
    model.b1.weight = torch.nn.Parameter(torch.randn_like(model.b1.weight))
    assert relative_gap(scheduled, model, x) < 1e-5
    model.stem[1].running_var = torch.rand(8) + 0.5
    assert relative_gap(scheduled, model, x) < 1e-5
    model.double()
    with pytest.warns(UserWarning, match="no schedule for float64 inputs"):
        assert relative_gap(scheduled, model, x.double()) < 1e-12


def test_without_following_the_weights_a_reset_picks_them_up(graph: Graph) -> None:
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (1,)), input_shape=SHAPE, follow_weights=False)
    x = torch.randn(1, *SHAPE)
    before = scheduled(x)
    with torch.no_grad():
        model.b1.weight.mul_(0.5)
    torch.testing.assert_close(scheduled(x), before, rtol=0, atol=0)  # the server's promise: weights never change
    scheduled.reset()
    assert relative_gap(scheduled, model, x) < 1e-5


def test_a_watched_model_still_pickles_and_its_copies_leave_the_watch_alone(graph: Graph) -> None:
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (1,)), input_shape=SHAPE)
    x = torch.randn(1, *SHAPE)
    scheduled(x)
    twin = pickle.loads(pickle.dumps(model))
    twin.train()
    twin(torch.randn(4, *SHAPE))  # a copy's statistics move: the watched model's do not
    copy.deepcopy(model).train()(torch.randn(4, *SHAPE))
    assert not scheduled._watch.changed()
    assert relative_gap(scheduled, model, x) < 1e-5


def test_a_schedule_for_another_device_runs_only_when_asked_as_a_correctness_check(graph: Graph) -> None:
    planned = schedules_for(graph, "sim:v100", (1, 4))
    x = torch.randn(2, *SHAPE)
    eager_only = ScheduledModule(tiny(), planned, input_shape=SHAPE)
    with pytest.warns(UserWarning, match="any_device=True runs one anyway"):
        assert eager_only.schedule_for(x) is None
    checked = ScheduledModule(tiny(), planned, input_shape=SHAPE, any_device=True)
    with pytest.warns(UserWarning, match="schedule made for sim:v100 on cpu, as a correctness check"):
        assert checked.schedule_for(x).batch == 4
    torch.testing.assert_close(checked(x), eager(checked.module, x), rtol=1e-5, atol=1e-6)
    mixed = ScheduledModule(tiny(), planned + schedules_for(graph, "cpu", (8,)), input_shape=SHAPE, any_device=True)
    assert mixed.schedule_for(x).device == "cpu"  # a schedule for this device comes first


class Knobs(torch.nn.Module):
    """A model whose forward reads settings besides its weights: a number and a tensor of its own, a LeakyReLU's
    slope, a batch-norm's eps and statistics, a conv's dilation."""

    input_shape = (3, 12, 12)

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.act = torch.nn.LeakyReLU(0.1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.scale = 1.0
        self.shift = torch.zeros(1)  # a tensor that is neither a parameter nor a buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.c1(x)))
        return torch.cat([self.c2(y), self.c3(y)], 1) * self.scale + self.shift


def knobs() -> Knobs:
    torch.manual_seed(0)
    return randomise_batchnorm(Knobs())  # type: ignore[return-value]


def deployed(model: torch.nn.Module, batch: int = 2) -> ScheduledModule:
    """``model`` wrapped with an IOS-like schedule of its graph as it is now, at ``batch``."""
    shape = model.input_shape
    graph = import_module(model, torch.randn(1, *shape)).graph
    return ScheduledModule(model, [make_schedule(graph, BUILDERS["ios_like"], batch)], input_shape=shape)


def gap_now(scheduled: ScheduledModule, model: torch.nn.Module, x: torch.Tensor) -> float:
    """:func:`relative_gap`, where the call may run the original module with a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return relative_gap(scheduled, model, x)


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad])
def test_a_fused_optimizer_step_is_followed(graph: Graph, optimizer: type) -> None:
    """A fused step writes every parameter without increasing its version counter (issue 46, item 1)."""
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (2,)), input_shape=SHAPE)
    x = torch.randn(2, *SHAPE)
    assert relative_gap(scheduled, model, x) < 1e-5
    step = optimizer(model.parameters(), lr=0.1, fused=True)
    with torch.enable_grad():
        for _ in range(2):
            step.zero_grad()
            model(x).square().mean().backward()
            step.step()
    assert relative_gap(scheduled, model, x) < 1e-5
    assert scheduled.schedule_for(x) is not None  # the schedule runs again, on the new weights


CHANGES = {
    "a number the forward reads": lambda m: setattr(m, "scale", 2.0),
    "a LeakyReLU's slope": lambda m: setattr(m.act, "negative_slope", 0.5),
    "a batch-norm's eps": lambda m: setattr(m.bn, "eps", 0.5),
    "a conv's dilation": lambda m: setattr(m.c2, "dilation", (3, 3)) or setattr(m.c2, "padding", (3, 3)),
    "a forward hook": lambda m: m.c1.register_forward_hook(lambda module, args, out: out * 2),
    "a forward pre-hook": lambda m: m.c3.register_forward_pre_hook(lambda module, args: (args[0] + 1,)),
    "a global forward hook": lambda m: torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: out * 2 if isinstance(module, torch.nn.LeakyReLU) else None),
    "reset_running_stats": lambda m: m.bn.reset_running_stats(),
    "a statistic edited by hand": lambda m: m.bn.running_var.fill_(3.0),
    "a tensor attribute edited by hand": lambda m: m.shift.fill_(0.5),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_settings_and_hooks_changed_after_deploying_are_followed(change: str) -> None:
    """Issue 46, item 2: what the forward reads besides the weights, changed after deploying, changes the output."""
    model = knobs()
    scheduled = deployed(model)
    x = torch.randn(2, *model.input_shape)
    assert relative_gap(scheduled, model, x) < 1e-5
    before = model(x)
    handle = CHANGES[change](model)
    try:
        assert not torch.allclose(model(x), before)
        assert gap_now(scheduled, model, x) < 1e-5
    finally:
        if isinstance(handle, RemovableHandle):
            handle.remove()
    assert gap_now(scheduled, model, x) < 1e-5  # the hook removed again


def test_a_hook_there_when_deploying_stays_in_the_graph_and_its_removal_is_followed() -> None:
    model = knobs()
    handle = model.c1.register_forward_hook(lambda module, args, out: out * 2)
    scheduled = deployed(model)
    x = torch.randn(2, *model.input_shape)
    assert relative_gap(scheduled, model, x) < 1e-5 and scheduled.schedule_for(x) is not None
    handle.remove()
    assert gap_now(scheduled, model, x) < 1e-5


def test_with_gradients_on_the_output_has_the_history_autograd_needs(graph: Graph) -> None:
    """Issue 46, item 3: a schedule runs without autograd, so with gradients needed the original module runs."""
    model = tiny()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (2,)), input_shape=SHAPE)
    x = torch.randn(2, *SHAPE)
    with torch.enable_grad():
        with pytest.warns(UserWarning, match=r"gradients are enabled and Tiny's parameters require them.*"
                                             r"torch\.no_grad\(\)"):
            loss = scheduled(x).square().mean()
        loss.backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().mean().backward()
        torch.testing.assert_close(got, [p.grad for p in model.parameters()])
        scheduled(x)  # warned once
        model.requires_grad_(False)
        leaf = x.clone().requires_grad_()
        with pytest.warns(UserWarning, match="gradients are enabled and the input require"):
            scheduled(leaf).sum().backward()
        assert leaf.grad is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not scheduled(x).requires_grad and scheduled.schedule_for(x) is not None  # nothing needs autograd


@pytest.mark.parametrize("kernels", KERNEL_NAMES)
def test_under_autocast_the_original_module_runs_in_autocasts_precision(graph: Graph, kernels: str) -> None:
    model = tiny()
    schedules = [make_schedule(graph, BUILDERS["ios_like"], 2, device="cpu", kernels=kernels)]
    scheduled = ScheduledModule(model, schedules, input_shape=SHAPE)
    x = torch.randn(2, *SHAPE)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(UserWarning, match=r"torch\.autocast \(bfloat16\) is on, so ScheduledModule runs Tiny as "
                                             r"it is.*--dtype bfloat16"):
            out = scheduled(x)
        expected = model(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ScheduledModule runs")
        out = scheduled(x)  # without autocast, the schedule again
    assert out.dtype == torch.float32 and scheduled.schedule_for(x) is not None
    torch.testing.assert_close(out, eager(model, x), rtol=1e-5, atol=1e-6)


class WithOptions(torch.nn.Module):
    """A model whose forward takes a second input and an option, both with defaults."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        out = torch.relu(self.a(x)) + self.b(x) * scale
        return out if y is None else out + y


def test_a_call_given_more_than_the_input_runs_the_original_module_with_it() -> None:
    torch.manual_seed(0)
    model = WithOptions().eval()
    graph = import_module(model, torch.randn(1, 3, 8, 8)).graph
    scheduled = ScheduledModule(model, [make_schedule(graph, BUILDERS["ios_like"], 2, device="cpu")],
                                input_shape=(3, 8, 8))
    x, y = torch.randn(2, 3, 8, 8), torch.randn(2, 4, 8, 8)
    with pytest.warns(UserWarning, match=r"called with more than the input \(argument 2, scale=\), so it runs "
                                         r"WithOptions as it is with them"):
        torch.testing.assert_close(scheduled(x, y, scale=3.0), model(x, y, scale=3.0), rtol=0, atol=0)
    with pytest.warns(UserWarning, match=r"\(scale=\)"):
        torch.testing.assert_close(scheduled(x, scale=0.5), model(x, scale=0.5), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ScheduledModule")
        torch.testing.assert_close(scheduled(x), model(x), rtol=1e-5, atol=1e-6)  # the input alone: its schedule
    assert scheduled.schedule_for(x) is not None


def test_deploying_leaves_the_models_mode_as_it_was_and_says_when_it_trains(graph: Graph) -> None:
    """Issue 46, item 4: the caller's model keeps its mode; in training mode it runs as it is, with a warning."""
    model = tiny().train()
    model.stem[1].eval()
    scheduled = ScheduledModule(model, schedules_for(graph, "cpu", (2,)), input_shape=SHAPE)
    assert model.training and not model.stem[1].training and all(m.training for m in model.b2.modules())
    assert not scheduled.training
    x = torch.randn(2, *SHAPE)
    with pytest.warns(UserWarning, match=r"Tiny \(or one of its submodules\) is in training mode.*call \.eval\(\)"):
        torch.testing.assert_close(scheduled(x), model(x), rtol=0, atol=0)
    scheduled.eval()
    assert not any(m.training for m in model.modules())
    assert relative_gap(scheduled, model, x) < 1e-5 and scheduled.schedule_for(x) is not None
    model.stem[1].train()  # one submodule trained again: the original module runs (the warning was given)
    torch.testing.assert_close(scheduled(x), model(x), rtol=0, atol=0)
    model.stem[1].eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert relative_gap(scheduled, model, x) < 1e-5


def test_importing_leaves_every_submodules_mode_as_it_was() -> None:
    model = tiny().train()
    model.b3.eval()
    import_module(model, torch.randn(1, *SHAPE))
    assert [m.training for m in model.modules()] == [not any(m is b for b in model.b3.modules())
                                                      for m in model.modules()]


def test_a_pruned_model_deploys_and_follows_its_pruning() -> None:
    """Issue 46, item 5: ``torch.nn.utils.prune`` computes a layer's weight before each call, with autograd history."""
    import torch.nn.utils.prune as prune

    model = knobs()
    prune.l1_unstructured(model.c1, "weight", 0.5)
    prune.random_unstructured(model.c2, "weight", 0.3)
    scheduled = deployed(model)
    x = torch.randn(2, *model.input_shape)
    assert relative_gap(scheduled, model, x) < 1e-5 and scheduled.schedule_for(x) is not None
    with torch.no_grad():
        model.c1.weight_orig.mul_(0.5)
    assert relative_gap(scheduled, model, x) < 1e-5
    prune.l1_unstructured(model.c3, "weight", 0.5)  # pruned after deploying
    assert gap_now(scheduled, model, x) < 1e-5
    prune.remove(model.c1, "weight")
    assert gap_now(scheduled, model, x) < 1e-5


def test_a_copy_or_a_pickle_of_a_module_that_ran_runs_too(graph: Graph, tmp_path: Path) -> None:
    """Issue 46, item 12: the runners hold threads and locks; a copy builds its own."""
    scheduled = ScheduledModule(tiny(), schedules_for(graph, "cpu", (2,)), input_shape=SHAPE)
    x = torch.randn(2, *SHAPE)
    expected = scheduled(x)
    twin = copy.deepcopy(scheduled)
    torch.save(scheduled, tmp_path / "fast.pt")
    loaded = torch.load(tmp_path / "fast.pt", weights_only=False)
    for other in (twin, loaded, pickle.loads(pickle.dumps(scheduled))):
        torch.testing.assert_close(other(x), expected, rtol=0, atol=0)
        assert other.schedule_for(x) is not None
        with torch.no_grad():
            other.module.b1.weight.mul_(0.5)  # the copy follows its own module's weights
        assert relative_gap(other, other.module, x) < 1e-5
    torch.testing.assert_close(scheduled(x), expected, rtol=0, atol=0)
