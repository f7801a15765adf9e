"""Monitoring labels are the job's own whatever its owner writes in it (issue 51, item 4).

A user sets a job's name, comment, work dir and output paths; ``scontrol show job -o``
prints them unescaped between the fields pyhpc reads (``JobName=`` before ``UserId=``,
``Comment=`` after the per-node ``GRES=``), so a comment could forge another job's id,
user, account and GPUs. Slurm is faked here by :class:`Slurm`, which prints what the
lab's Slurm 22.05 prints (the scontrol line below is the lab's own, for such a job) and
what 24.11's data_parser prints, for jobs given as :class:`Job`: whatever the command
line pyhpc asks for, the answer is Slurm's, so a parser that read user text would fail.
"""
from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pyhpc.monitor import admin_comment, gpus, job_exporter, prometheus, record, serve, slurm_exporter
from pyhpc.slurm import rows, slurm, submit

#: What the lab's Slurm 22.05.8 printed for ``scontrol -d -o show job`` of a job of
#: user1 with a hostile name and comment (job 1 of a fresh lab, 2026-12-03).
LAB_LINE = (
    "JobId=1 JobName=evil UserId=root(0) Account=victim JobId=1 UserId=user1(20000) "
    "GroupId=lab(20000) MCS_label=N/A Priority=4294901759 Nice=0 Account=lab QOS=normal "
    "JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=00:02:00 TimeMin=N/A "
    "SubmitTime=2026-12-03T12:31:15 EligibleTime=2026-12-03T12:31:15 "
    "AccrueTime=2026-12-03T12:31:15 StartTime=2026-12-03T12:31:15 EndTime=2026-12-03T12:33:15 "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-03T12:31:15 "
    "Scheduler=Main Partition=gpu AllocNode:Sid=localhost:15284 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=gpu1 BatchHost=gpu1 NumNodes=1 NumCPUs=1 NumTasks=1 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1G,node=1,billing=1,gres/gpu=1 Socks/Node=* "
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:lab:1   Nodes=gpu1 CPU_IDs=0 Mem=1024 "
    "GRES=gpu:lab:1(IDX:0) MinCPUsNode=1 MinMemoryCPU=1G MinTmpDiskNode=0 Features=(null) "
    "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/home/user1 Comment=x JobId=1 UserId=root(0) Account=victim "
    "GRES=gpu:8 Nodes=gpu2 CPU_IDs=0-31 Mem=0 GRES=gpu:2(IDX:0-1)  StdErr=/dev/null "
    "StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1 \n")

#: Text a hostile user writes into a job: Slurm's own keys and separators, a forged line.
FORGERIES = (
    " JobId=1 UserId=root(0) Account=victim GRES=gpu:8",
    "   Nodes=gpu1 CPU_IDs=0-63 Mem=0 GRES=gpu:lab:2(IDX:0-1) MinCPUsNode=1",
    "\nJobId=1 JobName=x UserId=root(0) GroupId=root(0) Account=victim ",
    "\n1|0|root|victim|2026-01-01T00:00:00|2026-01-01T00:00:01\n",
    '", "user_name": "root", "account": "victim", "job_id": 1, "x": "',
    "|", "=", "{}", "{\"", "'", '"', "\\", "\t", "%j", "%u", "%x", "(IDX:0-7)",
    "é", "ジョブ", "\U0001f525", "\u202e", "\u0085", "\u2028",
)
START, END = 1796301075, 1796301195


@dataclass(frozen=True)
class Job:
    """One job as slurmctld holds it: what its owner cannot change, then what they can."""

    job_id: int
    user: str
    uid: int
    account: str
    gpu_index: dict[str, str]  # node -> IDX list as Slurm prints it ("0-1"), "" for none
    cpus: dict[str, int] = field(default_factory=dict)
    name: str = "job"
    comment: str = ""
    work_dir: str = "/home/u"
    stdout: str = "/dev/null"

    @property
    def nodes(self) -> list[str]:
        return list(self.gpu_index)

    def detail(self, node: str) -> str:
        idx = self.gpu_index[node]
        return f"gpu:lab:{len(rows.task_ids(idx))}(IDX:{idx})" if idx else ""


def stamp(seconds: int) -> str:
    return time.strftime(rows.TIME_FORMAT, time.localtime(seconds))


def scontrol_line(job: Job) -> str:
    """``scontrol -d -o show job``'s line in 22.05's field order (the lab's, above)."""
    per_node = "".join(
        f"   Nodes={node} CPU_IDs={','.join(map(str, range(job.cpus.get(node, 1))))} Mem=1024 "
        f"GRES={job.detail(node)}" for node in job.nodes)
    return (f"JobId={job.job_id} JobName={job.name} UserId={job.user}({job.uid}) "
            f"GroupId=lab(20000) Account={job.account} QOS=normal JobState=RUNNING "
            f"StartTime={stamp(START)} EndTime={stamp(END)} NodeList={','.join(job.nodes)} "
            f"JOB_GRES=gpu:lab:1{per_node} MinCPUsNode=1 Command=(null) WorkDir={job.work_dir} "
            f"Comment={job.comment} StdErr={job.stdout} StdIn=/dev/null StdOut={job.stdout} "
            "Power=\n")


def cores(count: int, layout: str) -> object:
    """The cores of one node's allocation, as each data parser lists them (one socket)."""
    if layout == "22.05":
        return {"0": {"cores": {str(i): "allocated" for i in range(count)}}}
    return [{"index": 0, "cores": [{"index": i, "status": ["ALLOCATED"]} for i in range(count)]}]


def number(value: int, layout: str) -> object:
    return value if layout == "22.05" else {"set": True, "infinite": False, "number": value}


def json_job(job: Job, layout: str) -> dict[str, object]:
    """One job of ``squeue --json``: 22.05's openapi/v0.0.38 (seen on the lab) or 24.11's
    data_parser/v0.0.42 (its parsers.c: JOB_INFO, JOB_RES, JOB_RES_NODE)."""
    allocated = [(node, job.cpus.get(node, 1)) for node in job.nodes]
    if layout == "22.05":
        resources: dict[str, object] = {
            "nodes": ",".join(job.nodes), "allocated_cores": sum(c for _, c in allocated),
            "allocated_hosts": len(allocated),
            "allocated_nodes": [{"sockets": cores(c, layout), "nodename": node, "cpus_used": 0,
                                 "memory_used": 0, "memory_allocated": 1024}
                                for node, c in allocated]}
    else:
        resources = {"select_type": ["CORE"], "cpus": sum(c for _, c in allocated),
                     "threads_per_core": {"set": True, "infinite": False, "number": 1},
                     "nodes": {"count": len(allocated), "select_type": ["AVAILABLE"],
                               "list": ",".join(job.nodes), "whole": False,
                               "allocation": [{"index": i, "name": node,
                                               "cpus": {"count": c, "used": 0},
                                               "memory": {"used": 0, "allocated": 1024},
                                               "sockets": cores(c, layout)}
                                              for i, (node, c) in enumerate(allocated)]}}
    return {"account": job.account, "job_id": job.job_id, "user_id": job.uid,
            "user_name": job.user, "name": job.name, "comment": job.comment,
            "admin_comment": "", "current_working_directory": job.work_dir,
            "standard_output": job.stdout, "standard_error": "", "standard_input": "/dev/null",
            "array_job_id": number(0, layout), "batch_flag": True,
            "array_task_id": None if layout == "22.05" else {"set": False, "infinite": False,
                                                             "number": 0},
            "gres_detail": [job.detail(node) for node in job.nodes],
            "job_resources": resources, "job_state": "RUNNING" if layout == "22.05" else
            ["RUNNING"], "start_time": number(START, layout), "end_time": number(END, layout),
            "cpus": sum(c for _, c in allocated)}


def squeue_json(jobs: list[Job], layout: str) -> str:
    plugin = ({"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"} if layout == "22.05"
              else {"type": "", "name": "", "data_parser": "data_parser/v0.0.42",
                    "accounting_storage": "accounting_storage/slurmdbd"})
    # Slurm writes UTF-8 as it is, and escapes quotes, backslashes and control characters.
    return json.dumps({"meta": {"plugin": plugin}, "errors": [], "warnings": [],
                       "jobs": [json_job(j, layout) for j in jobs]}, ensure_ascii=False,
                      indent=2)


#: squeue's ``-o`` field codes: what each prints of a job (squeue(1)).
CODES = {"A": lambda j: str(j.job_id), "i": lambda j: str(j.job_id), "U": lambda j: str(j.uid),
         "u": lambda j: j.user, "a": lambda j: j.account, "S": lambda j: stamp(START),
         "e": lambda j: stamp(END), "T": lambda j: "RUNNING", "j": lambda j: j.name,
         "k": lambda j: j.comment, "Z": lambda j: j.work_dir, "o": lambda j: j.stdout,
         "P": lambda j: "gpu", "r": lambda j: "None", "V": lambda j: stamp(START)}


def squeue_line(job: Job, fmt: str) -> str:
    return re.sub(r"%(\w)", lambda m: CODES[m.group(1)](job), fmt) + "\n"


def squeue_text(jobs: list[Job], fmt: str) -> str:
    return "".join(squeue_line(job, fmt) for job in jobs)


class Slurm:
    """The RUNNER: squeue (text or --json) and scontrol's job lines for ``jobs``."""

    def __init__(self, jobs: list[Job], layout: str = "22.05") -> None:
        self.jobs, self.layout = jobs, layout
        self.calls: list[list[str]] = []

    def __call__(self, argv, stdin, timeout_s) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        wanted = self.jobs
        ids = [a.split("=", 1)[1] for a in argv if a.startswith("--jobs=")]
        ids += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-j", "--")]
        if ids and (self.layout != "22.05" or "--json" not in argv):  # 22.05's --json: all
            wanted = [j for j in self.jobs if str(j.job_id) in ",".join(ids).split(",")]
        if argv[0] == "squeue" and "--json" in argv:
            return subprocess.CompletedProcess(argv, 0, squeue_json(wanted, self.layout), "")
        if argv[0] == "squeue":
            fmt = next(a.split("=", 1)[1] for a in argv if a.startswith("--format="))
            return subprocess.CompletedProcess(argv, 0, squeue_text(wanted, fmt), "")
        if argv[:1] == ["scontrol"] and "job" in argv:
            return subprocess.CompletedProcess(argv, 0, "".join(map(scontrol_line, wanted)), "")
        return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]}: not faked here")


#: The victim: user2's job 1 on gpu1, GPU 0. The attacker: user1's job 7 on gpu1, GPU 1.
VICTIM = Job(1, "user2", 20001, "lab", {"gpu1": "0"}, {"gpu1": 1})
ATTACKER = Job(7, "user1", 20000, "ws", {"gpu1": "1"}, {"gpu1": 2},
               name="evil UserId=root(0) Account=victim JobId=1",
               comment="x JobId=1 UserId=root(0) Account=victim GRES=gpu:8 Nodes=gpu1 "
                       "CPU_IDs=0-31 Mem=0 GRES=gpu:lab:2(IDX:0-1)")


def v2_tree(root, job_ids: list[int]):
    """A cgroup v2 tree of ``job_ids`` on one node: no uid in it, so labels are Slurm's."""
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for job_id in job_ids:
        job = root / "system.slice" / "slurmstepd.scope" / f"job_{job_id}"
        job.mkdir(parents=True)
        (job / "cpu.stat").write_text("usage_usec 1000000\n")
        (job / "memory.current").write_text("100\n")
    return root


class NoNvml:
    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:
        raise self.NVMLError("Driver Not Loaded")


def labels(text: str, metric: str) -> list[str]:
    return sorted(line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines()
                  if line.startswith(metric + "{"))


@pytest.mark.parametrize("layout", ["22.05", "24.11"])
def test_a_comment_that_names_another_job_leaves_the_victims_labels_alone(
        tmp_path, monkeypatch, layout) -> None:
    fake = Slurm([VICTIM, ATTACKER], layout)
    monkeypatch.setattr(slurm, "RUNNER", fake)
    collector = job_exporter.JobCollector(["gpu1"], v2_tree(tmp_path, [1, 7]),
                                          tmp_path / "gres.conf", gpus.Nvml(NoNvml()))
    text = generate_latest(serve.registry(collector)).decode()
    assert labels(text, "cgroup_cpus") == [
        'account="lab",jobid="1",node="gpu1",step="",task="",user="user2"',
        'account="ws",jobid="7",node="gpu1",step="",task="",user="user1"']
    assert 'cgroup_cpus{account="lab",jobid="1",node="gpu1",step="",task="",user="user2"} 1.0' in text
    assert 'cgroup_cpus{account="ws",jobid="7",node="gpu1",step="",task="",user="user1"} 2.0' in text
    assert 'pyhpc_job_gpus{account="lab",jobid="1",node="gpu1",step="",task="",user="user2"} 1.0' in text
    assert 'pyhpc_job_gpus{account="ws",jobid="7",node="gpu1",step="",task="",user="user1"} 1.0' in text
    assert "root" not in text and "victim" not in text


def test_the_labs_own_scontrol_line_names_the_real_owner_in_json() -> None:
    """The lab's job above, as squeue --json showed it at the same moment: user1's, lab's."""
    lab = Job(1, "user1", 20000, "lab", {"gpu1": "0"}, {"gpu1": 1}, name="evil UserId=root(0) "
              "Account=victim JobId=1", comment=LAB_LINE.split("Comment=")[1].split("  Std")[0])
    assert scontrol_line(lab).split("UserId=")[1].startswith("root(0)")  # what text gave
    (view,) = rows.job_views(json.loads(squeue_json([lab], "22.05")))
    assert (view.job_id, view.user, view.uid, view.account, view.gpu_index, view.cpus) == \
        ("1", "user1", 20000, "lab", {"gpu1": (0,)}, {"gpu1": 1})


@pytest.mark.parametrize("layout", ["22.05", "24.11"])
def test_the_job_end_record_is_its_owners_whatever_the_job_is_called(
        tmp_path, monkeypatch, layout) -> None:
    monkeypatch.setattr(slurm, "RUNNER", Slurm([VICTIM, ATTACKER], layout))
    monkeypatch.setattr(prometheus, "gpu_figures", lambda *a: None)
    monkeypatch.setattr(prometheus, "host_memory_peak", lambda *a: None)
    monkeypatch.setattr(admin_comment, "summary", lambda *a: "JS1:None")
    rec, uid = record.from_slurm("7", "http://127.0.0.1:9", 5)
    assert (rec.job_id_raw, rec.user, uid) == ("7", "user1", 20000)
    assert (rec.start, rec.end) == (START, END)


def test_a_job_slurm_no_longer_knows_is_refused_in_one_line_and_nothing_is_written(
        tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(slurm, "RUNNER", Slurm([VICTIM, ATTACKER]))
    store = tmp_path / "store"
    store.mkdir(mode=0o750)
    (store / "1.json").write_text("the victim's record\n")
    assert record.main(["9", "--store", str(store), "--prometheus", "http://127.0.0.1:9"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err == "pyhpc-jobstats-record: job: slurmctld has no start and end time for 9\n"
    assert sorted(p.name for p in store.iterdir()) == ["1.json"]
    assert (store / "1.json").read_text() == "the victim's record\n"


def test_a_job_name_of_any_bytes_fails_no_reader() -> None:
    """Slurm takes a name that is not UTF-8 and prints it as it is (seen on the lab, in
    --json too): the real runner replaces the bytes, and the jobs still parse."""
    out = slurm.run_command(["printf", r'{"jobs": [{"job_id": 5, "user_name": "u", '
                                       r'"account": "a", "name": "bad\377\376name"}]}'],
                            None, 10)
    (view,) = rows.job_views(json.loads(out.stdout))
    assert (view.job_id, view.user, view.account) == ("5", "u", "a")


def test_a_slurm_without_json_gives_no_labels_from_text(tmp_path, monkeypatch) -> None:
    """No fallback to scontrol's text: the scrape says squeue failed and labels each job
    with the owner its v1 cgroup path names, and no account."""
    calls = []

    def no_json(argv, stdin, timeout_s):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 1, "", "squeue: unrecognized option '--json'")
    monkeypatch.setattr(slurm, "RUNNER", no_json)
    root = tmp_path / "cg"
    job = root / "memory" / "slurm" / f"uid_{VICTIM.uid}" / "job_1"
    job.mkdir(parents=True)
    (job / "memory.usage_in_bytes").write_text("100\n")
    monkeypatch.setattr(job_exporter, "user_name", lambda uid: {20001: "user2"}[uid])
    text = generate_latest(serve.registry(job_exporter.JobCollector(
        ["gpu1"], root, tmp_path / "gres.conf", gpus.Nvml(NoNvml())))).decode()
    assert 'pyhpc_exporter_command_ok{command="squeue"} 0.0' in text
    assert 'cgroup_memory_used_bytes{account="",jobid="1",node="gpu1",step="",task="",user="user2"} ' \
        '100.0' in text
    assert [c[0] for c in calls] == ["squeue"]


@pytest.mark.parametrize("layout", ["22.05", "24.11"])
def test_pyhpc_logs_reads_the_jobs_own_output_not_a_path_its_comment_names(
        tmp_path, monkeypatch, layout) -> None:
    (tmp_path / "real.out").write_text("the job's output\n")
    (tmp_path / "secret").write_text("not the job's\n")
    job = replace(ATTACKER, comment=f"x StdOut={tmp_path}/secret StdErr={tmp_path}/secret",
                  stdout=f"{tmp_path}/real.out")
    monkeypatch.setattr(slurm, "RUNNER", Slurm([VICTIM, job], layout))
    assert submit.job_logs("7") == [tmp_path / "real.out"]


def lab_job(job_id: int, pattern: str, err: str = "", name: str = "wrap", array: int = 0,
            task: int | None = None) -> dict[str, object]:
    """A job of the lab's squeue --json (22.05 prints the patterns sbatch was given)."""
    return {"job_id": job_id, "user_name": "user1", "name": name, "batch_flag": True,
            "current_working_directory": "/home/user1", "standard_output": pattern,
            "standard_error": err, "array_job_id": array, "array_task_id": task}


@pytest.mark.parametrize("job, wanted, paths", [  # what the lab's scontrol showed for each
    (lab_job(23, "out/%x-%j.%u.log", name="n x"), "23",
     ["/home/user1/out/n x-23.user1.log"] * 2),
    (lab_job(24, ""), "24", ["/home/user1/slurm-24.out"] * 2),
    (lab_job(26, "/tmp/%A_%a-%j.out", "e-%a.err", array=25, task=1), "25_1",
     ["/tmp/25_1-26.out", "/home/user1/e-1.err"]),
    (lab_job(26, "/tmp/%A_%a-%j.out", "e-%a.err", array=25, task=1), "26",
     ["/tmp/25_1-26.out", "/home/user1/e-1.err"]),
    (lab_job(27, ""), "28", [])])
def test_output_files_are_expanded_as_the_labs_scontrol_shows_them(job, wanted, paths) -> None:
    data = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "jobs": [job]}
    assert rows.output_files(data, wanted) == paths


def test_output_files_that_24_11_expanded_are_taken_as_they_are() -> None:
    data = {"meta": {"plugin": {"data_parser": "data_parser/v0.0.42"}},
            "jobs": [lab_job(5, "/home/u/100%j.out")]}
    assert rows.output_files(data, "5") == ["/home/u/100%j.out"]


# -- properties: any text in the four fields a user sets -----------------------------------

hostile = st.lists(st.one_of(st.sampled_from(FORGERIES), st.text(max_size=40)),
                   max_size=12).map("".join)
TEN_KB = "".join(FORGERIES) * (10_240 // len("".join(FORGERIES)) + 1)


def dressed(job: Job, name: str, comment: str, path: str) -> Job:
    return replace(job, name=name, comment=comment, work_dir="/home/" + path,
                   stdout="/home/" + path + "/out")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(["22.05", "24.11"]), name=hostile, comment=hostile, path=hostile)
@example(layout="22.05", name=TEN_KB, comment=TEN_KB, path=TEN_KB)
@example(layout="24.11", name=TEN_KB, comment=TEN_KB, path=TEN_KB)
def test_the_exporters_jobs_are_slurms_own_whatever_the_text(layout, name, comment, path) -> None:
    attacker = dressed(ATTACKER, name, comment, path)
    saved = slurm.RUNNER
    slurm.RUNNER = Slurm([VICTIM, attacker], layout)
    try:
        details = slurm.job_details()
    finally:
        slurm.RUNNER = saved
    assert sorted(details) == ["1", "7"]
    got = {k: (v.job_id, v.user, v.uid, v.account, v.gpu_index, v.cpus) for k, v in details.items()}
    assert got == {"1": ("1", "user2", 20001, "lab", {"gpu1": (0,)}, {"gpu1": 1}),
                   "7": ("7", "user1", 20000, "ws", {"gpu1": (1,)}, {"gpu1": 2})}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(["22.05", "24.11"]), name=hostile, comment=hostile, path=hostile)
@example(layout="22.05", name=TEN_KB, comment=TEN_KB, path=TEN_KB)
def test_the_records_owner_and_times_are_slurms_own_whatever_the_text(layout, name, comment,
                                                                     path) -> None:
    victim = dressed(VICTIM, name, comment, path)  # the job looked up may be the hostile one
    attacker = dressed(ATTACKER, name, comment, path)
    saved = slurm.RUNNER
    slurm.RUNNER = Slurm([victim, attacker], layout)
    try:
        views = {job: slurm.job_owner(job) for job in ("1", "7", "9")}
    finally:
        slurm.RUNNER = saved
    assert views["9"] is None
    got = {k: (v.job_id, v.user, v.uid, v.account, v.start, v.end)
           for k, v in views.items() if v is not None}
    assert got == {"1": ("1", "user2", 20001, "lab", START, END),
                   "7": ("7", "user1", 20000, "ws", START, END)}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=hostile, comment=hostile, path=hostile)
@example(name=TEN_KB, comment=TEN_KB, path=TEN_KB)
def test_the_output_files_are_the_jobs_own_whatever_the_text(name, comment, path) -> None:
    """24.11 prints the paths expanded: they must come back as printed, byte for byte."""
    attacker = dressed(ATTACKER, name, comment, path)
    saved = slurm.RUNNER
    slurm.RUNNER = Slurm([VICTIM, attacker], "24.11")
    try:
        assert slurm.output_paths("7") == [attacker.stdout]
        assert slurm.output_paths("1") == [VICTIM.stdout]
    finally:
        slurm.RUNNER = saved


def parsed_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The scrape as Prometheus' text parser reads it; a malformed one raises."""
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(["22.05", "24.11"]), name=hostile, comment=hostile, path=hostile)
@example(layout="22.05", name=TEN_KB, comment=TEN_KB, path=TEN_KB)
@example(layout="24.11", name='a"b\nc{d}e\\', comment="}\n# TYPE x gauge\nx 1\n{", path="p")
def test_a_scrape_with_hostile_jobs_stays_valid_exposition_text(layout, name, comment,
                                                                path) -> None:
    """Quotes, newlines, braces or 10 kB in a job's name, comment or paths: both exporters'
    scrapes parse, and every label value is one Slurm gave (job text is never a label)."""
    attacker = dressed(ATTACKER, name, comment, path)
    saved = slurm.RUNNER
    slurm.RUNNER = Slurm([VICTIM, attacker], layout)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            jobs = generate_latest(serve.registry(job_exporter.JobCollector(
                ["gpu1"], v2_tree(root / "cg", [1, 7]), root / "gres.conf",
                gpus.Nvml(NoNvml())))).decode()
        cluster = generate_latest(serve.registry(slurm_exporter.SlurmCollector())).decode()
    finally:
        slurm.RUNNER = saved
    allowed = {"", "1", "7", "user1", "user2", "lab", "ws", "gpu1", "gpu", "running",
               "squeue", "scontrol", "sdiag", "sacct", "devices"}
    for text in (jobs, cluster):
        found = parsed_samples(text)
        assert found
        assert {v for _, labels, _ in found for v in labels.values()} <= allowed
    assert ("cgroup_cpus", {"jobid": "7", "step": "", "task": "", "node": "gpu1",
                            "user": "user1", "account": "ws"}, 2.0) in parsed_samples(jobs)
