"""Only what is yours (issue 22), on the lab's real slurmctld, slurmdbd and slapd.

Real objects an admin made by hand carry the names workshops would take: a QOS, a
directory group, a researcher (a directory user with an association and a job), a
reservation. Workshops refuse them in one line and change nothing; their delete leaves
them alone. Two participants and a researcher then try, as users, what a hostile
participant would: read others' accounting, leave the reservation, exceed each per-user
limit. A participant of a re-created workshop gets a uid never given before and sees
none of the predecessor's jobs or files.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_directory import LAB, as_user, held_job, lab_directory, sh, workshop

from pyhpc.admin import directory, owner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

QOS, GROUP, RESEARCHER, RESERVATION = "itqos", "itgroup", "itres-01", "itresv"
#: A directory user (no Slurm association) with the name workshop itdir's second participant
#: would get.
DIRECTORY_USER = "itdir-02"
CPU_WS, GPU_WS = "itws", "itgpu"


def refused(*args: str) -> str:
    """``pyhpc workshop ARGS`` as the admin, expected to fail: its one line."""
    proc = workshop(*args, check=False)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyhpc: error: "), proc.stderr
    return lines[0]


def slurm_objects() -> dict[str, str]:
    """Every QOS, account, association and reservation, as the admin sees them."""
    return {"qos": sh("sacctmgr", "-n", "-P", "show", "qos",
                      "format=name,description,flags,maxjobspu").stdout,
            "accounts": sh("sacctmgr", "-n", "-P", "show", "account",
                           "format=account,organization,description").stdout,
            "assocs": sh("sacctmgr", "-n", "-P", "show", "assoc",
                         "format=cluster,account,user,qos,maxjobs").stdout,
            "reservations": sh("scontrol", "show", "reservation", "-o").stdout}


def submit(user: str, options: str, command: str = "sleep 120") -> tuple[int, str]:
    """sbatch as ``user``: (exit status, job id or sbatch's error)."""
    proc = as_user(user, f"sbatch --parsable --time=3 {options} --output=/dev/null "
                         f"--wrap '{command}'", check=False)
    return proc.returncode, (proc.stdout.strip() if proc.returncode == 0 else proc.stderr.strip())


def reason(job: str, wait_s: float = 40) -> str:
    """The job's state and reason once the scheduler has decided: RUNNING, or PENDING for a
    reason other than not having been looked at yet."""
    deadline = time.monotonic() + wait_s
    while True:
        state = sh("squeue", "-h", "-j", job, "-o", "%T %r").stdout.strip()
        undecided = state.startswith("PENDING") and state.endswith(("None", "Priority",
                                                                    "Resources"))
        if not undecided or time.monotonic() > deadline:
            return state
        time.sleep(2)


def scenario(user: str, jobs: list[str]) -> list[str]:
    """Submit ``jobs`` (sbatch options) as ``user`` in order; their states once scheduled.
    Every job is cancelled before returning."""
    ids: list[str] = []
    try:
        for options in jobs:
            code, job = submit(user, options)
            assert code == 0, (options, job)
            ids.append(job)
            reason(job, 15)
        return [reason(j) for j in ids]
    finally:
        if ids:
            sh("scancel", *ids, check=False)
            while sh("squeue", "-h", "-j", ",".join(ids)).stdout.strip():
                time.sleep(1)


@pytest.fixture(scope="module")
def foreign() -> Iterator[dict[str, str]]:
    """An admin's own QOS, group, researcher (directory entry, association, held job) and
    reservation, with the names workshops would take; removed afterwards."""
    d = lab_directory()
    tag = "the admins own"
    sh("sacctmgr", "-i", "add", "qos", f"name={QOS}", "description=the admins own qos")
    directory.add(d, directory.group_ldif(d, GROUP, 40090, [], tag)
                  + directory.group_ldif(d, "itres", 40091, [RESEARCHER], tag)
                  + directory.user_ldif(d, RESEARCHER, 40091, 40091, tag)
                  + directory.user_ldif(d, DIRECTORY_USER, 40092, 40090, tag))
    sh("sacctmgr", "-i", "add", "user", f"name={RESEARCHER}", "account=lab",
       f"cluster={LAB.name}")
    sh("scontrol", "create", "reservation", f"ReservationName={RESERVATION}", "StartTime=now",
       "Duration=60", "NodeCnt=1", "PartitionName=cpu", "Users=user1")
    job = held_job(RESEARCHER)
    try:
        yield {"job": job}
    finally:
        sh("scancel", job, check=False)
        while sh("squeue", "-h", "-j", job, check=False).stdout.strip():
            time.sleep(1)
        sh("scontrol", "delete", f"ReservationName={RESERVATION}", check=False)
        sh("sacctmgr", "-i", "delete", "user", f"name={RESEARCHER}", "account=lab",
           f"cluster={LAB.name}", check=False)
        directory.delete(d, [directory.user_dn(d, RESEARCHER), directory.user_dn(d, DIRECTORY_USER),
                             directory.group_dn(d, GROUP), directory.group_dn(d, "itres")])
        sh("sacctmgr", "-i", "delete", "qos", f"name={QOS}", check=False)
        sh("rm", "-rf", f"/home/{RESEARCHER}")


def test_the_definitions_accounts_carry_pyhpcs_marker() -> None:
    rows = sh("sacctmgr", "-n", "-P", "show", "account", "format=account,organization,description")
    marked = {line for line in rows.stdout.splitlines()
              if line.endswith(f"|{owner.ORGANIZATION}|{owner.DEFINITION}")}
    assert marked == {f"{a.name}|{owner.ORGANIZATION}|{owner.DEFINITION}" for a in LAB.accounts}


@pytest.mark.parametrize(("name", "message"), [
    (QOS, f"name: Slurm QOS '{QOS}' exists and is not this one's (marked 'the admins own qos'"),
    ("normal", "name: Slurm QOS 'normal' exists and is not this one's"),
    (GROUP, f"name: directory group '{GROUP}' exists and is not this one's (marked 'the admins own'"),
    ("itres", "name: Slurm user 'itres-01' exists and is not this one's (no pyhpc marker"),
    (RESERVATION, f"name: reservation '{RESERVATION}' exists and is not this one's (no pyhpc "
                  "marker"),
    ("lab", "name: Slurm account 'lab' exists and is not this one's (marked 'pyhpc: cluster.yml'"),
    ("root", "name: 'root' is a word Slurm reserves in account names"),
])
def test_create_refuses_a_name_the_admins_own_objects_have_and_changes_nothing(
        foreign: dict[str, str], name: str, message: str, tmp_path: Path) -> None:
    before = slurm_objects()
    entries = (sorted(directory.users(lab_directory())), sorted(directory.groups(lab_directory())))
    line = refused("create", name, "--participants", "1", "--start", "now", "--hours", "1",
                   "--out", str(tmp_path / "sheet"))
    assert message in line, line
    assert "reserves" in message or line.endswith("nothing was changed"), line
    assert slurm_objects() == before
    assert (sorted(directory.users(lab_directory())),
            sorted(directory.groups(lab_directory()))) == entries
    assert not (tmp_path / "sheet").exists()


def test_a_participant_name_a_researcher_or_directory_user_has_is_refused(
        foreign: dict[str, str]) -> None:
    """Workshop itres would make participant itres-01, a researcher's name (directory entry,
    association, a queued job); workshop itdir would make itdir-02, a directory user's."""
    d = lab_directory()
    assocs = sh("sacctmgr", "-n", "-P", "show", "assoc", f"user={RESEARCHER}",
                "format=account,user").stdout
    line = refused("create", "itres", "--participants", "2", "--start", "now", "--hours", "1")
    assert f"name: Slurm user '{RESEARCHER}' exists and is not this one's" in line
    line = refused("create", "itdir", "--participants", "2", "--start", "now", "--hours", "1")
    assert f"name: directory user '{DIRECTORY_USER}' exists and is not this one's" in line
    assert sh("sacctmgr", "-n", "-P", "show", "assoc", f"user={RESEARCHER}",
              "format=account,user").stdout == assocs
    assert sh("squeue", "-h", "-j", foreign["job"], "-o", "%T").stdout.strip() == "PENDING"
    assert not {"itres-02", "itdir-01"} & set(directory.users(d))
    assert "itdir" not in directory.groups(d)
    for name in ("itres", "itdir"):
        assert not sh("sacctmgr", "-n", "-P", "show", "qos", f"name={name}", "format=name").stdout.strip()


@pytest.mark.parametrize("name", ["normal", QOS, RESERVATION, GROUP])
def test_delete_of_a_name_only_foreign_objects_have_deletes_nothing(
        foreign: dict[str, str], name: str) -> None:
    before = slurm_objects()
    groups = sorted(directory.groups(lab_directory()))
    proc = workshop("delete", name, "--json")
    done = json.loads(proc.stdout)
    assert done["changed"] is False and done["jobs_cancelled"] == []
    assert slurm_objects() == before and sorted(directory.groups(lab_directory())) == groups
    assert sh("squeue", "-h", "-j", foreign["job"], "-o", "%T").stdout.strip() == "PENDING"


def test_delete_of_the_definitions_account_is_refused(foreign: dict[str, str]) -> None:
    before = slurm_objects()
    line = refused("delete", "lab")
    assert "name: Slurm account 'lab' exists and is not this one's" in line
    assert slurm_objects() == before


def test_a_definition_accounts_per_user_limits_hold() -> None:
    """The lab's account teaching (limits: 2 jobs, 3 queued, 1 node, 1 GPU per user):
    user2 tries to exceed each with -A teaching; the deploy set them on the association.
    Slurm counts a user's nodes as the distinct nodes of their running jobs, so the jobs
    name their nodes."""
    rows = sh("sacctmgr", "-n", "-P", "show", "assoc", "account=teaching", "user=user2",
              "format=user,maxjobs,maxsubmit,grptres").stdout.split()
    assert rows == ["user2|2|3|gres/gpu=1,node=1"]
    on = "--account=teaching --partition=gpu --nodelist="  # gpu1, gpu2: 2 CPUs, 2 GPUs each
    states = scenario("user2", [f"{on}gpu1 --gres=gpu:1"] * 2)
    assert states == ["RUNNING None", "PENDING AssocGrpGRES"], states
    states = scenario("user2", [f"{on}gpu1"] * 3)
    assert states[1] == "RUNNING None" and states[2] == "PENDING AssocMaxJobsLimit", states
    states = scenario("user2", [f"{on}gpu1", f"{on}gpu2"])
    assert states == ["RUNNING None", "PENDING AssocGrpNodeLimit"], states
    held = [submit("user2", "--hold --account=teaching") for _ in range(4)]
    sh("scancel", *(j for c, j in held if c == 0), check=False)
    assert [c == 0 for c, _ in held] == [True, True, True, False], held
    assert "policy" in held[3][1].lower(), held[3]
    # Their own account lab has no limits: the same jobs all run there.
    states = scenario("user2", ["--partition=gpu --nodelist=gpu1 --gres=gpu:1"] * 2
                      + ["--partition=gpu --nodelist=gpu2"])
    assert all(s == "RUNNING None" for s in states), states


# -- two participants and a researcher ------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Workshop itws: 2 participants on one CPU node, 1 job at once, 2 queued."""
    workshop("delete", CPU_WS, "--homes", check=False)
    sh("rm", "-rf", f"/home/{CPU_WS}-01", f"/home/{CPU_WS}-02")  # an interrupted run's
    out = tmp_path_factory.mktemp("sheet") / CPU_WS
    workshop("create", CPU_WS, "--participants", "2", "--start", "now", "--hours", "1",
             "--nodes", "1", "--jobs-per-user", "1", "--submitted-per-user", "2",
             "--out", str(out))
    yield [f"{CPU_WS}-01", f"{CPU_WS}-02"]
    workshop("delete", CPU_WS, "--homes", check=False)


def test_participants_and_researchers_see_only_their_own_accounting(
        cpu_ws: list[str], foreign: dict[str, str]) -> None:
    first, second = cpu_ws
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 120))
    # Jobs that run (a held job has no eligible time: sacct's time window never shows it).
    jobs = [submit(u, f"--reservation={CPU_WS} --chdir=/tmp", "true")[1] for u in (first, second)]
    mine = submit("user1", "--chdir=/tmp", "true")[1]
    try:
        deadline = time.monotonic() + 60  # accounting lags slurmctld
        while True:
            everyone = sh("sacct", "-a", "-X", "-n", "-P", "-S", since, "-o", "jobid,user").stdout
            wanted = [f"{jobs[0]}|{first}", f"{jobs[1]}|{second}", f"{mine}|user1"]
            if all(w in everyone for w in wanted) or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert all(w in everyone for w in wanted), everyone  # root sees every user's
        seen = as_user(first, f"sacct -a -X -n -P -S {since} -o jobid,user,account,workdir,"
                              "submitline").stdout.splitlines()
        assert seen and {line.split("|")[1] for line in seen} == {first}, seen
        assocs = as_user(first, "sacctmgr -n -P show assoc format=account,user").stdout.split()
        assert assocs and {a.split("|")[1] for a in assocs} <= {first, ""}, assocs
        # Their own association and the accounts above it (root is the tree's root), no other.
        assert {a.split("|")[0] for a in assocs} == {CPU_WS, "root"}, assocs
        assert "lab|user1" in sh("sacctmgr", "-n", "-P", "show", "assoc",
                                 "format=account,user").stdout  # as root: everyone's
        researcher = as_user("user1", f"sacct -a -X -n -P -S {since} -o jobid,user").stdout
        assert first not in researcher and second not in researcher
        # sreport reads slurmdbd's hourly rollups: usage shows once an hour with it has ended,
        # and not while slurmdbd redoes them (after test_lost_jobs' --fix-runaway). Where
        # every job slurmdbd has started in the current hour (a fresh lab), no rollup has any:
        # it skips at once, not after 90 s.
        hour = time.strftime("%Y-%m-%dT%H:00:00")
        starts = sh("sacct", "-a", "-X", "-n", "-P", "-o", "Start", "-S", "2026-01-01",
                    "-E", "now").stdout.split()
        if min((s for s in starts if s[:1].isdigit()), default=hour) >= hour:
            pytest.skip(f"every job in slurmdbd started at {hour} or later: sreport reads hourly "
                        "rollups, and none has usage before that hour ends (a fresh lab)")
        deadline = time.monotonic() + 90
        while not (usage := sh("sreport", "-n", "-P", "user", "topusage", "start=2026-01-01",
                               "end=now").stdout) and time.monotonic() < deadline:
            time.sleep(5)
        if not usage:
            pytest.skip("sreport shows no usage for 90 s: slurmdbd's hourly rollups are not "
                        "there (being redone after runaway jobs were fixed)")
        # root sees others' usage (rows of users other than the participant).
        assert {r.split("|")[1] for r in usage.splitlines()} - {first}, usage
        # sreport: their own usage, and the cluster's total (the root account's row), no
        # other user's, no other account's.
        top = as_user(first, "sreport -n -P user topusage start=2026-01-01 end=now").stdout
        assert {r.split("|")[1] for r in top.splitlines()} <= {first}, top
        by_user = as_user(first, "sreport -n -P cluster AccountUtilizationByUser "
                                 "start=2026-01-01 end=now").stdout.splitlines()
        assert {r.split("|")[2] for r in by_user} <= {first, ""}, by_user
        assert {r.split("|")[1] for r in by_user} <= {"root", CPU_WS}, by_user
    finally:
        sh("scancel", *jobs, mine, check=False)


def test_a_participant_cannot_leave_the_reservation(cpu_ws: list[str],
                                                   foreign: dict[str, str]) -> None:
    first = cpu_ws[0]
    for options in ("--hold", "--hold --partition=gpu", f"--hold --reservation={RESERVATION}",
                    f"--hold --reservation={CPU_WS} --qos=normal",
                    f"--hold --reservation={CPU_WS} --account=lab"):
        code, why = submit(first, options)
        assert code != 0, (options, why)
    code, job = submit(first, f"--hold --reservation={CPU_WS}")
    sh("scancel", job)
    assert code == 0, job


def test_each_per_user_limit_of_a_workshop_holds(cpu_ws: list[str]) -> None:
    first, second = cpu_ws
    res = f"--reservation={CPU_WS}"
    running = submit(first, res)
    reason(running[1], 15)
    queued, over, other = submit(first, res), submit(first, res), submit(second, res)
    try:
        assert running[0] == queued[0] == other[0] == 0, (running, queued, other)
        assert over[0] != 0 and "policy" in over[1].lower(), over  # MaxSubmitJobsPerUser=2
        assert reason(queued[1]) == "PENDING QOSMaxJobsPerUserLimit"  # MaxJobsPerUser=1
        assert reason(running[1]).startswith("RUNNING")
        assert reason(other[1]).startswith("RUNNING")  # the other participant's own limit
        for options in ("-N 2", "--gres=gpu:1", "--time=120"):  # per job: 1 node, no GPU, 1 h
            code, why = submit(second, f"--hold {res} {options}")
            assert code != 0, (options, why)
    finally:
        sh("scancel", *(j for c, j in (running, queued, over, other) if c == 0), check=False)


def test_per_user_nodes_and_gpus_hold_across_jobs(tmp_path: Path) -> None:
    workshop("delete", GPU_WS, "--homes", check=False)
    workshop("create", GPU_WS, "--participants", "1", "--start", "now", "--hours", "1",
             "--partition", "gpu", "--nodes", "2", "--jobs-per-user", "4",
             "--nodes-per-user", "1", "--gpus-per-user", "1", "--out", str(tmp_path / "s"))
    user, res = f"{GPU_WS}-01", f"--reservation={GPU_WS} --partition=gpu"
    jobs: list[str] = []
    try:
        for alone in ("--gres=gpu:2", "-N 2"):  # one job alone past 1 GPU, 1 node a user
            code, why = submit(user, f"--hold {res} {alone}")
            assert code != 0 and "policy" in why.lower(), (alone, why)
        # A user's nodes are the distinct nodes of their running jobs: the jobs name theirs.
        for options in ("-w gpu1 --gres=gpu:1", "-w gpu1 --gres=gpu:1", "-w gpu2"):
            code, job = submit(user, f"{res} -N 1 {options}")
            assert code == 0, job
            jobs.append(job)
            reason(job, 15)
        states = [reason(j) for j in jobs]
        assert states == ["RUNNING None", "PENDING QOSMaxGRESPerUser",  # 2 GPUs > 1
                          "PENDING QOSMaxNodePerUserLimit"], states  # 2 nodes > 1
    finally:
        if jobs:
            sh("scancel", *jobs, check=False)
        workshop("delete", GPU_WS, "--homes", check=False)


def test_delete_cancels_only_the_workshops_jobs_and_leaves_the_researcher(
        cpu_ws: list[str], foreign: dict[str, str]) -> None:
    researcher_assocs = sh("sacctmgr", "-n", "-P", "show", "assoc", f"user={RESEARCHER}",
                           "format=account,user").stdout
    job = submit(cpu_ws[0], f"--hold --reservation={CPU_WS}")[1]
    mine = held_job("user1")
    try:
        done = json.loads(workshop("delete", CPU_WS, "--homes", "--json").stdout)
        assert done["jobs_cancelled"] == [job], done
        for kept in (mine, foreign["job"]):
            assert sh("squeue", "-h", "-j", kept, "-o", "%T").stdout.strip() == "PENDING"
        assert sh("sacctmgr", "-n", "-P", "show", "assoc", f"user={RESEARCHER}",
                  "format=account,user").stdout == researcher_assocs
        assert f"{QOS}|the admins own qos" in slurm_objects()["qos"]
    finally:
        sh("scancel", mine, check=False)


def test_a_recreated_participant_gets_a_new_uid_and_none_of_the_predecessors_jobs_or_files(
        tmp_path: Path) -> None:
    name = "itnew"
    user = f"{name}-01"
    workshop("delete", name, "--homes", check=False)
    sh("rm", "-rf", f"/home/{user}")  # an interrupted run's
    create = ["create", name, "--participants", "1", "--start", "now", "--hours", "1"]
    workshop(*create, "--out", str(tmp_path / "sheet"))
    left = Path(f"/tmp/{user}-was-here")
    try:
        before = int(sh("id", "-u", user).stdout)
        code, job = submit(user, f"--reservation={name}", f"touch {left}")
        assert code == 0, job
        while sh("squeue", "-h", "-j", job).stdout.strip():
            time.sleep(1)
        assert left.stat().st_uid == before
        workshop("delete", name)  # the home stays: a new participant of that name is refused
        line = refused(*create, "--out", str(tmp_path / "sheet2"))
        assert f"name: participant {user}'s home /home/{user} exists" in line
        assert not (tmp_path / "sheet2").exists()
        sh("rm", "-rf", f"/home/{user}")
        workshop(*create, "--out", str(tmp_path / "sheet3"))
        after = int(sh("id", "-u", user).stdout)
        assert after > before and left.stat().st_uid == before
        assert as_user(user, "sacct -X -n -o jobid -S 2026-01-01").stdout.split() == []
        assert as_user(user, f"find /tmp -maxdepth 1 -user {after}").stdout.split() == []
        assert as_user(user, f"touch {left}", check=False).returncode != 0  # not theirs
    finally:
        workshop("delete", name, "--homes", check=False)
        sh("rm", "-rf", str(left), f"/home/{user}")
