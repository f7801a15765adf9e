"""pyhpc.meter: a researcher's own loop (and Lightning's, through the callback's hooks called
with stand-in objects) writes the metrics files pyhpc report reads; pyhpc train has no
other path to them. No assertion depends on how long anything took."""
from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest

import pyhpc
import pyhpc.meter
from pyhpc import paths
from pyhpc.errors import PyhpcError
from pyhpc.train import lightning, metrics, report


def researcher_loop(out: Path, steps: int = 6, **kw) -> metrics.Summary | None:
    meter = pyhpc.meter.Meter(out, warmup_steps=1, model="mlp", mode="toy", **kw)
    for epoch in range(2):
        for _ in range(steps // 2):
            meter.step(8)
        meter.epoch_end(loss=1.0 / (epoch + 1), accuracy=0.5 + epoch / 4)
    return meter.close()


def test_a_researchers_loop_writes_the_files_pyhpc_report_reads(tmp_path) -> None:
    summary = researcher_loop(tmp_path / "run")
    assert summary is not None and summary.steps == 5 and summary.local_batch == 8
    (read,) = metrics.read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert read == summary and (tmp_path / "run" / "metrics.csv").exists()
    assert read.extra == {"epochs": 2, "final_loss": 0.5, "final_accuracy": 0.75}
    assert (read.model, read.mode, read.workers, read.job_id) == ("mlp", "toy", 1, "local")
    assert report.collect([tmp_path]) == [read]


def two_ranks(times: tuple[list[float], list[float]], samples: tuple[list[int], list[int]]):
    def gather(mine: dict) -> list[dict]:
        return [{**mine, "rank": r, "host": f"n{r}", "step_times": times[r],
                 "samples": samples[r]} for r in (0, 1)]
    return gather


def test_a_step_takes_the_slowest_ranks_time_and_report_compares_runs(tmp_path) -> None:
    one = pyhpc.meter.Meter(tmp_path / "n1", local_batch=4, warmup_steps=0, model="m")
    one.write([{"rank": 0, "host": "n0", "step_times": [1.0, 1.0], "samples": [4, 4]}])
    two = pyhpc.meter.Meter(tmp_path / "n2", local_batch=4, warmup_steps=0, model="m",
                            gather=two_ranks(([1.0, 1.0], [2.0, 2.0]), ([4, 4], [4, 4])))
    summary = two.close()
    assert summary is not None and summary.samples_per_s == 4.0  # 8 samples / 2 s
    assert summary.nodes == "n0,n1" and summary.workers == 2
    runs = metrics.efficiency(report.collect([tmp_path]))
    assert [r.efficiency for r in runs] == [1.0, 0.5]


def test_uneven_batches_count_the_samples_each_step_trained(tmp_path) -> None:
    meter = pyhpc.meter.Meter(tmp_path, warmup_steps=1, model="m",
                              gather=two_ranks(([9.0, 1.0, 1.0, 1.0], [9.0, 1.0, 1.0, 2.0]),
                                               ([8, 8, 8, 3], [8, 8, 8, 3])))
    summary = meter.close()
    assert summary is not None and summary.local_batch == 8
    assert summary.samples_per_s == pytest.approx((16 + 16 + 6) / 4.0)


def test_only_rank_0_writes(tmp_path) -> None:
    meter = pyhpc.meter.Meter(tmp_path, local_batch=2, gather=lambda mine: None)
    meter.step()
    assert meter.close() is None and not (tmp_path / "metrics.jsonl").exists()


def test_too_few_steps_is_said_and_writes_nothing(tmp_path, capsys) -> None:
    meter = pyhpc.meter.Meter(tmp_path, local_batch=2, warmup_steps=5)
    meter.step()
    assert meter.close() is None
    assert capsys.readouterr().err.startswith("pyhpc.meter: no throughput summary: 1 steps")
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("samples", [0, -1, 1.5, True, "8", 1 << 40])
def test_a_sample_count_that_is_not_one_is_refused_in_one_line(tmp_path, samples) -> None:
    meter = pyhpc.meter.Meter(tmp_path)
    with pytest.raises(PyhpcError, match=r"^samples: ") as err:
        meter.step(samples)
    assert "\n" not in str(err.value) and meter.times == []


def test_a_step_without_a_count_needs_local_batch(tmp_path) -> None:
    with pytest.raises(pyhpc.meter.MeterError, match=r"^samples: step\(\) needs"):
        pyhpc.meter.Meter(tmp_path).step()


@pytest.mark.parametrize("kw, key", [({"model": "a b"}, "model"), ({"warmup_steps": -1},
                                     "warmup_steps"), ({"local_batch": 0}, "local_batch")])
def test_bad_settings_are_refused_naming_the_key(tmp_path, kw, key) -> None:
    with pytest.raises(PyhpcError, match=rf"^{key}: "):
        pyhpc.meter.Meter(tmp_path, **kw)


def test_the_meter_is_a_context_manager_and_reachable_from_a_bare_import(tmp_path) -> None:
    with pyhpc.meter.Meter(tmp_path, local_batch=3, warmup_steps=0) as meter:
        meter.step()
    assert (tmp_path / "metrics.jsonl").exists()
    assert pyhpc.meter.Meter is pyhpc.__getattr__("meter").Meter


def calls_in(path: Path, names: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in names}


def test_pyhpc_train_writes_its_metrics_only_through_the_meter() -> None:
    """No second path: outside the meter, nothing in the package summarises step times
    or writes metrics.jsonl/csv."""
    writers = {"summarize", "write_jsonl", "write_csv", "StepTimer"}
    offenders = {str(p.relative_to(paths.ROOT)): calls_in(p, writers)
                 for p in sorted((paths.ROOT / "pyhpc").rglob("*.py"))
                 if p.name not in ("meter.py", "metrics.py") and calls_in(p, writers)}
    assert offenders == {}


class Batch:
    def __init__(self, n: int) -> None:
        self.shape = (n, 3)


def test_the_lightning_callbacks_hooks_meter_a_fit(tmp_path) -> None:
    callback = pyhpc.meter.MeterCallback(tmp_path, warmup_steps=1, mode="toy")
    trainer = types.SimpleNamespace(callback_metrics={"train/loss": 0.25, "note": "text"},
                                    global_rank=0)
    module = type("TinyNet", (), {"device": types.SimpleNamespace(type="cpu")})()
    callback.on_train_start(trainer, module)
    for _ in range(2):
        callback.on_train_epoch_start(trainer, module)
        for i in range(3):
            callback.on_train_batch_end(trainer, module, None, (Batch(16), Batch(16)), i)
        callback.on_train_epoch_end(trainer, module)
    callback.on_train_end(trainer, module)
    (run,) = metrics.read_jsonl(tmp_path / "metrics.jsonl")
    assert (run.model, run.mode, run.local_batch, run.steps) == ("TinyNet", "toy", 16, 5)
    assert run.extra == {"epochs": 2, "final_train_loss": 0.25}


@pytest.mark.parametrize("batch, n", [(Batch(4), 4), ((Batch(5), Batch(5)), 5),
                                      ({"x": Batch(6)}, 6), ([[Batch(7)]], 7), ("text", None)])
def test_the_callback_reads_the_batch_size_from_the_first_tensor(batch, n) -> None:
    assert lightning.batch_size(batch) == n


def test_without_lightning_the_callback_is_a_plain_object() -> None:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        try:
            import pytorch_lightning  # noqa: F401
        except ImportError:
            assert pyhpc.meter.MeterCallback.__mro__[1] is object
            return
    assert pyhpc.meter.MeterCallback.__mro__[1].__name__ == "Callback"


def test_the_metrics_a_researcher_writes_are_the_ones_train_writes(tmp_path) -> None:
    researcher_loop(tmp_path)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert set(metrics.Summary.__dataclass_fields__) - {"extra"} <= set(row)
