"""pyhpc bench: the formulas, the size ladder, the options, the results' shape, table and
PNG, and the job's code run for real on one CPU rank."""
from __future__ import annotations

import copy
import json
import multiprocessing as mp
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from pyhpc.bench import config as bench
from pyhpc.bench import results
from pyhpc.bench.config import GIB, KIB, MIB, BenchConfig, BenchError
from pyhpc.cli import main as cli

PNG = b"\x89PNG\r\n\x1a\n"


# -- formulas ----------------------------------------------------------------------------


@pytest.mark.parametrize(("ranks", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75),
                                               (16, 1.875)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(ranks: int, factor: float) -> None:
    assert bench.busbw(100.0, ranks) == pytest.approx(100.0 * factor)
    assert bench.busbw(100.0, ranks) == pytest.approx(100.0 * 2 * (ranks - 1) / ranks)


def test_busbw_of_nccl_tests_sample_row() -> None:
    """nccl-tests' own example: 8 GPUs, 1 GiB in 5.52 ms: algbw 194.5, busbw 340.4 GB/s."""
    algbw = bench.gbps(1 << 30, 5.52e-3)
    assert algbw == pytest.approx(194.5, abs=0.1)
    assert bench.busbw(algbw, 8) == pytest.approx(340.4, abs=0.2)


def test_busbw_needs_a_rank() -> None:
    with pytest.raises(BenchError, match="^ranks: must be at least 1, got 0$"):
        bench.busbw(1.0, 0)


def test_bandwidth_and_throughput_units() -> None:
    assert bench.gbps(2e9, 1.0) == 2.0 and bench.gbps(1, 0.0) == 0.0
    assert bench.tflops(1000, 2e-3) == pytest.approx(1.0)  # 2e9 flop in 2 ms


def test_size_ladder() -> None:
    assert bench.sizes(64 * MIB) == [4 * KIB * 4**k for k in range(8)]
    full = bench.sizes(GIB)
    assert full[0] == 4 * KIB and full[-1] == GIB and len(full) == 10
    assert bench.sizes(4 * KIB) == [4 * KIB]
    assert bench.sizes(5000) == [4 * KIB]  # bounded by max_bytes, never past it
    assert bench.sizes(100 * MIB, factor=2)[-1] == 64 * MIB
    with pytest.raises(BenchError, match="^max_bytes: the ladder needs 4096 <= max_bytes"):
        bench.sizes(1024)


def test_iterations_are_the_same_for_every_rank_and_bounded() -> None:
    counts = [bench.iterations(n) for n in bench.sizes(GIB)]
    assert counts[0] == 20 and counts[-1] == 2 and counts == sorted(counts, reverse=True)


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), (0, 0), ("4096", 4096), ("4K", 4096), ("64M", 64 * MIB), ("64MiB", 64 * MIB),
    ("64mb", 64 * MIB), ("1G", GIB), (" 1GiB ", GIB), (8192, 8192)])
def test_sizes_are_read_in_binary_units(text: object, expected: int) -> None:
    assert bench.parse_bytes("max_bytes", text) == expected


@pytest.mark.parametrize("bad", ["2G", "1K", "4095", "-4K", "1.5M", "64 apples", "", True, None,
                                 GIB + 1, 10])
def test_bad_sizes_are_one_line_naming_the_option(bad: object) -> None:
    with pytest.raises(BenchError) as exc:
        bench.parse_bytes("max_bytes", bad)
    assert str(exc.value).startswith("max_bytes: ") and exc.value.arg == "max_bytes"
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("gen", "width", "peak"), [(4, 16, 31.504), (5, 16, 63.008),
                                                    (3, 16, 15.76), (4, 8, 15.752),
                                                    (None, 16, None), (9, 16, None)])
def test_pcie_peak(gen: int | None, width: int, peak: float | None) -> None:
    assert results.pcie_peak(gen, width) == peak


NVIDIA_SMI_Q = """
==============NVSMI LOG==============
Attached GPUs                             : 1
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    PCI
        Bus                               : 0x18
        GPU Link Info
            PCIe Generation
                Max                       : 5
                Current                   : 1
                Device Current            : 1
                Device Max                : 5
                Host Max                  : 4
            Link Width
                Max                       : 16x
                Current                   : 16x
        Bridge Chip
            Type                          : N/A
"""
NVLINK_S = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f2b)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
\t Link 2: <inactive>
\t Link 3: 26.562 GB/s
"""


def test_nvidia_smi_parsers() -> None:
    # The idle link reports Gen1; the nominal peak is the lower of GPU's and host's maximum.
    assert results.parse_pcie(NVIDIA_SMI_Q) == (4, 16)
    assert results.parse_pcie("no PCI section") == (None, None)
    assert results.parse_nvlink(NVLINK_S) == pytest.approx(79.686)
    assert results.parse_nvlink("GPU 0: no links\n") is None


def test_link_row_on_a_gpu_compares_with_the_nominal_peaks() -> None:
    copies = [{"bytes": GIB, "direction": "h2d", "memory": "pinned", "GBps": 12.6},
              {"bytes": GIB, "direction": "h2d", "memory": "pageable", "GBps": 30.0},
              {"bytes": GIB, "direction": "d2h", "memory": "pinned", "GBps": 30.0}]
    groups = [{"scope": "intra-node", "rows": [{"busbw_GBps": 39.8}, {"busbw_GBps": 10.0}]},
              {"scope": "inter-node", "rows": [{"busbw_GBps": 79.0}]}]
    row = results.link_row(3, "gpu1", True, NVIDIA_SMI_Q, NVLINK_S, copies, groups)
    assert (row["pcie_gen"], row["pcie_width"], row["pcie_peak_GBps"]) == (4, 16, 31.504)
    assert row["known"] and row["reason"] == "nvidia-smi"
    assert row["copy_fraction"] == pytest.approx(12.6 / 31.504)  # pinned h2d only
    assert row["allreduce_fraction"] == pytest.approx(39.8 / 79.686)  # intra-node vs NVLink
    no_nvlink = results.link_row(3, "gpu1", True, NVIDIA_SMI_Q, None, copies, groups)
    assert no_nvlink["allreduce_fraction"] == pytest.approx(39.8 / 31.504)  # vs PCIe
    silent = results.link_row(3, "gpu1", True, None, None, copies, groups)
    assert not silent["known"] and silent["reason"] == "nvidia-smi did not answer"
    assert silent["copy_fraction"] is None and silent["allreduce_fraction"] is None
    cpu = results.link_row(0, "cpu1", False, NVIDIA_SMI_Q, NVLINK_S, copies, groups)
    assert not cpu["known"] and cpu["reason"].startswith("no GPU")
    for each in (row, no_nvlink, silent, cpu):
        results._keep(results.LINK_ROW, each, "link")


def test_command_text_is_none_when_the_command_is_missing_or_fails() -> None:
    from pyhpc.dist import device

    assert device.command_text(["/bin/echo", "hi"]) == "hi\n"
    assert device.command_text(["/nonexistent/nvidia-smi", "-q"]) is None
    assert device.command_text(["/bin/false"]) is None
    assert device.nvidia_smi(device.CPU, "-q") is None


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "message"), [
    ("device", "gpu", "device: 'gpu' is not allowed; allowed: auto, cpu, cuda"),
    ("matmul_size", 40000, "matmul_size: must be an integer from 0 to 32768, got 40000"),
    ("threads", 0, "threads: must be an integer from 1 to 256, got 0"),
    ("tests", ("copy", "nccl"), "tests: 'copy,nccl' is not allowed; give some of copy, "
                                "allreduce, matmul, each once"),
    ("tests", (), "tests: '' is not allowed"),
    ("tests", ("copy", "copy"), "tests: 'copy,copy' is not allowed"),
    ("max_bytes", "2G", "max_bytes: '2G' is not allowed"),
])
def test_bench_config_refuses_bad_options(tmp_path: Path, field: str, value: object,
                                          message: str) -> None:
    with pytest.raises(BenchError) as exc:
        BenchConfig(out=str(tmp_path), **{field: value})  # type: ignore[arg-type]  # deliberately wrong types
    assert str(exc.value).startswith(message) and exc.value.arg == field


def test_auto_sizes_depend_on_the_device(tmp_path: Path) -> None:
    cfg = BenchConfig(out=str(tmp_path))
    assert (cfg.top_bytes("cpu"), cfg.top_bytes("cuda")) == (64 * MIB, GIB)
    assert (cfg.matmul_n("cpu"), cfg.matmul_n("cuda")) == (512, 8192)
    cfg = BenchConfig(out=str(tmp_path), max_bytes="1M", matmul_size=128)
    assert (cfg.top_bytes("cuda"), cfg.matmul_n("cuda")) == (MIB, 128)


# -- results: shape, table, plot -------------------------------------------------------


def _bench_in_child(cfg: BenchConfig, queue: Any) -> None:
    from pyhpc.bench import job as bench_job

    queue.put(bench_job.run(cfg))


def run_job_code(out: Path, **options: Any) -> dict[str, Any]:
    """The job's code, for real, as one rank on this machine's CPU (its own process)."""
    pytest.importorskip("torch")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    cfg = BenchConfig(out=str(out), device="cpu", max_bytes="64K", matmul_size=64, **options)
    proc = ctx.Process(target=_bench_in_child, args=(cfg, queue))
    with socket.socket() as free:  # a port of its own: other test runs on this machine use 29500
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MASTER_PORT", port)
        proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    doc: dict[str, Any] = queue.get(timeout=5)
    return doc


@pytest.fixture(scope="module")
def cpu_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "out"
    return out, run_job_code(out)


def test_the_job_code_writes_json_table_and_png_on_the_cpu(
        cpu_results: tuple[Path, dict[str, Any]]) -> None:
    out, doc = cpu_results
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.png", "bench.txt"]
    assert results.read_results(out / "bench.json") == doc
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert (out / "bench.png").read_bytes()[:8] == PNG
    assert (out / "bench.txt").read_text() == results.table(doc)


def test_the_json_shape(cpu_results: tuple[Path, dict[str, Any]]) -> None:
    _, doc = cpu_results
    assert doc["schema"] == "pyhpc.bench/1" and doc["device"] == "cpu"
    assert doc["backend"] == "gloo" and doc["world_size"] == 1 and doc["job_id"] == "local"
    assert doc["tests"] == ["copy", "allreduce", "matmul"]
    ladder = [4 * KIB, 16 * KIB, 64 * KIB]
    (rank,) = doc["copy"]["ranks"]
    assert [(r["bytes"], r["direction"], r["memory"]) for r in rank["rows"]] == [
        (n, "h2h", "pageable") for n in ladder]  # no GPU: host memory copies, no pinned
    assert "no GPU" in doc["copy"]["what"] and doc["copy"]["max_bytes"] == 64 * KIB
    assert all(r["GBps"] > 0 for r in rank["rows"])
    # One rank: no group to all-reduce in; it says so.
    assert doc["allreduce"]["groups"] == [] and doc["allreduce"]["backend"] == "gloo"
    assert doc["allreduce"]["skipped"] and "one rank there" in doc["allreduce"]["skipped"][0]
    (mm,) = doc["matmul"]["ranks"]
    assert [(r["dtype"], r["n"]) for r in mm["rows"]] == [("fp32", 64), ("bf16", 64)]
    assert all(r["tflops"] > 0 for r in mm["rows"])
    (link,) = doc["link"]["ranks"]
    assert link["known"] is False and link["copy_fraction"] is None
    assert json.loads(json.dumps(doc)) == doc  # plain JSON all the way down


def test_only_the_tests_asked_for_run(tmp_path: Path) -> None:
    doc = run_job_code(tmp_path / "out", tests=("matmul",))
    assert doc["copy"] is None and doc["allreduce"] is None and doc["matmul"]["ranks"]
    text = results.table(doc)
    assert "Copy" not in text and "All-reduce" not in text and "Matmul (n = 64)" in text


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("nodes"), "results: bench.nodes is missing or of the wrong type"),
    (lambda d: d.update(schema="other/1"), "results: schema 'other/1' is not pyhpc.bench/1"),
    (lambda d: d["copy"]["ranks"][0]["rows"][0].update(GBps="fast"),
     "results: copy.ranks[0].rows[0].GBps is missing"),
    (lambda d: d["link"]["ranks"][0].update(known=1), "results: link.ranks[0].known"),
    (lambda d: d["matmul"]["ranks"][0]["rows"].append({}), "results: matmul.ranks[0].rows[2]"),
    (lambda d: d.update(world_size=True), "results: bench.world_size"),
])
def test_a_document_of_the_wrong_shape_is_refused(
        cpu_results: tuple[Path, dict[str, Any]], change: Any, message: str) -> None:
    doc = copy.deepcopy(cpu_results[1])
    change(doc)
    with pytest.raises(BenchError) as exc:
        results.check_document(doc)
    assert str(exc.value).startswith(message)


def gpu_document() -> dict[str, Any]:
    """What two 2-GPU nodes would report (figures made up, shape real)."""
    def copies(scale: float) -> list[dict[str, Any]]:
        return [{"bytes": n, "direction": d, "memory": m, "seconds": n / (g * 1e9),
                 "GBps": g} for n in (4 * KIB, GIB) for d in ("h2d", "d2h")
                for m, g in (("pageable", 10.0 * scale), ("pinned", 25.0 * scale))]

    def reduce(scope: str, nodes: list[str], ranks: int, alg: float) -> dict[str, Any]:
        return {"scope": scope, "nodes": nodes, "ranks": ranks, "rows": [
            {"bytes": n, "iterations": bench.iterations(n), "seconds": n / (alg * 1e9),
             "algbw_GBps": alg, "busbw_GBps": bench.busbw(alg, ranks)} for n in (4 * KIB, GIB)]}

    link = {"rank": 0, "host": "gpu1", "known": True, "reason": "nvidia-smi", "pcie_gen": 4,
            "pcie_width": 16, "pcie_peak_GBps": 31.504, "nvlink_GBps": None,
            "copy_fraction": 25.0 / 31.504, "allreduce_fraction": 0.5}
    return {
        "schema": results.SCHEMA, "job_id": "7", "torch_version": "2.13.0", "device": "cuda",
        "backend": "nccl", "nodes": ["gpu1", "gpu2"], "world_size": 4,
        "tests": list(bench.TESTS), "units": {},
        "copy": {"what": "host<->device", "max_bytes": GIB, "ranks": [
            {"rank": r, "host": f"gpu{1 + r // 2}", "device": f"cuda:{r % 2}",
             "rows": copies(1.0 if r else 0.9)} for r in range(4)]},
        "allreduce": {"backend": "nccl", "definition": "", "skipped": [], "groups": [
            reduce("intra-node", ["gpu1"], 2, 20.0), reduce("intra-node", ["gpu2"], 2, 18.0),
            reduce("inter-node", ["gpu1", "gpu2"], 4, 8.0)]},
        "matmul": {"n": 8192, "note": "", "ranks": [
            {"rank": r, "host": "gpu1", "device": "cuda:0", "rows": [
                {"dtype": "fp32", "n": 8192, "seconds": 1.0, "tflops": 50.0 + r},
                {"dtype": "bf16", "n": 8192, "seconds": 1.0, "tflops": 600.0 + r}]}
            for r in range(4)]},
        "link": {"ranks": [link, {**link, "rank": 1, "host": "gpu1"}]},
    }


def test_table_reports_the_slowest_rank_and_node() -> None:
    doc = results.check_document(gpu_document())
    text = results.table(doc)
    lines = text.splitlines()
    assert lines[0].startswith("pyhpc bench: job 7, 2 node(s) (gpu1, gpu2), 4 rank(s), "
                               "device cuda, backend nccl")
    head = next(line for line in lines if line.lstrip().startswith("size  h2d pageable"))
    assert head.split() == ["size", "h2d", "pageable", "h2d", "pinned", "d2h", "pageable",
                            "d2h", "pinned"]
    copy_gib = next(line for line in lines if line.startswith("1 GiB"))
    assert copy_gib.split()[2:] == ["9.00", "22.50", "9.00", "22.50"]  # rank 0's: slowest
    reduce = next(line for line in lines if line.strip().startswith("size  intra-node"))
    assert "intra-node (2 ranks)" in reduce and "inter-node (4 ranks)" in reduce
    gib = [line for line in lines if line.strip().startswith("1 GiB")]
    assert gib[-1].split()[-2:] == ["18.00", "12.00"]  # slowest node's busbw; 8 x 1.5
    assert "50.00  600.00" in text
    assert "Gen4 x16" in text and "79%" in text and "50%" in text


def test_table_on_the_cpu_says_the_link_is_unknown(
        cpu_results: tuple[Path, dict[str, Any]]) -> None:
    text = results.table(cpu_results[1])
    assert "Fraction of nominal link peak: unknown (no GPU" in text
    assert "host memory copy" in text and "h2h pageable" in text


def test_png_of_a_gpu_document(tmp_path: Path) -> None:
    path = results.plot(gpu_document(), tmp_path / "bench.png")
    assert path.read_bytes()[:8] == PNG


def test_write_results_refuses_a_bad_document_and_writes_nothing(tmp_path: Path) -> None:
    doc = gpu_document()
    doc.pop("link")
    with pytest.raises(BenchError, match="^results: bench.link is missing"):
        results.write_results(tmp_path / "out", doc)
    assert not (tmp_path / "out").exists()


def test_read_results_of_garbage_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bench.json").write_text("{not json")
    with pytest.raises(BenchError, match=r"^results: .*bench.json: not valid JSON \(Expecting"):
        results.read_results(tmp_path / "bench.json")


@pytest.mark.parametrize(("number", "why"), [
    ("Infinity", "Infinity is not a number pyhpc reads"), ("NaN", "NaN is not a number"),
    ("1e999", "the number '1e999' is beyond"), ("5e-324", "the number '5e-324' is denormal"),
    ("9" * 5000, "the integer '99999"), ("-1" + "0" * 20, "the integer '-1000")])
def test_bench_results_with_a_number_that_is_not_finite_and_bounded_are_one_line(
        tmp_path: Path, number: str, why: str) -> None:
    text = json.dumps(gpu_document()).replace('"GBps": ', f'"GBps": {number}, "was": ', 1)
    (tmp_path / "bench.json").write_text(text)
    with pytest.raises(BenchError) as exc:
        results.read_results(tmp_path / "bench.json")
    assert why in str(exc.value) and "\n" not in str(exc.value) and len(str(exc.value)) < 300


# -- the command -----------------------------------------------------------------------


def test_bench_submits_one_job_through_submitit(slurm, capsys, tmp_path: Path) -> None:
    assert cli.main(["bench", "--nodes", "2", "--out", "results", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == {"job_id": "4243", "out": str(tmp_path / "results")}
    (sbatch,) = [c for c in slurm.tool_calls if c.startswith("sbatch")]
    text = Path(sbatch.split()[-1]).read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=cpu", "#SBATCH --job-name=bench",
                 "#SBATCH --ntasks-per-node=1"):
        assert line in text
    assert "gpus" not in text
    assert not (tmp_path / "results").exists()  # the job writes it


def test_bench_gpus_asks_for_every_gpu_of_the_partition(slurm, capsys) -> None:
    assert cli.main(["bench", "--gpus", "--partition", "gpu", "--out", "r"]) == 0
    (sbatch,) = [c for c in slurm.tool_calls if c.startswith("sbatch")]
    text = Path(sbatch.split()[-1]).read_text()
    assert "#SBATCH --gpus-per-node=2" in text and "#SBATCH --ntasks-per-node=2" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "--gpus"], "gpus_per_node: partition 'cpu' has 0 GPUs per node, 1 requested; "
                          "partitions with GPUs: gpu"),
    (["bench", "--gpus", "--partition", "cpu", "--gpus-per-node", "2"],
     "gpus_per_node: partition 'cpu' has 0 GPUs per node, 2 requested"),
    (["bench", "--nodes", "3"], "nodes: partition 'cpu' has 2 nodes, 3 requested"),
    (["bench", "--max-bytes", "2G"], "max_bytes: '2G' is not allowed"),
    (["bench", "--tests", "copy,ping"], "tests: 'copy,ping' is not allowed"),
    (["bench", "--partition", "bigmem", "--gpus"], "partition: unknown partition 'bigmem'"),
])
def test_bench_refusals_are_one_line_exit_2_and_nothing_submitted(
        argv: list[str], message: str, slurm, capsys, tmp_path: Path) -> None:
    assert cli.main([*argv, "--out", "r"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyhpc: error: {message}") and err.count("\n") == 1
    assert slurm.calls == [] and slurm.tool_calls == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake-bin"]
