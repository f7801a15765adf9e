"""The Slurm exporter: one call of each Slurm command a scrape, whatever the job count,
and every figure read from their answers (Slurm faked through pyhpc.slurm's RUNNER)."""
from __future__ import annotations

import subprocess
from collections import Counter

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pyhpc.errors import PyhpcError
from pyhpc.monitor import serve, slurm_exporter, slurm_state

NODES = (
    "NodeName=cpu1 Arch=x86_64 CPUAlloc=2 Gres=(null) State=ALLOCATED Partitions=cpu "
    "CfgTRES=cpu=2,mem=2G,billing=2 AllocTRES=cpu=2,mem=2G CapWatts=n/a\n"
    "NodeName=gpu1 Arch=x86_64 Gres=gpu:lab:4 State=MIXED+DRAIN Partitions=gpu "
    "CfgTRES=cpu=8,mem=8G,billing=8,gres/gpu=4,gres/gpu:lab=4 AllocTRES=cpu=2,gres/gpu=1 "
    "CapWatts=n/a Reason=bad fan [root@2026-11-25T16:30:00]\n"
    "NodeName=gpu2 Arch=x86_64 Gres=gpu:lab:4 State=DOWN*+DRAIN Partitions=gpu "
    "CfgTRES=cpu=8,gres/gpu=4 AllocTRES= Reason=Not responding [slurm@2026-11-25T16:31:00]\n"
    "NodeName=gpu3 Arch=x86_64 State=IDLE CfgTRES=cpu=8,gres/gpu=4 AllocTRES=\n")
SDIAG = """*******************************************************
sdiag output at Wed Nov 25 16:28:44 2026 (1795624124)
Server thread count:  3
Agent queue size:     0
DBD Agent queue size: 7

Jobs submitted: 10
Jobs started:   10
Jobs completed: 9
Jobs failed:    0

Main schedule statistics (microseconds):
\tLast cycle:   704
\tMax cycle:    1971
\tMean cycle:   400
\tCycles per minute: 3
\tLast queue length: 1

Backfilling stats
\tTotal backfilled jobs (since last slurm start): 2
\tLast cycle when: Wed Nov 25 16:28:13 2026 (1795624093)
\tLast cycle: 442
\tMax cycle:  574
\tMean cycle: 508
\tTotal backfilled jobs (since last stats cycle start): 1
\tTotal backfilled heterogeneous job components: 0
\tLast depth cycle: 1
\tLast depth cycle (try sched): 1
\tDepth Mean: 3

Remote Procedure Call statistics by message type
\tREQUEST_JOB_INFO                        ( 2003) count:62     ave_time:643    total_time:39890
\tREQUEST_PING                            ( 1008) count:1      ave_time:176    total_time:176

Remote Procedure Call statistics by user
\troot            (       0) count:98     ave_time:474    total_time:46482
"""


def queue_text(jobs: int) -> str:
    """``jobs`` running jobs of alice, two pending of bob, one completing array task."""
    lines = [f"{100 + i}|RUNNING|gpu|lab|alice|None" for i in range(jobs)]
    lines += ["900|PENDING|gpu|lab|bob|Resources", "900|PENDING|gpu|lab|bob|Resources",
              "901|PENDING|cpu|ws|carol|AssocMaxJobsLimit", "950|COMPLETING|cpu|lab|alice|None"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def cluster(fake_slurm):
    def answers(jobs: int, runaway: tuple[str, ...] = ()) -> None:
        fake_slurm.answers.update({
            "squeue": (0, queue_text(jobs)), "scontrol": (0, NODES), "sdiag": (0, SDIAG),
            "sacct": (0, "".join(f"{100 + i}\n" for i in range(jobs)) + "".join(
                f"{r}\n" for r in runaway))})
    answers(3)
    fake_slurm.set = answers
    return fake_slurm


def scrape() -> str:
    return generate_latest(serve.registry(slurm_exporter.SlurmCollector())).decode()


def value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in the scrape:\n{text}")


@pytest.mark.parametrize("jobs", [0, 1, 500])
def test_a_scrape_runs_one_of_each_slurm_command_whatever_the_job_count(cluster, jobs) -> None:
    cluster.set(jobs)
    text = scrape()
    assert Counter(call[0] for call in cluster.calls) == {c: 1 for c in slurm_exporter.COMMANDS}
    for command in slurm_exporter.COMMANDS:
        assert value(text, f'pyhpc_exporter_scrape_slurm_commands{{command="{command}"}}') == 1
    running = 'pyhpc_slurm_jobs{account="lab",partition="gpu",state="running",user="alice"}'
    assert (value(text, running) == jobs) if jobs else running not in text
    assert value(text, "slurm_queue_running") == jobs


def test_jobs_are_counted_by_state_partition_account_and_user_and_pending_by_reason(cluster) -> None:
    text = scrape()
    assert value(text, 'pyhpc_slurm_jobs{account="lab",partition="gpu",state="running",user="alice"}') == 3
    assert value(text, 'pyhpc_slurm_jobs{account="lab",partition="gpu",state="pending",user="bob"}') == 2
    assert value(text, 'pyhpc_slurm_jobs_pending{partition="gpu",reason="Resources"}') == 2
    assert value(text, 'pyhpc_slurm_jobs_pending{partition="cpu",reason="AssocMaxJobsLimit"}') == 1


def test_nodes_carry_their_state_and_whole_reason_and_gpus_declared_and_allocated(cluster) -> None:
    text = scrape()
    assert value(text, 'pyhpc_slurm_node_state{node="gpu1",reason="bad fan",state="draining"}') == 1
    assert value(text, 'pyhpc_slurm_node_state{node="gpu2",reason="Not responding",state="down"}') == 1
    assert value(text, 'pyhpc_slurm_node_state{node="cpu1",reason="",state="allocated"}') == 1
    assert value(text, 'pyhpc_slurm_node_gpus{node="gpu1"}') == 4
    assert value(text, 'pyhpc_slurm_node_gpus_allocated{node="gpu1"}') == 1
    assert 'pyhpc_slurm_node_gpus{node="cpu1"}' not in text


def samples(text: str) -> dict[str, float]:
    """Every series without labels, as Prometheus' text parser reads the scrape."""
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels}


def test_cluster_figures_have_prometheus_slurm_exporters_names(cluster) -> None:
    """vpenso's names, so its Grafana dashboards read them: nodes by state bucket (a
    draining node is drain, a down+drain one down), CPUs allocated, idle, other (out of
    service) and total, GPUs, jobs by state, per partition, account and user."""
    text = scrape()
    found = samples(text)
    assert {k: v for k, v in found.items() if k.startswith("slurm_nodes_")} == {
        "slurm_nodes_alloc": 1, "slurm_nodes_comp": 0, "slurm_nodes_down": 1,
        "slurm_nodes_drain": 1, "slurm_nodes_err": 0, "slurm_nodes_fail": 0,
        "slurm_nodes_idle": 1, "slurm_nodes_maint": 0, "slurm_nodes_mix": 0,
        "slurm_nodes_resv": 0}
    # cpu1 2/2, gpu1 2/8 draining (6 other), gpu2 0/8 down (8 other), gpu3 0/8 idle.
    assert [found[f"slurm_cpus_{n}"] for n in ("alloc", "idle", "other", "total")] == \
        [4, 8, 14, 26]
    assert [found[f"slurm_gpus_{n}"] for n in ("alloc", "idle", "total")] == [1, 11, 12]
    assert value(text, 'slurm_node_cpu_other{node="gpu1",status="draining"}') == 6
    assert value(text, 'slurm_node_cpu_idle{node="gpu3",status="idle"}') == 8
    assert (found["slurm_queue_running"], found["slurm_queue_pending"],
            found["slurm_queue_completing"], found["slurm_queue_pending_dependency"]) == \
        (3, 3, 1, 0)
    assert value(text, 'slurm_partition_jobs_pending{partition="gpu"}') == 2
    assert value(text, 'slurm_account_jobs_running{account="lab"}') == 3
    assert value(text, 'slurm_user_jobs_pending{user="carol"}') == 1
    assert not [n for n in found if n.startswith("slurm_") and n.removeprefix("slurm_")
                .split("_")[0] not in ("nodes", "cpus", "gpus", "queue", "scheduler")]


def test_scheduler_statistics_come_from_sdiag_as_prometheus_slurm_exporter_names_them(
        cluster) -> None:
    """Its names and units (cycles in microseconds, as sdiag prints them); pyhpc's own
    extras in seconds."""
    text = scrape()
    assert value(text, "slurm_scheduler_threads") == 3
    assert value(text, "slurm_scheduler_dbd_queue_size") == 7
    assert value(text, "slurm_scheduler_mean_cycle") == 400
    assert value(text, "slurm_scheduler_cycle_per_minute") == 3
    assert value(text, "slurm_scheduler_backfill_last_cycle") == 442
    assert value(text, "slurm_scheduler_backfill_depth_mean") == 3
    assert value(text, "slurm_scheduler_backfilled_jobs_since_start_total") == 2
    assert value(text, "slurm_scheduler_backfilled_jobs_since_cycle_total") == 1
    assert value(text, "pyhpc_slurm_scheduler_main_max_cycle_seconds") == pytest.approx(1971e-6)
    assert value(text, 'pyhpc_slurm_rpc_calls{type="REQUEST_JOB_INFO"}') == 62
    assert value(text, 'pyhpc_slurm_rpc_seconds{type="REQUEST_JOB_INFO"}') == pytest.approx(0.03989)


def test_runaway_jobs_are_those_accounting_runs_and_slurmctld_does_not(cluster) -> None:
    text = scrape()
    assert value(text, "pyhpc_slurmdbd_up") == 1 and value(text, "pyhpc_slurm_runaway_jobs") == 0
    cluster.set(3, runaway=("77", "78"))
    assert value(scrape(), "pyhpc_slurm_runaway_jobs") == 2


def test_slurmdbd_down_is_a_zero_and_no_runaway_figure(cluster) -> None:
    cluster.answers["sacct"] = (1, "", "sacct: error: Problem talking to the database: "
                                "Connection refused")
    text = scrape()
    assert value(text, "pyhpc_slurmdbd_up") == 0
    assert "pyhpc_slurm_runaway_jobs " not in text
    assert value(text, 'pyhpc_exporter_command_ok{command="sacct"}') == 0


def test_slurmdbd_that_does_not_answer_in_time_is_down_and_sacct_missing_unknown(
        cluster) -> None:
    def hangs(argv):
        raise subprocess.TimeoutExpired(argv, 10)

    cluster.answers["sacct"] = hangs
    text = scrape()
    assert value(text, "pyhpc_slurmdbd_up") == 0 and "pyhpc_slurm_runaway_jobs " not in text
    assert value(text, 'pyhpc_exporter_command_ok{command="sacct"}') == 0

    def missing(argv):
        raise FileNotFoundError(argv[0])

    cluster.answers["sacct"] = missing
    text = scrape()
    assert "pyhpc_slurmdbd_up " not in text
    assert value(text, 'pyhpc_exporter_command_ok{command="sacct"}') == 0


def test_a_failed_command_leaves_its_metrics_out_and_the_rest_in(cluster) -> None:
    cluster.answers["squeue"] = (1, "", "slurm_load_jobs error: Unable to contact slurm controller")
    text = scrape()
    assert "pyhpc_slurm_jobs{" not in text and "pyhpc_slurm_runaway_jobs " not in text
    assert "slurm_queue_running " not in text
    assert value(text, 'pyhpc_exporter_command_ok{command="squeue"}') == 0
    assert value(text, 'pyhpc_slurm_node_gpus{node="gpu1"}') == 4


@pytest.mark.parametrize("scontrol, sinfo", [
    ("IDLE", "idle"), ("MIXED", "mixed"), ("ALLOCATED+DRAIN", "draining"),
    ("IDLE+DRAIN", "drained"), ("DOWN*", "down"), ("DOWN+DRAIN", "down"),
    ("IDLE+FAIL", "fail"), ("MIXED+FAIL", "failing"), ("IDLE+MAINT+RESERVED", "maint"),
    ("IDLE+COMPLETING", "completing"), ("IDLE+POWERED_DOWN", "powered_down"), ("", "unknown")])
def test_scontrol_states_read_as_sinfo_names_them(scontrol, sinfo) -> None:
    assert slurm_state.long_state(scontrol) == sinfo


@pytest.mark.parametrize("text, host, port", [
    ("127.0.0.1:9810", "127.0.0.1", 9810), ("[::1]:9810", "::1", 9810),
    ("ctl.example:80", "ctl.example", 80), ("0.0.0.0:9810", "0.0.0.0", 9810)])
def test_listen_takes_an_address_and_a_port(text, host, port) -> None:
    assert serve.listen_address(text) == (host, port)


@pytest.mark.parametrize("text", [":9810", "9810", "127.0.0.1:", "127.0.0.1:0",
                                  "127.0.0.1:70000", "[nothex]:1", "-x:9810", "a b:1"])
def test_listen_without_an_address_or_port_is_refused_in_one_line(text) -> None:
    with pytest.raises(PyhpcError, match=r"^--listen: ") as err:
        serve.listen_address(text)
    assert "\n" not in str(err.value)


def test_the_exporter_has_no_default_address(capsys) -> None:
    with pytest.raises(SystemExit) as err:
        slurm_exporter.main([])
    assert err.value.code == 2 and "--listen" in capsys.readouterr().err


def test_a_bad_listen_address_is_one_line_and_exit_2(capsys) -> None:
    assert slurm_exporter.main(["--listen", ":9810"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc.monitor.slurm_exporter: --listen:") and err.count("\n") == 1
