"""The device decision, every combination, and the placement's flags: no GPU needed."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from pyhpc.dist import device
from pyhpc.dist.device import Choice, DeviceError, Placement, choose
from pyhpc.errors import PyhpcError
from pyhpc.paths import ROOT

NO_GPU = "cuda requested, but no GPU is visible to this task"


def decide(requested: str, cvd: str | None = None, rank: int = 0, count: int = 0,
           bound: bool = False, slurm: bool = True) -> str:
    """choose() as a string: the device name, or ``error: `` and the error's message."""
    try:
        return choose(requested, cuda_visible_devices=cvd, local_rank=rank, device_count=count,
                      one_per_task=bound, in_slurm=slurm).name
    except DeviceError as exc:
        return f"error: {str(exc).split(': ', 1)[1]}"


# requested, CUDA_VISIBLE_DEVICES, local rank, devices CUDA sees, Slurm bound one per task,
# inside a Slurm job -> device (or error).
TABLE = [
    # cpu is the CPU whatever is visible.
    ("cpu", None, 0, 0, False, False, "cpu"),
    ("cpu", "0,1", 1, 2, False, True, "cpu"),
    ("cpu", "3", 0, 1, True, True, "cpu"),
    # No device CUDA can see: auto falls back, cuda is an error (the lab's stand-in GPUs:
    # Slurm sets CUDA_VISIBLE_DEVICES=0,1 but a CPU torch sees nothing).
    ("auto", None, 0, 0, False, False, "cpu"),
    ("auto", "0,1", 0, 0, False, True, "cpu"),
    ("auto", "", 0, 0, False, True, "cpu"),
    ("cuda", None, 0, 0, False, False, f"error: {NO_GPU}"),
    ("cuda", "0,1", 1, 0, False, True, f"error: {NO_GPU}"),
    ("cuda", "NoDevFiles", 0, 0, False, True, f"error: {NO_GPU}"),
    # Slurm gave the job no GPU, but the node's GPUs are visible (no device cgroup):
    # auto must not take one; an explicit cuda may.
    ("auto", None, 0, 2, False, True, "cpu"),
    ("auto", "NoDevFiles", 0, 2, False, True, "cpu"),
    ("cuda", None, 1, 2, False, True, "cuda:1"),
    # Outside Slurm (a workstation, torchrun): every visible GPU is the process's to use.
    ("auto", None, 0, 1, False, False, "cuda:0"),
    ("auto", None, 1, 2, False, False, "cuda:1"),
    # One task per node seeing all its GPUs: local rank picks.
    ("auto", "0,1", 0, 2, False, True, "cuda:0"),
    ("auto", "0,1", 1, 2, False, True, "cuda:1"),
    ("cuda", "0,1,2,3", 3, 4, False, True, "cuda:3"),
    # Slurm bound one GPU per task (--gpus-per-task=1 / --gpu-bind): each sees one, cuda:0.
    ("auto", "1", 1, 1, True, True, "cuda:0"),
    ("cuda", "3", 3, 1, True, True, "cuda:0"),
    ("auto", "0", 0, 1, True, True, "cuda:0"),
    # Bound, but the task still sees several: the local rank picks among them.
    ("auto", "0,1", 1, 2, True, True, "cuda:1"),
    # A local rank with no GPU of its own (more tasks than GPUs): refused, never shared.
    ("auto", "0", 1, 1, False, True, "error: local rank 1 has no GPU of its own (1 visible"),
    ("cuda", "0,1", 2, 2, False, True, "error: local rank 2 has no GPU of its own (2 visible"),
    ("cuda", None, 2, 2, True, False, "error: local rank 2 has no GPU of its own (2 visible"),
]


@pytest.mark.parametrize(("requested", "cvd", "rank", "count", "bound", "slurm", "expected"),
                         TABLE, ids=[f"{r[0]}-cvd={r[1]}-rank{r[2]}-n{r[3]}"
                                     f"{'-bound' if r[4] else ''}{'-slurm' if r[5] else ''}"
                                     for r in TABLE])
def test_choose_table(requested: str, cvd: str | None, rank: int, count: int, bound: bool,
                      slurm: bool, expected: str) -> None:
    got = decide(requested, cvd, rank, count, bound, slurm)
    assert got.startswith(expected) if expected.startswith("error: ") else got == expected


CVDS = (None, "", "NoDevFiles", "0", "1", "0,1", "2,3,0,1")


@pytest.mark.parametrize("requested", device.DEVICES)
def test_choose_every_combination_keeps_the_rules(requested: str) -> None:
    """The whole product of inputs: the invariants hold for each one."""
    for cvd, rank, count, bound, slurm in itertools.product(
            CVDS, range(5), range(5), (False, True), (False, True)):
        case = (requested, cvd, rank, count, bound, slurm)
        try:
            got: Choice | None = choose(requested, cuda_visible_devices=cvd, local_rank=rank,
                                        device_count=count, one_per_task=bound,
                                        in_slurm=slurm)
        except DeviceError as exc:
            got = None
            assert exc.arg == "device" and "\n" not in str(exc), case
            assert isinstance(exc, PyhpcError)
        given = bool(device.visible(cvd)) if slurm and cvd is not None else None
        if requested == "cpu":
            assert got == Choice("cpu", None, "--device cpu"), case
            continue
        if count == 0 or (requested == "auto" and slurm and not given):
            # Nothing the task may use: auto -> cpu, cuda -> an error.
            assert (got is not None and got.type == "cpu") == (requested == "auto"), case
            assert got is not None or requested == "cuda", case
            continue
        if bound and count == 1:
            assert got is not None and got.name == "cuda:0", case
        elif rank < count:
            assert got is not None and got.name == f"cuda:{rank}", case
        else:
            assert got is None, case  # two ranks would share one GPU
        if got is not None:
            assert got.type == "cuda" and got.index is not None and 0 <= got.index < count


def test_an_unknown_device_is_named() -> None:
    with pytest.raises(DeviceError, match="^device: 'gpu' is not allowed; allowed: auto, cpu, "
                                          "cuda$"):
        choose("gpu", cuda_visible_devices=None, local_rank=0, device_count=1,
               one_per_task=False, in_slurm=False)


@pytest.mark.parametrize(("text", "expected"), [
    (None, None), ("", []), ("NoDevFiles", []), ("-1", []), ("0", ["0"]),
    ("0,1", ["0", "1"]), (" 2, 3 ,", ["2", "3"]), ("GPU-5f1c", ["GPU-5f1c"])])
def test_visible_devices(text: str | None, expected: list[str] | None) -> None:
    assert device.visible(text) == expected


@pytest.mark.parametrize(("env", "bound"), [
    ({}, False), ({"SLURM_GPUS_PER_TASK": "1"}, True), ({"SLURM_GPUS_PER_TASK": "2"}, False),
    ({"SLURM_GPU_BIND": "single:1"}, True), ({"SLURM_GPU_BIND": ""}, False)])
def test_one_gpu_per_task(env: dict[str, str], bound: bool) -> None:
    assert device.one_gpu_per_task(env) is bound


@pytest.mark.parametrize(("env", "rank"), [
    ({}, 0), ({"LOCAL_RANK": "3"}, 3),
    ({"SLURM_JOB_ID": "7", "SLURM_LOCALID": "1", "LOCAL_RANK": "5"}, 1),  # export_env's choice
    ({"SLURM_JOB_ID": "7", "SLURM_LOCALID": "1", "LOCAL_RANK": "5",
      "TORCHELASTIC_RUN_ID": "x"}, 5),  # torchrun's own local rank
    ({"SLURM_LOCALID": "1"}, 0)])
def test_local_rank_is_read_as_export_env_will_set_it(env: dict[str, str], rank: int) -> None:
    assert device.local_rank(env) == rank


def test_a_garbled_local_rank_is_one_line() -> None:
    with pytest.raises(DeviceError, match="^device: LOCAL_RANK is 'x', not a local rank$"):
        device.local_rank({"LOCAL_RANK": "x"})


PRECISION = [
    # precision, device, CPU autocast bf16, GPU native bf16 -> error or None
    ("fp32", "cpu", False, False, None),
    ("fp32", "cuda", False, False, None),
    ("bf16", "cpu", True, False, None),
    ("bf16", "cpu", False, False, "precision: bf16 on the CPU needs torch's CPU autocast"),
    ("bf16", "cuda", True, True, None),
    ("bf16", "cuda", True, False, "precision: bf16 needs a GPU with bfloat16 support (compute "
                                  "capability 8.0+); cuda:0 is Tesla V100"),
    ("fp16", "cpu", True, True, "precision: 'fp16' is not allowed; allowed: fp32, bf16"),
]


@pytest.mark.parametrize(("precision", "kind", "cpu_bf16", "cuda_bf16", "error"), PRECISION)
def test_precision_is_refused_where_the_device_cannot_do_it(
        precision: str, kind: str, cpu_bf16: bool, cuda_bf16: bool, error: str | None) -> None:
    choice = Choice(kind, 0 if kind == "cuda" else None, "")
    if error is None:
        device.check_precision(precision, choice, cpu_bf16=cpu_bf16, cuda_bf16=cuda_bf16)
        return
    with pytest.raises(DeviceError) as exc:
        device.check_precision(precision, choice, cpu_bf16=cpu_bf16, cuda_bf16=cuda_bf16,
                               gpu="Tesla V100 (compute capability 7.0)")
    assert str(exc.value).startswith(error) and exc.value.arg == "precision"


def test_placement_flags_are_off_on_the_cpu_and_on_for_a_gpu() -> None:
    cpu, gpu = Placement("cpu", None), Placement("cuda", 1, "bf16")
    assert (cpu.name, cpu.backend, cpu.device_ids) == ("cpu", "gloo", None)
    assert not (cpu.pin_memory or cpu.non_blocking or cpu.channels_last or cpu.cuda)
    assert (gpu.name, gpu.backend, gpu.device_ids) == ("cuda:1", "nccl", [1])
    assert gpu.pin_memory and gpu.non_blocking and gpu.channels_last and gpu.bf16
    assert device.CPU == Placement("cpu", None, "fp32", "default")


def test_resolve_on_this_machine_reads_the_environment() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count():
        pytest.skip("this machine has a CUDA device; the CPU-only answers do not apply")
    env = {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    place = device.resolve("auto", "bf16", env)
    assert (place.name, place.precision, place.backend) == ("cpu", "bf16", "gloo")
    with pytest.raises(DeviceError, match=f"^device: {NO_GPU} .*CUDA_VISIBLE_DEVICES '0,1'"):
        device.resolve("cuda", "fp32", env)


def test_the_cpu_placement_runs_without_touching_cuda() -> None:
    torch = pytest.importorskip("torch")
    cpu = device.CPU
    cpu.activate()
    cpu.synchronize()
    assert cpu.torch_device() == torch.device("cpu")
    assert cpu.memory_format() is torch.preserve_format
    with cpu.autocast():
        assert not torch.is_autocast_enabled("cpu")
    with Placement("cpu", None, "bf16").autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") is torch.bfloat16


def test_device_module_does_not_import_torch() -> None:
    code = "import sys, pyhpc.dist.device; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert proc.stdout.strip() == "False"
