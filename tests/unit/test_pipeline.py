"""The deep model and its pipeline split: balanced stages, no stage built whole, and one
pipelined step (two gloo ranks, 1F1B and GPipe) equal to the same step in one process."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as td
import torch.multiprocessing as mp
from torch import nn

from pyhpc.train import deep
from pyhpc.train.config import TrainConfig, TrainError
from pyhpc.train.pipeline import bubble_theory

LAYERS, STAGES, MICRO, BATCH = 6, 2, 4, 8
#: float32 sums in another order: the pipelined step may differ this much, no more.
TOLERANCE = 1e-5


def test_balanced_stages_cost_about_the_same_and_cover_every_layer() -> None:
    costs = deep.layer_costs(1000)
    for stages in (2, 3, 4, 8):
        starts = deep.balance(costs, stages)
        bounds = [*starts, len(costs)]
        sums = [sum(costs[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
        assert starts[0] == 0 and len(starts) == stages and sorted(starts) == starts
        assert max(sums) <= min(sums) + max(costs) * 1.01, sums


def test_each_stage_builds_only_its_layers_with_the_unsplit_models_weights() -> None:
    full = deep.build(LAYERS, seed=3)
    parts = [deep.build(LAYERS, s, 3, seed=3) for s in range(3)]
    assert sum(len(p) for p in parts) == len(full) == LAYERS + 2
    split = [m for p in parts for m in p]
    for a, b in zip(full, split, strict=True):
        for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            assert na == nb and torch.equal(pa, pb)


def test_sixteen_thousand_layers_build_a_stage_at_a_time() -> None:
    part = deep.build(16_000, 3, 4)
    assert len(part) == len(deep.stage_range(16_000, 3, 4)) < 4100
    assert sum(p.numel() for p in part.parameters()) < 16_000 * 2_400 / 3


def _reference() -> tuple[float, dict[str, torch.Tensor]]:
    model = deep.build(LAYERS, seed=0)
    x, y = deep.data(BATCH, 1)
    loss = nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    return loss.item(), {f"{i}.{n}": p.grad for i, layer in enumerate(model)
                         for n, p in layer.named_parameters()}


def _rank(rank: int, store: str, schedule: str, out: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    td.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=STAGES)
    part = deep.build(LAYERS, rank, STAGES, seed=0)
    stage = PipelineStage(part, rank, STAGES, torch.device("cpu"))
    kind = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
    sched = kind(stage, MICRO, loss_fn=nn.CrossEntropyLoss())
    x, y = deep.data(BATCH, 1)
    losses: list[torch.Tensor] = []
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=y, losses=losses)
    indices = deep.stage_range(LAYERS, rank, STAGES)
    grads = {f"{i}.{n}": p.grad for i, layer in zip(indices, part, strict=True)
             for n, p in layer.named_parameters()}
    loss = torch.stack(losses).mean().item() if losses else None
    torch.save({"loss": loss, "grads": grads}, f"{out}/rank{rank}.pt")
    td.destroy_process_group()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_one_pipelined_step_gives_the_loss_and_gradients_of_one_process(tmp_path: Path,
                                                                       schedule: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(str(tmp_path / "store"), schedule, str(tmp_path)), nprocs=STAGES)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(STAGES)]
    loss, grads = _reference()
    got = {k: v for r in ranks for k, v in r["grads"].items()}
    assert got.keys() == grads.keys()
    assert abs(ranks[-1]["loss"] - loss) <= TOLERANCE
    worst = max((got[k] - grads[k]).abs().max().item() for k in grads)
    print(json.dumps({"schedule": schedule, "loss": loss, "max_grad_difference": worst}))
    assert worst <= TOLERANCE


def test_bubble_of_equal_stages() -> None:
    assert bubble_theory(1, 4) == 0.0
    assert bubble_theory(2, 2) == pytest.approx(1 / 3)
    assert bubble_theory(4, 16) == pytest.approx(3 / 19)


@pytest.mark.parametrize(("values", "message"), [
    ({"pipeline": 2}, "pipeline: only the deep model is split into stages; add --model deep"),
    ({"pipeline": 4, "model": "deep", "layers": 1}, "pipeline: 4 stages need at least 2 residual"),
    ({"pipeline": 4, "model": "deep", "microbatches": 2}, "microbatches: at least one per stage"),
    ({"pipeline": 2, "model": "deep", "microbatches": 3, "batch_size": 32},
     "microbatches: 3 does not divide the batch size 32"),
    ({"layers": 16_001}, "layers: "),
])
def test_pipeline_options_that_cannot_work_are_refused_in_one_line(tmp_path: Path, values: dict,
                                                                    message: str) -> None:
    with pytest.raises(TrainError) as err:
        TrainConfig(out=str(tmp_path), **values)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_deep_model_trains_on_generated_images(tmp_path: Path) -> None:
    cfg = TrainConfig(out=str(tmp_path), model="deep")
    assert cfg.mode == "synthetic"


def _run(stages: int, nodes: int, rate: float, micro: int = 4, schedule: str = "1f1b",
         bubble: float = 0.3) -> Any:
    from pyhpc.train import metrics

    extra = {} if stages == 1 else {"pipeline": stages, "microbatches": micro, "schedule": schedule,
                                    "stage_bubble": [bubble] * stages}
    return metrics.Summary(
        workers=nodes, local_batch=32, global_batch=32 * nodes, steps=5, warmup_steps=1,
        step_time_p50=0.1, step_time_p90=0.1, step_time_mean=0.1, samples_per_s=rate,
        samples_per_s_per_worker=rate / nodes, torch_version="x", backend="gloo", job_id="1",
        nodes=",".join(f"cpu{i + 1}" for i in range(nodes)), mode="synthetic",
        model="DeepResNet-200", extra=extra)


def test_efficiency_compares_a_pipelined_run_only_with_its_own_stage_count() -> None:
    from pyhpc.train import metrics

    runs = metrics.efficiency([_run(1, 1, 100.0), _run(1, 2, 180.0), _run(2, 1, 60.0),
                               _run(2, 2, 120.0)])
    by = {(metrics.stages(r), r.workers): r.efficiency for r in runs}
    assert by[(1, 2)] == pytest.approx(0.9) and by[(2, 2)] == pytest.approx(1.0)


def test_report_draws_throughput_by_stages_and_the_bubble_by_micro_batches(tmp_path: Path) -> None:
    from pyhpc.train import metrics, report, stageplot

    for i, run in enumerate([_run(1, 1, 100.0), _run(2, 1, 60.0, micro=2, bubble=0.4),
                             _run(2, 2, 110.0, micro=8, bubble=0.15)]):
        (tmp_path / str(i)).mkdir()
        metrics.write_jsonl(tmp_path / str(i) / "metrics.jsonl", [run])
    runs, written = report.write_report([tmp_path], "weak", None)
    assert [p.name for p in written] == ["scaling.png", stageplot.PNG_NAME]
    assert written[1].read_bytes().startswith(b"\x89PNG") and written[1].stat().st_size > 10_000
    assert stageplot.bubble(runs[-1]) in (0.4, 0.15)


def test_a_sweep_over_stage_counts_gives_each_its_tasks_and_directory(tmp_path: Path, lab) -> None:
    from pyhpc.slurm.jobspec import JobSpec
    from pyhpc.train import sweep

    base = TrainConfig(out=str(tmp_path), model="deep", layers=40, synthetic_samples=640)
    points = sweep.plan(base, [1, 2], [32], "weak", JobSpec(), tmp_path, lab, [1, 2])
    got = [(spec.nodes, spec.tasks, cfg.pipeline, Path(cfg.out).name) for spec, cfg in points]
    assert got == [(1, 1, 1, "nodes1-batch32"), (1, 2, 2, "nodes1-batch32-stages2"),
                   (2, 1, 1, "nodes2-batch32"), (2, 2, 2, "nodes2-batch32-stages2")]
