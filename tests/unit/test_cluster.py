"""The cluster definition: defaults, expansion and every validation error."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyhpc import cluster, paths
from pyhpc.cluster import ConfigError

LAB = paths.LAB_CLUSTER
EXAMPLE = paths.ROOT / "ansible" / "inventories" / "example" / "cluster.yml"
DDL256 = paths.ROOT / "ansible" / "inventories" / "lab" / "ddl256.yml"
#: The lab machine's RAM, for checks that must not depend on where the tests run.
LAB_RAM_MB = 24 * 1024


def lab_data() -> dict[str, Any]:
    return yaml.safe_load(LAB.read_text())


def test_lab_definition_expands_node_groups_and_ports() -> None:
    spec = cluster.load(LAB)
    assert [n.name for n in spec.nodes] == ["cpu1", "cpu2", "gpu1", "gpu2"]
    assert [n.port for n in spec.nodes] == [17001, 17002, 17003, 17004]
    assert spec.default_partition.name == "cpu"
    assert spec.partition_gpus("gpu") == 2
    assert spec.partition_gpus("cpu") == 0
    assert spec.mode == "lab" and spec.accounting


def test_example_definition_is_valid_and_uses_default_slurmd_port() -> None:
    spec = cluster.load(EXAMPLE)
    assert len(spec.nodes) == 16
    assert {n.port for n in spec.nodes} == {6818}
    assert spec.node("gn3").gpu_detect == "nvml"


def test_first_partition_becomes_default_when_none_is_marked() -> None:
    data = lab_data()
    data["partitions"][0].pop("default")
    assert cluster.parse(data).default_partition.name == "cpu"


def edit(path: str, value: Any) -> dict[str, Any]:
    """The lab definition with one value replaced; `path` is dotted, ints index lists."""
    data = copy.deepcopy(lab_data())
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = data
    for key in parents:
        target = target[key]
    target[last] = value
    return data


BAD = [
    # (what is changed, new value, text the message must contain)
    ("unknown_key", 1, "cluster.unknown_key: unknown key; allowed: accounting, accounts"),
    ("nodes.0.colour", "red", "nodes[0].colour: unknown key; allowed: count, cpus"),
    ("partitions.1.qos", "high", "partitions[1].qos: unknown key; allowed: default, max_time"),
    ("lab.ports", 1, "lab.ports: unknown key; allowed: slurmd_base_port"),
    ("nodes.0.count", 0, "nodes[0].count: must be an integer from 1 to 1024, got 0"),
    ("nodes.0.cpus", -2, "nodes[0].cpus: must be an integer from 1 to 4096, got -2"),
    ("nodes.1.memory_mb", 0, "nodes[1].memory_mb: must be an integer from 1 to 67108864, got 0"),
    ("nodes.1.gpus", -1, "nodes[1].gpus: must be an integer from 0 to 16, got -1"),
    ("nodes.0.cpus", True, "nodes[0].cpus: must be an integer from 1 to 4096, got True"),
    ("nodes.1.name", "cpu", "nodes: duplicate node name 'cpu1'"),
    ("partitions.1.nodes", ["gpu1", "gpu9"], "partitions[1].nodes: unknown node 'gpu9'; known nodes: cpu1"),
    ("partitions.1.nodes", [], "partitions[1].nodes: must name at least one node"),
    ("jupyterhub.hostname", "10.0.0.5", "jupyterhub.hostname: 10.0.0.5 is an address; each "
     "user's server has its own origin, <user>.<hostname>, so the hub needs a DNS name"),
    ("partitions.1.name", "cpu", "partitions[1].name: duplicate partition name 'cpu'"),
    ("partitions.1.default", True, "partitions.default: only one partition may be default"),
    ("partitions.0.max_time", "soon",
     "partitions[0].max_time: 'soon' is not a Slurm time limit; use UNLIMITED or MM"),
    ("mode", "cloud", "mode: 'cloud' is not allowed; allowed: lab, hosts"),
    ("container_runtime", "docker", "container_runtime: 'docker' is not allowed; allowed: podman"),
    ("accounting", "yes", "accounting: must be true or false, got 'yes'"),
    ("name", "Lab Cluster", "name: 'Lab Cluster' is not allowed; use lower-case letters"),
    ("nodes", [], "nodes: must be a non-empty list of at most 4096 node groups"),
    ("nodes.1.gpu_detect", "nvml", "nodes.gpu_detect: 'nvml' needs real GPUs; mode: lab"),
    ("accounts.0.users", "root", "accounts[0].users: must be a list of at most 4096 names, got 'root'"),
    ("tuning", "fast", "tuning: 'fast' is not allowed; allowed: default, high_throughput"),
    ("tuning", None, "tuning: None is not allowed; allowed: default, high_throughput"),
    ("slurmd_timeout", 5, "slurmd_timeout: must be an integer from 10 to 65533, got 5"),
    ("slurmd_timeout", "60", "slurmd_timeout: must be an integer from 10 to 65533, got '60'"),
    # Words Slurm's parsers give a meaning of their own, per field, in any case.
    ("nodes.1", {"name": "default", "cpus": 1, "memory_mb": 1},
     "nodes[1].name: 'default' is a word Slurm reserves in node names (NodeName=DEFAULT sets"),
    ("nodes.1", {"name": "ALL", "cpus": 1, "memory_mb": 1}, "nodes[1].name: 'ALL' is a word "
                                                              "Slurm reserves in node names"),
    ("partitions.1.name", "Default", "partitions[1].name: 'Default' is a word Slurm reserves in "
                                     "partition names"),
    ("accounts.0.name", "root", "accounts[0].name: 'root' is a word Slurm reserves in account "
                                "names (the root of Slurm's association tree)"),
    ("name", "All", "name: 'All' is a word Slurm reserves in cluster names"),
    ("nodes.1.gpu_type", "No_Consume", "nodes[1].gpu_type: 'No_Consume' is a word Slurm "
                                       "reserves in gres_type names"),
    # Per-user limits of an account.
    ("accounts.0.limits", {"jobs": 0}, "accounts[0].limits.jobs: must be an integer from 1 to "
                                       "100000, got 0"),
    ("accounts.0.limits", {"gpus": 10**400}, "accounts[0].limits.gpus: must be an integer from "
                                              "0 to 65536"),
    ("accounts.0.limits", {"jobs": 4, "submitted_jobs": 2},
     "accounts[0].limits.submitted_jobs: 2 is below accounts[0].limits.jobs 4"),
    ("accounts.0.limits", {"cpus": 2}, "accounts[0].limits.cpus: unknown key; allowed: gpus, "
                                       "jobs, nodes, submitted_jobs"),
    # Directory numbers clear of system ids and nobody/nogroup.
    ("directory", {"uid_min": 999}, "directory.uid_min: must be an integer from 1000"),
    ("directory", {"uid_min": 50000, "uid_max": 70000},
     "directory.uid_max: the range 50000-70000 reaches into 60000-65535 (ids Debian and "
     "systemd reserve, nobody and nogroup 65534)"),
    ("directory", {"uid_min": 65534, "uid_max": 65534}, "directory.uid_max: the range "
                                                         "65534-65534 reaches into"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD, ids=[b[0] + "=" + repr(b[1]) for b in BAD])
def test_invalid_definition_names_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        cluster.parse(edit(path, value))
    assert message in str(err.value)


def test_missing_required_key_is_named() -> None:
    data = lab_data()
    del data["partitions"]
    with pytest.raises(ConfigError, match=r"cluster.partitions: required key is missing"):
        cluster.parse(data)


def test_missing_file_and_bad_yaml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read cluster definition"):
        cluster.load(tmp_path / "absent.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("nodes: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        cluster.load(bad)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyhpc", *args],
                          capture_output=True, text=True, check=False)


def test_cli_validate_prints_one_line_error_and_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yml"
    bad.write_text(yaml.safe_dump(edit("nodes.0.cpus", 0)))
    before = bad.read_bytes()
    result = run_cli("cluster", "validate", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "pyhpc: error: nodes[0].cpus: must be an integer from 1 to 4096, got 0"]
    assert bad.read_bytes() == before


def test_cli_validate_json_is_the_normalised_definition() -> None:
    result = run_cli("cluster", "validate", "--json", str(LAB))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [n["name"] for n in data["nodes"]] == ["cpu1", "cpu2", "gpu1", "gpu2"]
    assert data["partitions"][1] == {"name": "gpu", "nodes": ["gpu1", "gpu2"],
                                     "default": False, "max_time": "1-00:00:00"}


def test_tuning_defaults_to_default_and_reaches_the_json() -> None:
    assert cluster.load(LAB).tuning == "default"
    data = edit("tuning", "high_throughput")
    assert cluster.parse(data).to_dict()["tuning"] == "high_throughput"


def test_slurmd_timeout_defaults_to_slurms_300_and_reaches_the_json() -> None:
    assert cluster.load(LAB).slurmd_timeout == 300
    assert cluster.parse(edit("slurmd_timeout", 60)).to_dict()["slurmd_timeout"] == 60


def test_ddl256_is_64_servers_of_4_gpus_with_the_labs_accounts() -> None:
    spec = cluster.load(DDL256, LAB_RAM_MB)
    lab = cluster.load(LAB, LAB_RAM_MB)
    gpu_nodes = [n for n in spec.nodes if n.gpus]
    assert len(gpu_nodes) == 64 and {n.gpus for n in gpu_nodes} == {4}
    assert sum(n.gpus for n in spec.nodes) == 256
    assert [n.port for n in spec.nodes] == list(range(17001, 17001 + len(spec.nodes)))
    assert spec.partition("gpu").nodes == tuple(n.name for n in gpu_nodes)
    assert spec.tuning == "high_throughput" and spec.mode == "lab"
    assert (spec.name, spec.accounts, spec.directory) == (lab.name, lab.accounts, lab.directory)
    # Overcommitted (declared memory is never reserved), within the validator's bound.
    assert LAB_RAM_MB < sum(n.memory_mb for n in spec.nodes) <= cluster.LAB_MEMORY_FACTOR * LAB_RAM_MB


def test_lab_memory_may_overcommit_this_machine_up_to_four_times() -> None:
    """The lab's 4 nodes declare 8 GiB: 2 GiB of RAM is enough, 2 GiB less 1 MiB is not."""
    assert cluster.parse(lab_data(), 2048).nodes
    with pytest.raises(ConfigError) as err:
        cluster.parse(lab_data(), 2047)
    assert str(err.value) == (
        "nodes.memory_mb: the 4 lab nodes declare 8192 MiB together, more than 4 x this "
        "machine's 2047 MiB (MemTotal), where mode lab runs them all; allowed: at most 8188 "
        "MiB in all")


def test_hosts_memory_is_never_compared_with_this_machine() -> None:
    assert cluster.load(EXAMPLE, 1).nodes  # each host has its own memory


def test_machine_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:  1000 kB\nMemTotal:       24684096 kB\n")
    assert cluster.machine_memory_mb(meminfo) == 24105
    meminfo.write_text("MemTotal: lots\n")
    assert cluster.machine_memory_mb(meminfo) is None
    assert cluster.machine_memory_mb(tmp_path / "absent") is None


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_refuses_a_lab_far_beyond_this_machines_memory(tmp_path: Path) -> None:
    if cluster.machine_memory_mb() is None:
        pytest.skip("this machine does not report MemTotal")
    data = edit("nodes.0.count", 1024)
    data["nodes"][0]["memory_mb"] = 64 << 20  # 1024 nodes x 64 TiB: beyond any machine
    bad = write(tmp_path, data)
    before = bad.read_bytes()
    result = run_cli("cluster", "validate", "--json", str(bad))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("pyhpc: error: nodes.memory_mb: the 1026 lab nodes declare "
                               "68719480832 MiB together, more than 4 x this machine's ")
    assert "(MemTotal), where mode lab runs them all; allowed: at most " in lines[0]
    assert bad.read_bytes() == before


def test_cli_refuses_lab_ports_past_65535(tmp_path: Path) -> None:
    data = edit("lab.slurmd_base_port", 65000)
    data["nodes"] = [{"name": "cpu", "count": 1000, "cpus": 1, "memory_mb": 1}]
    data["partitions"] = [{"name": "cpu", "nodes": ["cpu1"]}]
    bad = write(tmp_path, data)
    before = bad.read_bytes()
    result = run_cli("cluster", "validate", "--json", str(bad))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "pyhpc: error: lab.slurmd_base_port: 65000 + 1000 nodes goes past port 65535 (the last "
        "node would get 65999); allowed: 1024 to 64536"]
    assert bad.read_bytes() == before


def test_accounts_carry_per_user_limits_into_the_json() -> None:
    data = edit("accounts.0.limits", {"jobs": 4, "submitted_jobs": 20, "nodes": 2, "gpus": 4})
    spec = cluster.parse(data, LAB_RAM_MB)
    assert spec.accounts[0].limits == cluster.Limits(jobs=4, submitted_jobs=20, nodes=2, gpus=4)
    assert spec.to_dict()["accounts"][0]["limits"] == {"jobs": 4, "submitted_jobs": 20,
                                                       "nodes": 2, "gpus": 4}
    assert cluster.parse(lab_data(), LAB_RAM_MB).accounts[0].limits == cluster.Limits()


def test_uid_ranges_beyond_the_system_ids_are_accepted() -> None:
    d = cluster.parse(edit("directory", {"uid_min": 70000, "uid_max": 80000}), LAB_RAM_MB).directory
    assert d is not None and (d.uid_min, d.uid_max) == (70000, 80000)


def test_one_node_limit_bounds_a_definition_a_job_a_user_and_a_sweep() -> None:
    from dataclasses import fields

    from pyhpc.cli import jobs as cli_jobs
    from pyhpc.cluster import users as cluster_users
    from pyhpc.slurm.jobspec import JobSpec, JobSpecError

    nodes = next(f for f in fields(JobSpec) if f.name == "nodes")
    assert nodes.metadata["bounds"] == (1, cluster.MAX_NODES)
    assert cluster_users.BOUNDS["nodes"] == (1, cluster.MAX_NODES)
    assert cli_jobs._int_list("nodes", f"1,{cluster.MAX_NODES}") == [1, cluster.MAX_NODES]
    with pytest.raises(JobSpecError, match=str(cluster.MAX_NODES)):
        cli_jobs._int_list("nodes", str(cluster.MAX_NODES + 1))
