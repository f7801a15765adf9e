"""Slurm's refusals as one line each, and the reservation a submission runs in.

The refusals are Slurm 22.05.8's own output, as sbatch printed it on the lab (the lines of
``src/common/slurm_errno.c``; under ``DenyOnLimit`` the limit on a line before them).
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from pyhpc.cli import main as cli
from pyhpc.slurm import refusals, reservations
from pyhpc.slurm.refusals import Context
from pyhpc.slurm.reservations import Choice, Reservation, ReservationError

POLICY = ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
          "(job submit limit, user's size and/or time limits)")
FAILED = "sbatch: error: Batch job submission failed: "
#: What sbatch printed for each refusal, and the table's row for it.
SAID = [
    (f"{FAILED}Invalid qos specification", "reservation_required"),
    (f"{FAILED}Invalid account or account/partition combination specified", "no_association"),
    (f"sbatch: error: QOSMaxGRESPerUser\n{POLICY}", "gpus_per_user"),
    (f"sbatch: error: QOSMaxNodePerUserLimit\n{POLICY}", "nodes_per_user"),
    (f"sbatch: error: QOSMaxSubmitJobPerUserLimit\n{POLICY}", "jobs_per_user"),
    (f"sbatch: error: QOSMaxWallDurationPerJobLimit\n{POLICY}", "time_per_job"),
    (POLICY, "qos_limit"),
    (f"{FAILED}Requested time limit is invalid (missing or exceeds some limit)", "partition_time"),
    (f"{FAILED}Node count specification invalid", "partition_nodes"),
    (f"{FAILED}Requested reservation is invalid", "reservation_gone"),
    (f"{FAILED}Access denied to requested reservation", "reservation_denied"),
    (f"{FAILED}Requested reservation not usable now", "reservation_not_active"),
    (f"{FAILED}Requested node configuration is not available", "no_nodes"),
]
#: Reasons a job waits for where it can never start (squeue's %r).
REASONS = [("PartitionTimeLimit", "partition_time"), ("PartitionNodeLimit", "partition_nodes"),
           ("QOSMaxGRESPerUser", "gpus_per_user"), ("InvalidQOS", "reservation_required")]
CTX = Context("ws-01", "lab", "gpu", Choice(None, "gpu"))
WORKSHOP = ("ReservationName=ws StartTime=2026-12-03T09:00:00 EndTime=2026-12-03T10:00:00 "
            "Duration=01:00:00 Nodes=gpu1 NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=gpu "
            "Flags= TRES=cpu=2 Users=ws-01,ws-02 Groups=(null) Accounts=ws Licenses=(null) "
            "State={state} BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)")


@pytest.mark.parametrize(("said", "key"), SAID)
def test_each_refusal_slurm_prints_has_its_row(said: str, key: str) -> None:
    row = refusals.find(said)
    assert row is not None and row.key == key


@pytest.mark.parametrize(("said", "key"), SAID)
def test_each_refusal_is_one_line_with_slurms_words_once(said: str, key: str,
                                                         fake_slurm) -> None:
    fake_slurm.answers["sacctmgr"] = (0, "ws|gpu|ws-01\n")
    line = refusals.explain(said, CTX)
    assert "\n" not in line and "sbatch: error" not in line and "submission failed" not in line
    assert line.count(said.splitlines()[-1].split("failed: ")[-1]) == 1


def test_the_limit_sbatch_names_is_kept_in_slurms_words() -> None:
    assert refusals.slurm_words(f"sbatch: error: QOSMaxGRESPerUser\n{POLICY}") == (
        "QOSMaxGRESPerUser: Job violates accounting/QOS policy (job submit limit, user's size "
        "and/or time limits)")


def test_an_unknown_refusal_passes_through_once() -> None:
    said = f"{FAILED}Something new in Slurm 25.05"
    assert refusals.explain(said, CTX) == "sbatch refused the job: Something new in Slurm 25.05"


def test_reservation_required_says_when_the_users_reservation_starts() -> None:
    waiting = Reservation("ws", "gpu", ("ws-01",), ("ws",), "2026-12-03T09:00:00", "", "INACTIVE")
    line = refusals.explain(f"{FAILED}Invalid qos specification",
                            Context("ws-01", "lab", "gpu", Choice(None, "gpu", (waiting,))))
    assert line.startswith("reservation: your account's QOS runs jobs only in a reservation, "
                           "and yours, ws, starts at 2026-12-03T09:00:00 (")
    assert line.endswith("; submit then (Slurm: Invalid qos specification)")


def test_reservation_required_without_one_says_what_to_do() -> None:
    line = refusals.explain(f"{FAILED}Invalid qos specification", CTX)
    assert "none that admits you is active now" in line and "--reservation NAME" in line


def test_a_user_without_any_association_gets_the_admins_line(fake_slurm) -> None:
    line = refusals.explain(f"{FAILED}Invalid account or account/partition combination "
                            "specified", CTX)
    assert line == ("user ws-01 has no account on cluster lab; an admin adds it to accounts "
                    "in cluster.yml")


def test_an_account_of_another_partition_names_the_partition(fake_slurm) -> None:
    fake_slurm.answers["sacctmgr"] = (0, "ws|cpu|ws-01\n")
    line = refusals.explain(f"{FAILED}Invalid account or account/partition combination "
                            "specified", CTX)
    assert line.startswith("account: your accounts on cluster lab are ws (partition cpu); "
                           "the job names another account, or a partition none of them "
                           "admits; add --partition cpu")


@pytest.mark.parametrize(("reason", "key"), REASONS)
def test_a_job_that_can_never_start_gets_the_tables_line(reason: str, key: str) -> None:
    row = refusals.find(reason)
    assert row is not None and row.key == key
    line = refusals.pending(reason, "cpu")
    if key == "reservation_required":  # it needs the submission's context: the watch's own
        assert line is None
    else:
        assert line is not None and "{" not in line and line.split(":")[0] in row.line


def test_a_waiting_job_without_its_partition_names_none() -> None:
    assert refusals.pending("PartitionTimeLimit") == (
        "time: longer than the job's partition allows (sinfo shows its limit); ask for less "
        "(--time)")
    assert refusals.pending("PartitionNodeLimit", "gpu") == (
        "nodes: more than partition gpu gives one job (sinfo -p gpu shows its nodes); ask for "
        "fewer (--nodes)")


# -- the reservation a submission runs in ---------------------------------------------------

NOW = datetime(2026, 12, 3, 9, 30)


def listing(fake_slurm, *lines: str) -> None:
    fake_slurm.answers["scontrol"] = (0, "".join(f"{line}\n" for line in lines))


def test_a_participants_one_active_reservation_is_chosen(fake_slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="ACTIVE"))
    assert reservations.resolve(None, "gpu", "ws-01", now=NOW).name == "ws"
    assert fake_slurm.calls == [["scontrol", "show", "reservation", "-o"]]


def test_another_users_job_runs_in_no_reservation(fake_slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="ACTIVE"))
    assert reservations.resolve(None, "gpu", "user1", now=NOW) == Choice(None, "gpu")


def test_several_active_reservations_are_named_and_none_is_chosen(fake_slurm,
                                                                   monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="ACTIVE"),
            WORKSHOP.format(state="ACTIVE").replace("=ws ", "=ws2 "))
    with pytest.raises(ReservationError, match=r"^reservation: you may run in 2 active "
                       r"reservations \(ws, ws2\); choose one with --reservation NAME$"):
        reservations.resolve(None, "gpu", "ws-01", now=NOW)


def test_a_reservation_by_account_asks_for_the_users_accounts(fake_slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="ACTIVE").replace("Users=ws-01,ws-02",
                                                                "Users=(null)"))
    fake_slurm.answers["sacctmgr"] = (0, "ws||user9\n")
    assert reservations.resolve(None, "gpu", "user9", now=NOW).name == "ws"


def test_a_reservation_not_started_yet_is_not_chosen_but_kept_for_the_refusal(
        fake_slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="INACTIVE"))
    choice = reservations.resolve(None, "gpu", "ws-01", now=NOW)
    assert choice.name is None and [r.name for r in choice.waiting] == ["ws"]


def test_a_named_reservation_outside_its_window_is_one_line(fake_slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="INACTIVE"))
    with pytest.raises(ReservationError, match=r"^reservation: reservation ws starts at "
                       r"2026-12-03T09:00:00 \(in 1 h 30 min\); submit then$"):
        reservations.resolve("ws", "gpu", "ws-01", now=datetime(2026, 12, 3, 7, 30))
    with pytest.raises(ReservationError, match=r"^reservation: reservation ws is not active "
                       r"\(it ended at 2026-12-03T10:00:00 \(5 min ago\)\)$"):
        reservations.resolve("ws", "gpu", "ws-01", now=datetime(2026, 12, 3, 10, 5))


def test_a_named_reservation_slurm_does_not_have_is_one_line(fake_slurm, monkeypatch) -> None:
    monkeypatch.setenv("SBATCH_RESERVATION", "gone")
    listing(fake_slurm, WORKSHOP.format(state="ACTIVE"))
    with pytest.raises(ReservationError, match=r"^SBATCH_RESERVATION: Slurm has no "
                       r"reservation gone now: it has ended, or was never made \(those you "
                       r"may use: ws\)$"):
        reservations.resolve(None, "gpu", "ws-01", now=NOW)


def test_a_named_reservation_of_another_partition_names_it(fake_slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    listing(fake_slurm, WORKSHOP.format(state="ACTIVE"))
    with pytest.raises(ReservationError, match=r"add --partition gpu$"):
        reservations.resolve("ws", "cpu", "ws-01", now=NOW)


def test_a_bad_reservation_name_is_refused_before_slurm_is_asked(fake_slurm) -> None:
    with pytest.raises(ReservationError, match=r"^reservation: "):
        reservations.resolve("ws;rm", "gpu", "ws-01")
    assert fake_slurm.calls == []


def test_the_scripts_own_reservation_and_partition_lines_are_read() -> None:
    text = ("#!/bin/bash\n#SBATCH --reservation=ws\n#SBATCH -p gpu\n\necho hi\n"
            "#SBATCH --reservation=late\n")
    assert reservations.script_options(text) == {"reservation": "ws", "partition": "gpu"}


# -- through the CLI: the flag, the one line and exit 2 ----------------------------------

def test_train_submits_in_the_participants_reservation(slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    slurm.fake.answers["scontrol"] = (0, WORKSHOP.format(state="ACTIVE").replace(
        "PartitionName=gpu", "PartitionName=cpu").replace("ws-01", "root") + "\n")
    assert cli.main(["train", "--epochs", "1", "--out", "run"]) == 0
    script = next(Path("pyhpc-jobs").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --reservation=ws" in script


def test_submit_passes_reservation_to_sbatch_not_to_the_template(slurm, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    slurm.fake.answers["scontrol"] = (0, WORKSHOP.format(state="ACTIVE").replace(
        "PartitionName=gpu", "PartitionName=cpu") + "\n")
    assert cli.main(["submit", "single", "--set", "command=true", "--reservation", "ws"]) == 0
    assert slurm.calls[-1][:3] == ["sbatch", "--parsable", "--reservation=ws"]


def test_a_refusal_reaches_the_user_once_with_exit_2(slurm, capsys, monkeypatch) -> None:
    monkeypatch.delenv("SBATCH_RESERVATION", raising=False)
    slurm.fake.answers["sbatch"] = (1, "", f"sbatch: error: QOSMaxGRESPerUser\n{POLICY}\n")
    assert cli.main(["submit", "single", "--set", "command=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pyhpc: error: gpus_per_node: your jobs "
                                                    "together would hold more GPUs")
    assert err.count("QOSMaxGRESPerUser") == 1 and "sbatch: error" not in err
