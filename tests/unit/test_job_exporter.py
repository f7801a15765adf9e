"""The per-job exporter on faked cgroup trees (v1, the lab's per-node v1, v2), a faked NVML,
and Slurm faked through pyhpc.slurm's RUNNER: figures from the tree, labels from one
squeue call, GPU series only where a driver answers (never invented for stand-ins)."""
from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pyhpc.monitor import cgroups, gpus, job_exporter, serve
from pyhpc.slurm import rows, slurm


def _job(job_id: int, user: str, uid: int, account: str, nodes: list[str], cores: int,
         gres: list[str]) -> dict:
    """One job of squeue --json as Slurm 22.05 prints it (openapi/v0.0.38: the lab's)."""
    return {"job_id": job_id, "user_name": user, "user_id": uid, "account": account,
            "name": "a", "comment": "", "job_state": "RUNNING", "gres_detail": gres,
            "job_resources": {"nodes": ",".join(nodes), "allocated_cores": cores * len(nodes),
                              "allocated_hosts": len(nodes), "allocated_nodes": [
                                  {"nodename": n, "sockets": {"0": {"cores": {
                                      str(i): "allocated" for i in range(cores)}}}}
                                  for n in nodes]}}


#: squeue --json (the exporter's one call): alice's 41 holds GPUs 1-2 and 2 CPUs of gpu1,
#: bob's 42 a CPU on each of cpu1 and cpu2.
DETAILS = json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "jobs": [
    _job(41, "alice", 1000, "lab", ["gpu1"], 2, ["gpu:lab:2(IDX:1-2)"]),
    _job(42, "bob", 1001, "ws", ["cpu1", "cpu2"], 1, ["", ""])]})

def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_tree(root: Path, slurm_dir: str = "slurm") -> Path:
    job = Path(slurm_dir, "uid_1000", "job_41")
    write(root / "memory" / job / "memory.usage_in_bytes", "1048576\n")
    write(root / "memory" / job / "memory.max_usage_in_bytes", "4194304\n")
    write(root / "memory" / job / "memory.limit_in_bytes", "2147483648\n")
    write(root / "memory" / job / "memory.stat", "cache 1\nrss 2\ntotal_cache 4096\n"
          "total_rss 786432\ntotal_shmem 512\n")
    write(root / "cpuacct" / job / "cpuacct.usage", "2500000000\n")
    write(root / "cpuacct" / job / "cpuacct.usage_user", "2000000000\n")
    write(root / "cpuacct" / job / "cpuacct.usage_sys", "500000000\n")
    write(root / "devices" / job / "devices.list", "c 195:255 rwm\nc 195:2 rwm\nc 195:3 rwm\n"
          "c 1:3 rwm\n")
    other = Path(slurm_dir, "uid_1001", "job_42")  # no cpuacct: jobacct_gather/linux
    write(root / "memory" / other / "memory.usage_in_bytes", "100\n")
    write(root / "memory" / other / "memory.max_usage_in_bytes", "200\n")
    write(root / "memory" / other / "memory.limit_in_bytes", "9223372036854771712\n")
    return root


def v2_tree(root: Path, scope: str = "slurmstepd.scope") -> Path:
    write(root / "cgroup.controllers", "cpu memory\n")
    job = root / "system.slice" / scope / "job_41"
    write(job / "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    write(job / "memory.current", "1048576\n")
    write(job / "memory.peak", "4194304\n")
    write(job / "memory.max", "2147483648\n")
    write(job / "memory.stat", "anon 786432\nfile 4096\nshmem 512\nswapcached 8192\n")
    write(root / "system.slice" / scope / "job_42" / "memory.current", "100\n")  # no peak
    write(root / "system.slice" / scope / "job_42" / "memory.max", "max\n")
    return root


def test_v1_reads_cpu_seconds_memory_and_peak_and_the_devices_a_job_may_open(tmp_path) -> None:
    jobs = cgroups.read_jobs("gpu1", v1_tree(tmp_path))
    assert [(j.node, j.job_id, j.uid) for j in jobs] == [("gpu1", "41", 1000), ("gpu1", "42", 1001)]
    assert jobs[0].cpu_seconds == 2.5 and jobs[0].memory_bytes == 1 << 20
    assert jobs[0].memory_peak_bytes == 4 << 20 and jobs[0].gpu_minors == {2, 3}
    assert (jobs[0].cpu_user_seconds, jobs[0].cpu_system_seconds) == (2.0, 0.5)
    assert (jobs[0].memory_rss_bytes, jobs[0].memory_cache_bytes) == (786432, 4096)
    assert jobs[0].memory_limit_bytes == 2 << 30
    assert jobs[1].cpu_seconds is None and jobs[1].gpu_minors is None  # absent, not 0
    assert jobs[1].memory_limit_bytes is None  # the kernel's "no limit"


def test_the_labs_per_node_slurm_directories_name_the_node(tmp_path) -> None:
    v1_tree(tmp_path, "slurm_gpu7")
    v1_tree(tmp_path, "slurm_cpu2")
    nodes = {(j.node, j.job_id) for j in cgroups.read_jobs("vm", tmp_path)}
    assert nodes == {("gpu7", "41"), ("gpu7", "42"), ("cpu2", "41"), ("cpu2", "42")}


def test_v2_reads_usage_usec_memory_current_and_peak(tmp_path) -> None:
    jobs = cgroups.read_jobs("gpu1", v2_tree(tmp_path))
    assert cgroups.version(tmp_path) == 2
    assert [(j.node, j.job_id, j.uid) for j in jobs] == [("gpu1", "41", None), ("gpu1", "42", None)]
    assert (jobs[0].cpu_seconds, jobs[0].memory_bytes, jobs[0].memory_peak_bytes) == \
        (2.5, 1 << 20, 4 << 20)
    assert (jobs[0].cpu_user_seconds, jobs[0].cpu_system_seconds) == (2.0, 0.5)
    assert (jobs[0].memory_rss_bytes, jobs[0].memory_cache_bytes) == (786432 + 8192, 4096)
    assert jobs[0].memory_limit_bytes == 2 << 30
    assert jobs[1].memory_peak_bytes is None and jobs[1].cpu_seconds is None
    assert jobs[1].memory_limit_bytes is None and jobs[1].memory_rss_bytes is None


def test_v2_scopes_of_several_slurmd_name_their_node(tmp_path) -> None:
    v2_tree(tmp_path, "gpu3_slurmstepd.scope")
    assert {j.node for j in cgroups.read_jobs("vm", tmp_path)} == {"gpu3"}


def test_a_link_planted_in_the_tree_is_not_followed(tmp_path) -> None:
    v1_tree(tmp_path)
    target = tmp_path / "secret"
    target.write_text("999\n")
    usage = tmp_path / "memory/slurm/uid_1000/job_41/memory.usage_in_bytes"
    usage.unlink()
    usage.symlink_to(target)
    assert cgroups.read_jobs("gpu1", tmp_path)[0].memory_bytes is None


@pytest.mark.parametrize("text, minors", [
    ("c 195:0 rwm\nc 195:255 rwm\nc 195:254 rwm\n", {0}),
    ("a *:* rwm\n", None), ("c 195:* rwm\n", None), ("c 1:3 rwm\n", set()), (None, None)])
def test_devices_list_gives_the_gpus_a_job_may_open_or_none_if_unrestricted(text, minors) -> None:
    assert cgroups.allowed_gpu_minors(text) == (None if minors is None else frozenset(minors))


def test_squeue_details_give_user_account_and_gpu_indices_per_node(details) -> None:
    found = slurm.job_details()
    assert found["41"] == rows.JobView("41", "alice", "lab", {"gpu1": (1, 2)}, {"gpu1": 2},
                                         uid=1000)
    assert found["42"].gpu_index == {"cpu1": (), "cpu2": ()} and found["42"].account == "ws"
    assert found["42"].cpus == {"cpu1": 1, "cpu2": 1}
    assert gpus.minors_by_index((1, 2), [7, 4, 5, 6]) == {5, 6}


class FakeNvml(types.SimpleNamespace):
    """pynvml's calls used, over ``gpus``: (minor, utilization %, used, total). The driver
    reserves RESERVED more, which version 1 of the memory call counts as used; ``bindings_v2``
    and ``driver_v2``: whether the bindings and the driver know version 2."""

    RESERVED = 5

    class NVMLError(Exception):
        pass

    def __init__(self, gpus_: list[tuple[int, int, int, int]], init_error: bool = False,
                 bindings_v2: bool = True, driver_v2: bool = True) -> None:
        super().__init__(gpus=gpus_, init_error=init_error, driver_v2=driver_v2)
        if bindings_v2:
            self.nvmlMemory_v2 = 0x2000028

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int):
        if self.gpus[i] is None:
            raise self.NVMLError("GPU is lost")
        return self.gpus[i]

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version is None:
            return types.SimpleNamespace(used=h[2] + self.RESERVED, total=h[3])
        assert version == self.nvmlMemory_v2
        if not self.driver_v2:
            raise self.NVMLError("Function Not Found")
        return types.SimpleNamespace(used=h[2], reserved=self.RESERVED, total=h[3])

    def nvmlDeviceGetMinorNumber(self, h) -> int:
        return h[0]

    def nvmlDeviceGetUUID(self, h) -> bytes:
        return f"GPU-{h[0]}".encode()

    def nvmlDeviceGetName(self, h) -> str:
        return "NVIDIA H100"

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=h[1])

    def nvmlDeviceGetPowerUsage(self, h) -> int:
        return 1000 + h[0]

    def nvmlDeviceGetTemperature(self, h, sensor: int) -> int:
        raise self.NVMLError("Not Supported")


def scrape(collector: job_exporter.JobCollector) -> str:
    return generate_latest(serve.registry(collector)).decode()


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def series(text: str) -> Series:
    """The scrape as Prometheus' text parser reads it: (name, labels) -> value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: Series, metric: str, /, **labels: str) -> float | None:
    return found.get((metric, frozenset(labels.items())))


def names(found: Series) -> set[str]:
    return {name for name, _ in found}


def job(jobid: str, user: str, account: str, node: str = "gpu1") -> dict[str, str]:
    """The labels of a job's own cgroup: cgroup_exporter's (step and task empty) and pyhpc's."""
    return {"jobid": jobid, "step": "", "task": "", "node": node, "user": user,
            "account": account}


@pytest.fixture
def details(fake_slurm):
    fake_slurm.answers["squeue"] = (0, DETAILS)
    return fake_slurm


def test_jobs_are_labelled_from_one_squeue_call(tmp_path, details) -> None:
    collector = job_exporter.JobCollector(["gpu1"], v1_tree(tmp_path), tmp_path / "gres.conf",
                                          gpus.Nvml(FakeNvml([], init_error=True)))
    found = series(scrape(collector))
    alice, bob = job("41", "alice", "lab"), job("42", "bob", "ws")
    assert value(found, "pyhpc_job_memory_peak_bytes", **bob) == 200
    assert value(found, "cgroup_cpu_total_seconds", **bob) is None  # no cpuacct: absent
    assert value(found, "cgroup_uid", **alice) == 1000
    assert details.calls == [["squeue", "--all", "--json"]]
    assert value(found, "pyhpc_exporter_scrape_slurm_commands", command="squeue") == 1


@pytest.mark.parametrize("tree", [v1_tree, v2_tree])
def test_job_figures_have_cgroup_exporters_names_and_labels(tmp_path, details, tree) -> None:
    """The names Princeton's jobstats and its Grafana dashboard query, gauges as
    cgroup_exporter exports them, with its jobid, step and task labels (the job's own
    cgroup: step and task empty)."""
    text = scrape(job_exporter.JobCollector(["gpu1"], tree(tmp_path), tmp_path / "g",
                                            gpus.Nvml(FakeNvml([], init_error=True))))
    found, alice = series(text), job("41", "alice", "lab")
    rss = 786432 + (8192 if tree is v2_tree else 0)
    assert {name: value(found, name, **alice) for name in (
        "cgroup_cpu_total_seconds", "cgroup_cpu_user_seconds", "cgroup_cpu_system_seconds",
        "cgroup_cpus", "cgroup_memory_used_bytes", "cgroup_memory_rss_bytes",
        "cgroup_memory_cache_bytes", "cgroup_memory_shmem_bytes", "cgroup_memory_total_bytes",
        "pyhpc_job_memory_peak_bytes")} == {
        "cgroup_cpu_total_seconds": 2.5, "cgroup_cpu_user_seconds": 2.0,
        "cgroup_cpu_system_seconds": 0.5, "cgroup_cpus": 2, "cgroup_memory_used_bytes": 1 << 20,
        "cgroup_memory_rss_bytes": rss, "cgroup_memory_cache_bytes": 4096,
        "cgroup_memory_shmem_bytes": 512,
        "cgroup_memory_total_bytes": 2 << 30, "pyhpc_job_memory_peak_bytes": 4 << 20}
    types_ = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types_["cgroup_cpu_total_seconds"] == "gauge"  # no _total: jobstats' name
    assert value(found, "cgroup_memory_total_bytes", **job("42", "bob", "ws")) is None
    assert not {n for n in names(found) if n.startswith(("pyhpc_job_cpu", "pyhpc_gpu_"))}


def test_what_each_job_holds_is_exported_beside_what_it_uses(tmp_path, details) -> None:
    """CPUs from Slurm's allocation; GPUs from the device cgroup (41 may open 195:2-3),
    else from the GRES indices (a v2 host); nothing invented where neither says."""
    v1 = series(scrape(job_exporter.JobCollector(["gpu1"], v1_tree(tmp_path / "v1"),
                                                 tmp_path / "g",
                                                 gpus.Nvml(FakeNvml([], init_error=True)))))
    assert value(v1, "cgroup_cpus", **job("41", "alice", "lab")) == 2
    assert value(v1, "pyhpc_job_gpus", **job("41", "alice", "lab")) == 2
    assert value(v1, "cgroup_cpus", **job("42", "bob", "ws")) is None  # 42: cpu1-2, not gpu1
    v2 = series(scrape(job_exporter.JobCollector(["cpu1"], v2_tree(tmp_path / "v2"),
                                                 tmp_path / "g",
                                                 gpus.Nvml(FakeNvml([], init_error=True)))))
    assert value(v2, "cgroup_cpus", **job("42", "bob", "ws", "cpu1")) == 1
    assert value(v2, "pyhpc_job_gpus", **job("42", "bob", "ws", "cpu1")) == 0


def test_an_idle_host_asks_slurm_nothing(tmp_path, details) -> None:
    collector = job_exporter.JobCollector(["gpu1"], tmp_path, tmp_path / "gres.conf",
                                          gpus.Nvml(FakeNvml([], init_error=True)))
    scrape(collector)
    assert details.calls == []


def test_stand_in_gpus_get_no_invented_figures_only_a_count_of_their_devices(tmp_path,
                                                                           details) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text(f"NodeName=gpu1 Name=gpu Type=lab File={tmp_path}/dev/nvidia[0-1]\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")  # a regular file is no GPU device
    collector = job_exporter.JobCollector(["gpu1"], v1_tree(tmp_path / "cg"), gres,
                                          gpus.Nvml(FakeNvml([], init_error=True)))
    found = series(scrape(collector))
    assert not {n for n in names(found) if n.startswith("nvidia_gpu_")}
    assert value(found, "pyhpc_node_gpus_seen", node="gpu1", source="devices") == 0


def test_stand_ins_that_are_nvidia_character_devices_are_counted(tmp_path) -> None:
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null to point gres.conf at")
    gres = tmp_path / "gres.conf"
    gres.write_text("NodeName=gpu[1-2] Name=gpu File=/dev/null\n")
    # /dev/null is a character device, but with major 1, not NVIDIA's 195.
    assert job_exporter.stand_ins("gpu2", gres) == 0


def test_nvml_figures_are_labelled_with_the_job_holding_each_gpu(tmp_path, details) -> None:
    nvml = gpus.Nvml(FakeNvml([(0, 0, 0, 80), (1, 97, 70, 80), (2, 3, 10, 80), None]))
    collector = job_exporter.JobCollector(["gpu1"], v2_tree(tmp_path), tmp_path / "gres.conf",
                                          nvml)
    found = series(scrape(collector))
    gpu = {"name": "NVIDIA H100", "uuid": "GPU-1", "minor_number": "1", "ordinal": "1"}
    held = {**gpu, **job("41", "alice", "lab"), "userid": "1000"}
    assert value(found, "nvidia_gpu_duty_cycle", **held) == 97  # a percentage, as there
    assert value(found, "nvidia_gpu_memory_used_bytes", **held) == 70
    assert value(found, "nvidia_gpu_memory_total_bytes", **held) == 80
    assert value(found, "nvidia_gpu_power_usage_milliwatts", **held) == 1001
    assert value(found, "nvidia_gpu_temperature_celsius", **held) is None  # not supported
    free = {**gpu, "uuid": "GPU-0", "minor_number": "0", "ordinal": "0",
            **job("", "", ""), "userid": ""}
    assert value(found, "nvidia_gpu_duty_cycle", **free) == 0
    assert value(found, "pyhpc_node_gpus_seen", node="gpu1", source="nvml") == 3  # one lost
    assert value(found, "nvidia_gpu_num_devices") == 3


@pytest.mark.parametrize(("bindings_v2", "driver_v2", "used"), [
    (True, True, 70), (False, True, 75), (True, False, 75)])
def test_gpu_memory_used_leaves_out_what_the_driver_reserves_where_nvml_can_say(
        bindings_v2: bool, driver_v2: bool, used: int) -> None:
    # Version 2 of the call, as nvidia-smi counts; version 1 (reserved counted as used) only
    # where the bindings or the driver lack it.
    nvml = gpus.Nvml(FakeNvml([(1, 97, 70, 80)], bindings_v2=bindings_v2, driver_v2=driver_v2))
    samples = nvml.samples()
    assert samples is not None and samples[0].memory_used_bytes == used


def test_v1_devices_list_wins_over_the_gres_index(tmp_path, details) -> None:
    nvml = gpus.Nvml(FakeNvml([(2, 50, 1, 8), (3, 60, 1, 8), (1, 0, 0, 8)]))
    collector = job_exporter.JobCollector(["gpu1"], v1_tree(tmp_path), tmp_path / "gres.conf",
                                          nvml)
    holders = {dict(labels)["minor_number"]: dict(labels)["jobid"]
               for name, labels in series(scrape(collector)) if name == "nvidia_gpu_duty_cycle"}
    assert holders == {"1": "", "2": "41", "3": "41"}


def test_without_nvidia_ml_py_or_a_driver_nvml_says_why() -> None:
    assert not gpus.Nvml(FakeNvml([], init_error=True)).ok
    assert gpus.Nvml(FakeNvml([], init_error=True)).samples() is None
    assert "Driver Not Loaded" in gpus.Nvml(FakeNvml([], init_error=True)).why


def test_local_nodes_come_from_flags_or_the_labs_list(tmp_path) -> None:
    listed = tmp_path / "lab-nodes"
    listed.write_text("gpu1\ngpu2\n")
    assert job_exporter.local_nodes(["cpu1"], str(listed)) == ["cpu1", "gpu1", "gpu2"]
    assert len(job_exporter.local_nodes([], None)) == 1
