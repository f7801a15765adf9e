"""The job commands of the ``pyhpc`` CLI: render, submit, status, logs, cancel, resubmit,
train, scale, report, bench. Each command parses its arguments and makes one call into
the domain modules; torch is imported only by ``train``, ``scale`` and ``bench``, inside
them.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from pyhpc import cluster, files, paths, validate
from pyhpc.bench import config as bench
from pyhpc.bench import results as bench_results
from pyhpc.bench import submit as bench_submit
from pyhpc.cli import monitor as cli_monitor
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError
from pyhpc.slurm import jobspec, lost, records, render, resubmit, slurm, watch
from pyhpc.slurm import submit as _submit
from pyhpc.slurm.jobspec import JobSpecError
from pyhpc.train import config as trainconfig
from pyhpc.train import metrics, report, sweep

#: Flags that set job spec fields: the job spec's names and help, one flag per field.
RESOURCE_FLAGS = tuple(f.name for f in fields(jobspec.JobSpec))
#: A training run or a benchmark is one job, never an array of them.
ONE_JOB = tuple(f for f in RESOURCE_FLAGS if f != "array")


def _emit(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


def _cluster() -> Cluster:
    return cluster.load(paths.cluster_file())


#: The largest value in each comma-separated list option: the limits of the one value each
#: stands for (a job's nodes, a pipeline's stages, a worker's batch).
LIST_MAX = {"nodes": cluster.MAX_NODES, "pipeline": trainconfig.MAX_STAGES,
            "batch_sizes": trainconfig.MAX_BATCH_SIZE}


def _int_list(name: str, text: str) -> list[int]:
    items = [v for v in text.split(",") if v.strip()]
    if not items or len(items) > 64:
        raise JobSpecError(f"{name}: expected 1 to 64 comma-separated integers, got {text!r}")
    return [validate.integer(name, v, 1, LIST_MAX[name], error=JobSpecError) for v in items]


def _timeout(text: str) -> float:
    """--timeout, checked while parsing: a bad value stops the command before it submits."""
    try:
        return watch.timeout(text)
    except watch.WatchError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None


def _wait(job_id: str, args: argparse.Namespace) -> str:
    """Watch a job pyhpc has just submitted (so it was accepted by now)."""
    return watch.watch([job_id], interval_s=1.0, timeout_s=args.timeout, fail_on_timeout=True,
                       submitted={job_id: int(time.time())})[job_id]


def cmd_render(args: argparse.Namespace) -> int:
    if args.list:
        env = render.environment(_cluster())
        data = {t: sorted(render.variables(env, t + render.SUFFIX)) for t in render.available()}
        _emit(data, args.json, "\n".join(f"{t}: {', '.join(v)}" for t, v in data.items()))
        return 0
    if not args.template:
        raise PyhpcError("template: required (or --list)")
    sys.stdout.write(render.render(args.template, render.parse_sets(args.set), _cluster()))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    given = {k: getattr(args, k) for k in RESOURCE_FLAGS if getattr(args, k) is not None}
    result = _submit.submit_target(args.target, args.args, render.parse_sets(args.set), given,
                                   args.test_only, args.folder, _cluster())
    if result.get("note"):
        print(f"pyhpc: note: job {result['job_id']}: {result['note']}", file=sys.stderr)
    if args.wait and "job_id" in result:
        result["state"] = _wait(result["job_id"], args)
    _emit(result, args.json, result.get("job_id") or result.get("test_only", ""))
    return 0 if result.get("state", "COMPLETED") == "COMPLETED" else 1


def cmd_status(args: argparse.Namespace) -> int:
    """The states, then for a LOST job one line on stderr and exit status 1."""
    ids = watch.job_ids(args.job_ids) if args.job_ids else slurm.my_job_ids()
    # Jobs pyhpc submitted from here: a job the controller lost with its accounting record
    # is still known to have been accepted (LOST, not UNKNOWN).
    noted = records.noted(_submit.DEFAULT_FOLDER, ids)
    failure: lost.LostError | None = None
    try:
        if args.watch:
            states = watch.watch(ids, interval_s=watch.interval(args.interval),
                                 source=args.source or "squeue", submitted=noted)
        else:
            states, failure = watch.inspect(ids, source=args.source or "sacct", submitted=noted)
    except lost.LostError as exc:
        states, failure = exc.states, exc
    _emit(states, args.json, "\n".join(f"{j}\t{s}" for j, s in states.items()))
    if failure is not None:
        print(f"pyhpc: error: {failure}", file=sys.stderr)
        return 1
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    logs = _submit.job_logs(watch.job_ids([args.job_id], "job_id")[0])
    for path in logs:
        if len(logs) > 1:
            print(f"==> {path} <==", flush=True)
        with files.open_regular(path, "job_id") as fh:  # a planted FIFO never hangs this
            shutil.copyfileobj(fh, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    ids = watch.job_ids(args.job_ids)
    slurm.cancel(ids)
    print(f"cancelled {' '.join(ids)}")
    return 0


def cmd_resubmit(args: argparse.Namespace) -> int:
    result = resubmit.resubmit(args.job_id, args.folder, args.force, _cluster(),
                               args.reservation)
    if result.get("note"):
        print(f"pyhpc: note: job {result['job_id']}: {result['note']}", file=sys.stderr)
    if args.wait:
        result["state"] = _wait(result["job_id"], args)
    _emit(result, args.json, result["job_id"])
    return 0 if result.get("state", "COMPLETED") == "COMPLETED" else 1


def _spec(args: argparse.Namespace, **values: Any) -> jobspec.JobSpec:
    """The job spec the flags ask for, unchecked: the domain checks it, once."""
    given = {k: getattr(args, k) for k in ONE_JOB if getattr(args, k, None) is not None}
    return jobspec.JobSpec(**{**given, **values})


def _config(args: argparse.Namespace, out: Path, **overrides: Any) -> trainconfig.TrainConfig:
    values = {f.name: getattr(args, f.name) for f in fields(trainconfig.TrainConfig)
              if hasattr(args, f.name)}
    return trainconfig.from_mapping({**values, "out": str(out.resolve()), **overrides})


def _results_or_fail(job_id: str, state: str, out: Path, summary: dict[str, Any]) -> None:
    """A run Slurm calls COMPLETED that trained nothing or left no results is a failure:
    one line, never a summary of files that are not there."""
    why = report.missing_results(out, summary) if state == "COMPLETED" else None
    if why:
        raise PyhpcError(f"{why}; see pyhpc logs {job_id}", "out")


def cmd_train(args: argparse.Namespace) -> int:
    out = Path(args.out or f"pyhpc-runs/train-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg = _config(args, out)
    if args.local:
        from pyhpc.train import loop as train

        ignored = [name for name in (*ONE_JOB, "wait", "timeout")
                   if getattr(args, name, None) not in (None, False)]
        if ignored:
            flag = "--" + ignored[0].replace("_", "-")
            raise PyhpcError(f"{flag}: --local runs here, one process, with no job to ask "
                             "Slurm for; drop it, or submit the run (without --local)",
                             ignored[0])
        if cfg.pipeline > 1:
            raise trainconfig.TrainError(f"pipeline: --local runs one process, and {cfg.pipeline} "
                                         "stages need one each; submit the run (without --local)",
                                         "pipeline")

        sweep.check_run(cfg, sweep.run_spec(jobspec.JobSpec(tasks_per_node=1), cfg, _cluster()),
                        local=True)
        summary = train.run(cfg)
        result: dict[str, Any] = {"out": str(out), "summary": summary.row() if summary else None}
    else:
        job = sweep.submit_run(cfg, _spec(args), args.folder, _cluster())
        result = {"job_id": str(job.job_id), "out": str(out)}
        if args.wait:
            result["state"] = _wait(result["job_id"], args)
            result["summary"] = report.run_summary(out)
            _results_or_fail(result["job_id"], result["state"], out, result["summary"])
    text = (f"job {result['job_id']} {result['state']}: {out}\n"
            f"{report.summary_text(result['summary'])}" if "state" in result else json.dumps(result))
    if result.get("state", "COMPLETED") != "COMPLETED":
        text += f"\n  job output     pyhpc logs {result['job_id']}"
        why = out_of_memory(result["job_id"], cfg, Path(args.folder.replace("%j", result["job_id"])))
        if why:
            result["why"] = why
            text += f"\n  {why}"
        elif not result["summary"]["epochs"]:
            # The usual first-run mistake on a real cluster: a directory only the login host has.
            text += (f"\n  no epoch reached {out}: it must be on storage the compute nodes "
                     "share (e.g. your home)")
    _emit(result, args.json, text)
    return 0 if result.get("state", "COMPLETED") == "COMPLETED" else 1


def out_of_memory(job_id: str, cfg: trainconfig.TrainConfig, log_dir: Path | None = None) -> str | None:
    """One line when Slurm's cgroup killed a task of the job for memory, with what to do:
    split the model over more pipeline stages (each holds a part), or ask for more.
    Accounting says so for a step on one node; for a step across nodes, whose killed task's
    peers then fail, srun's own line in the job's log (``log_dir``) does."""
    if "OUT_OF_MEMORY" in slurm.step_states(job_id).values():
        seen = "OUT_OF_MEMORY"
    else:
        tasks = _submit.oom_killed_tasks(log_dir) if log_dir is not None else []
        if not tasks:
            return None
        seen = f"srun: {', '.join(tasks)} Out Of Memory"
    split = (f"split the model with --pipeline {cfg.pipeline * 2} --model deep"
             if cfg.model == "deep" or cfg.pipeline > 1 else "use a smaller --batch-size")
    return (f"out of memory: Slurm's cgroup killed a task of job {job_id} for using more memory "
            f"than it holds ({seen}); {split}, or give each task more memory")


def cmd_scale(args: argparse.Namespace) -> int:
    out, the_cluster = Path(args.out), _cluster()
    stages = _int_list("pipeline", args.pipeline)
    points = sweep.plan(_config(args, out, pipeline=stages[0]), _int_list("nodes", args.nodes),
                        _int_list("batch_sizes", args.batch_sizes), args.scaling,
                        _spec(args, nodes=1), out, the_cluster, stages)
    jobs = sweep.run(points, args.folder, the_cluster, watch.interval(args.interval))
    if any(j["state"] != "COMPLETED" for j in jobs.values()):
        _emit({"jobs": jobs}, args.json, json.dumps({"jobs": jobs}, indent=2))
        return 1
    for job_id, job in jobs.items():
        run = Path(job["out"])
        _results_or_fail(job_id, job["state"], run, report.run_summary(run))
    _report([out], args.scaling, out / "scaling.png", args.json)
    return 0


def _report(dirs: list[Path], scaling: str, png: Path | None, as_json: bool,
            epochs_to_train: int | None = None) -> None:
    runs, written = report.write_report(dirs, scaling, png, epochs_to_train)
    data = {"png": str(written[0]), "runs": [r.row() for r in runs]}
    if epochs_to_train is not None:
        data["time_to_train_png"] = str(written[1])
    _emit(data, as_json, report.table(runs) + "".join(f"\nplot: {p}" for p in written))


def cmd_report(args: argparse.Namespace) -> int:
    if args.cluster or args.html or args.since is not None or args.prometheus:
        return cli_monitor.cmd_cluster_report(args)
    if not args.dirs:
        raise PyhpcError("report: name run or sweep directories, or --cluster --html DIR "
                         "for the cluster", "dirs")
    epochs = (None if args.time_to_train is None else
              validate.integer("time_to_train", args.time_to_train, 1, 100000, error=PyhpcError))
    _report([Path(d) for d in args.dirs], args.scaling, Path(args.png) if args.png else None,
            args.json, epochs)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    out = Path(args.out or f"pyhpc-runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg = bench.BenchConfig(out=str(out.resolve()), device="cuda" if args.gpus else "auto",
                            max_bytes=args.max_bytes, matmul_size=args.matmul_size,
                            tests=bench.tests_list(args.tests), threads=args.threads)
    result = bench_submit.run(cfg, _spec(args), args.folder, _cluster(), args.wait, args.timeout)
    text = (result["table"] + f"results: {result['json']}, {result['png']}"
            if "table" in result else json.dumps(result))
    _emit({k: v for k, v in result.items() if k != "table"}, args.json, text)
    return 0 if result.get("state", "COMPLETED") == "COMPLETED" else 1


def _resource_options(p: argparse.ArgumentParser, flags: tuple[str, ...] = ONE_JOB,
                      sweep: bool = False) -> None:
    """One option per job spec field in ``flags``, with the field's help; ``sweep``: nodes
    is a list."""
    for f in fields(jobspec.JobSpec):
        if f.name not in flags:
            continue
        option = "--" + f.name.replace("_", "-")
        if f.name == "nodes" and sweep:
            p.add_argument(option, default="1,2", help="comma-separated node counts")
        elif f.name in jobspec.BOUNDS:
            p.add_argument(option, type=int, help=f.metadata["help"])
        else:
            p.add_argument(option, metavar="SPEC" if f.name == "array" else None,
                           help=f.metadata["help"])
    p.add_argument("--folder", default="pyhpc-jobs/%j", help="submitit folder (logs, pickles)")


def _wait_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="wait for the job to finish")
    p.add_argument("--timeout", type=_timeout, help="with --wait: give up after SECONDS")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def add_commands(sub: Any) -> None:
    """Register the job commands on the CLI's subparsers."""
    p = sub.add_parser("render", help="render a job template to stdout")
    p.add_argument("template", nargs="?", help="template name (see --list) or a .j2 path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="template variable (repeatable)")
    p.add_argument("--list", action="store_true", help="list templates and their variables")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("submit", help="submit a template, a batch script or module:function")
    p.add_argument("target", help="template name/.j2 path, script path, or module:function")
    p.add_argument("args", nargs="*", help="arguments for module:function")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="template variable (repeatable)")
    _resource_options(p, RESOURCE_FLAGS)
    p.add_argument("--test-only", action="store_true", help="sbatch --test-only: submit nothing")
    _wait_options(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="job states (one Slurm query for all jobs)")
    p.add_argument("job_ids", nargs="*", help="job ids (default: your queued jobs)")
    p.add_argument("--watch", action="store_true", help="poll until all have finished")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--source", choices=watch.SOURCES,
                   help="default: sacct for one query, squeue with --watch")
    p.add_argument("--json", action="store_true", help="print states as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="print a job's output files")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel jobs")
    p.add_argument("job_ids", nargs="+")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("resubmit", help="submit a LOST job (or one that failed to start) again, "
                       "from the record pyhpc kept when it submitted it")
    p.add_argument("job_id")
    p.add_argument("--folder", default=str(_submit.DEFAULT_FOLDER),
                   help="the submit folder the job used (its records/ hold the job's record)")
    p.add_argument("--force", action="store_true",
                   help="submit it again whatever its state (it may then run twice)")
    p.add_argument("--reservation", help="run it in this reservation (default: the one it "
                   "asked for, else SBATCH_RESERVATION, else your one active reservation)")
    _wait_options(p)
    p.set_defaults(func=cmd_resubmit)

    p = sub.add_parser("train", help="the reference workload (LeNet on digits, or synthetic)")
    _resource_options(p)
    trainconfig.add_arguments(p, skip=("out",))
    p.add_argument("--out", help="run directory (checkpoint, metrics)")
    p.add_argument("--local", action="store_true", help="run here, one process, no Slurm")
    _wait_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("scale", help="sweep node counts x batch sizes (x pipeline stages), "
                       "then report")
    _resource_options(p, sweep=True)
    trainconfig.add_arguments(p, skip=("out", "batch_size", "pipeline"))
    p.set_defaults(mode="synthetic", epochs=1)
    p.add_argument("--batch-sizes", default="32", help="comma-separated (per worker if weak)")
    p.add_argument("--pipeline", default="1", help="comma-separated pipeline stage counts "
                   "(with --model deep; e.g. 1,2,4)")
    p.add_argument("--scaling", choices=metrics.SCALING, default="weak")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--out", required=True, help="sweep directory")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("bench", help="node and interconnect micro-benchmarks as a job: "
                       "copy bandwidth, all-reduce busbw, matmul TFLOP/s")
    _resource_options(p)
    p.add_argument("--gpus", action="store_true",
                   help="the GPU tests (NCCL, host<->device copies); default: the tasks' GPUs "
                   "where Slurm gives them, else the CPU. Without --gpus-per-node: every GPU "
                   "of the partition's nodes")
    p.add_argument("--tests", default=",".join(bench.TESTS),
                   help="comma-separated, some of: %(default)s")
    p.add_argument("--max-bytes", default="0", metavar="SIZE",
                   help="largest copy and all-reduce size, 4K to 1G (e.g. 64M); default "
                   f"0: {bench_results.size_label(bench.AUTO_MAX_BYTES['cuda'])} on GPUs, "
                   f"{bench_results.size_label(bench.AUTO_MAX_BYTES['cpu'])} on the CPU")
    p.add_argument("--matmul-size", default=0, type=int, metavar="N",
                   help=f"n of the n x n matmul, 0 to 32768; default 0: "
                   f"{bench.AUTO_MATMUL['cuda']} on GPUs, {bench.AUTO_MATMUL['cpu']} on the CPU")
    p.add_argument("--threads", type=int, default=1, help="torch threads per task (1 to 256)")
    p.add_argument("--out", help="results directory (bench.json, bench.txt, bench.png)")
    _wait_options(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="table + PNG of throughput and efficiency vs workers; "
                       "with --cluster, the cluster's use from Prometheus as an HTML page")
    p.add_argument("dirs", nargs="*", help="run or sweep directories (metrics.jsonl inside)")
    p.add_argument("--scaling", choices=metrics.SCALING, default="weak")
    p.add_argument("--png", help="plot path (default: scaling.png beside the runs)")
    p.add_argument("--time-to-train", metavar="EPOCHS",
                   help="also plot the time to train EPOCHS epochs against workers, one line "
                        "per batch size (time-to-train.png beside the scaling plot)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    cli_monitor.cluster_report_options(p)
    p.set_defaults(func=cmd_report)
