"""Build a variant of the framework image offline with podman and export it for jobs.

Steps: a Debian base from mmdebstrap (imported into podman, no registry), a build
context holding the wheels (``pip download`` on the host: torch's CPU wheel from
/opt/wheels, the rest from PyPI), ``podman build`` with the build's network off, then
an exploded rootfs on the shared path that ``podman run --rootfs DIR`` uses without a
per-run copy, plus the image's environment file and a record (image.json).

Podman flags that work in the lab (gVisor, cgroups v1, no systemd, no daemon):
  --storage-driver vfs      no overlay mounts under gVisor
  --runtime runc            Debian's runc
  --cgroup-manager cgroupfs no systemd to ask for cgroups
  --events-backend file     no journald
  --isolation chroot        RUN steps in a chroot: no nested OCI runtime in the build;
                            chroot allows only --network host, so offline-ness comes from
                            pip --no-index over the context's wheels/
  --ulimit nofile/nproc     explicit: podman's defaults (1048576/4194304) are above the
                            host's hard limits and runc's setrlimit fails with EPERM
                            ("error setting rlimit type 7"); nproc must stay small.
The rendered Containerfile, scripts and requirements are the cache key: an unchanged
spec rebuilds nothing.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from pyhpc.containers import spec as containers
from pyhpc.containers.spec import ContainerError, Variant

PODMAN = ["podman", "--storage-driver", "vfs", "--runtime", "runc",
          "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
#: Bump when image.json gains fields or the export changes, so cached images are built
#: and exported again (3: :func:`harden`, which trees exported before it lack).
RECORD_VERSION = 3
#: Mode bits no entry of an exported rootfs keeps (see :func:`harden`).
STRIPPED = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH
CACHE = Path(os.environ.get("PYHPC_CONTAINER_CACHE", "/var/cache/pyhpc/containers"))


def cuda_wheel(name: str) -> bool:
    """Whether a wheel is CUDA's (``nvidia_cublas_cu12-…``, ``torch-2.13.0+cu128-…``), not
    one that only names NVIDIA (``nvidia_ml_py``: NVML's bindings, pure Python)."""
    return "+cu" in name or (name.startswith("nvidia_") and re.search(r"_cu\d+-", name) is not None)


def log(message: str) -> None:
    print(f"pyhpc containers: {message}", flush=True)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; a failure is a ContainerError naming the command."""
    # kwargs are run()'s own (stdout=..., cwd=...), which the overloads cannot see through.
    proc: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        cmd, text=True, **kwargs)
    if proc.returncode != 0:
        raise ContainerError(f"build: {' '.join(cmd[:6])} ... failed with exit status "
                             f"{proc.returncode}", "build")
    return proc


def podman(*args: str, capture: bool = False) -> str:
    out = run([*PODMAN, *args], stdout=subprocess.PIPE if capture else None)
    return out.stdout.strip() if capture else ""


def image_exists(ref: str) -> bool:
    return subprocess.run([*PODMAN, "image", "exists", ref]).returncode == 0


def base_recipe(var: Variant) -> str:
    base = var.base
    return json.dumps({k: base.get(k) for k in ("suite", "sources", "packages", "bootstrap")},
                      sort_keys=True)


def check_base(var: Variant) -> None:
    """Fail before any work if the base can neither be found locally nor bootstrapped."""
    ref = var.base["image"]
    if var.base.get("bootstrap"):
        if shutil.which("mmdebstrap") is None and not image_exists(ref):
            raise ContainerError(f"base: {ref!r} is missing and mmdebstrap is not installed "
                                 "(apt-get install mmdebstrap)")
    elif not image_exists(ref):
        raise ContainerError(f"base: image {ref!r} of variant {var.name!r} is missing from local "
                             "storage and there is no registry to pull it from; on a host that "
                             "can pull it run `podman pull` (or `podman load -i FILE`) first")


def ensure_base(var: Variant) -> None:
    """Bootstrap the base with mmdebstrap unless podman holds one from the same recipe."""
    ref = var.base["image"]
    if not var.base.get("bootstrap"):
        return
    recipe = hashlib.sha256(base_recipe(var).encode()).hexdigest()
    if image_exists(ref):
        have = podman("image", "inspect", "--format",
                      '{{ index .Labels "org.pyhpc.base.recipe" }}', ref, capture=True)
        if have == recipe:
            log(f"base {ref} is up to date")
            return
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"base-{var.base['suite']}.tar"
    include = ",".join(f"{k}={v}" for k, v in var.base_packages)
    log(f"bootstrapping {var.base['suite']} with mmdebstrap ({include})")
    run(["mmdebstrap", "--variant=minbase", f"--include={include}",
         "--aptopt=Acquire::Retries=3", var.base["suite"], str(tarball),
         *var.base["sources"]])
    podman("import", "--change", f"LABEL org.pyhpc.base.recipe={recipe}",
           "--change", 'CMD ["/bin/bash"]', str(tarball), ref)
    tarball.unlink()


def prepare_context(var: Variant, ctx: Path) -> tuple[str, str]:
    """Write Containerfile, scripts, requirements and wheels/ into ``ctx``; return (text, key)."""
    ctx.mkdir(parents=True, exist_ok=True)
    files = {"Containerfile": containers.render(var, "oci"),
             f"{var.image}.def": containers.render(var, "apptainer"),
             "requirements.txt": var.requirements}
    files.update({name: containers.render_script(var, name) for name in containers.SCRIPTS})
    for name, text in files.items():
        (ctx / name).write_text(text)
    for name in containers.SCRIPTS:
        (ctx / name).chmod(0o755)
    key = hashlib.sha256(json.dumps([files, base_recipe(var), RECORD_VERSION],
                                    sort_keys=True).encode()).hexdigest()
    wheels = ctx / "wheels"
    wheels.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
           "--python-version", var.python, "--dest", str(wheels),
           "-r", str(ctx / "requirements.txt")]
    for link in var.wheels.get("find_links", []):
        cmd += ["--find-links", link]
    if "index_url" in var.wheels:
        cmd += ["--index-url", var.wheels["index_url"]]
    if "extra_index_url" in var.wheels:
        cmd += ["--extra-index-url", var.wheels["extra_index_url"]]
    log(f"downloading wheels into {wheels}")
    run(cmd)
    if var.cuda == "none" and any(cuda_wheel(p.name) for p in wheels.iterdir()):
        raise ContainerError(f"build: CUDA wheels in {wheels} for CPU variant {var.name!r}; "
                             "torch must come from the CPU wheel (find_links)")
    return files["Containerfile"], key


def export(var: Variant, ref: str, dest: Path) -> Path:
    """Explode the image into DEST/rootfs.new (with DEST/env.new); swap in by :func:`publish`."""
    dest.mkdir(parents=True, exist_ok=True)
    new = dest / "rootfs.new"
    shutil.rmtree(new, ignore_errors=True)
    # Only root enters it until harden() is done (tar keeps this mode: --no-overwrite-dir).
    new.mkdir(mode=0o700)
    cid = podman("create", "--network", "none", ref, "true", capture=True)
    try:
        with subprocess.Popen([*PODMAN, "export", cid], stdout=subprocess.PIPE) as exp:
            run(["tar", "-x", "--numeric-owner", "--no-overwrite-dir", "-C", str(new)],
                stdin=exp.stdout)
    finally:
        podman("rm", cid, capture=True)
    # podman's runtime marker is bind-mounted on this file; a researcher's (rootless)
    # podman cannot create it in the shared rootfs. The image's mount_points are in it.
    (new / "run").mkdir(mode=0o755, exist_ok=True)
    (new / "run" / ".containerenv").touch(mode=0o644)
    harden(new)
    # One KEY=VALUE a line, unquoted (podman's format): containers.env_file refuses any
    # key or value that could split a line.
    (dest / "env.new").write_text(containers.env_file(var))
    return new


def harden(rootfs: Path) -> None:
    """Make an exploded rootfs safe to keep on a host users log in to, then open it (0755).

    The tree sits on the host, not mounted nosuid or nodev, at a path every user can
    reach: the image's setuid-root su, mount and passwd would be setuid root there, its
    1777 tmp and var/tmp directories anyone could fill or plant in, a device node a way to
    the host's hardware, a file of an image uid or group (_apt, staff) writable by the
    host user who has that number. So every entry becomes the builder's (root's), with no
    setuid, setgid, sticky, group- or world-write bit, and every device, FIFO and socket
    goes. Jobs lose nothing: the runtime mounts the rootfs read-only with its own /dev,
    /tmp, /var/tmp and /run/lock (container_run), and each task runs as its own user.
    """
    # No race: until the chmod at the end only root can enter the tree (export()).
    owner = (os.geteuid(), os.getegid())
    for _, dirs, names, fd in os.fwalk(rootfs):
        for name in [*dirs, *names]:
            info = os.lstat(name, dir_fd=fd)
            kind = stat.S_IFMT(info.st_mode)
            if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                os.unlink(name, dir_fd=fd)
                continue
            if (info.st_uid, info.st_gid) != owner:  # clears setuid and setgid bits too
                os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
            if kind != stat.S_IFLNK and info.st_mode & STRIPPED:
                os.chmod(name, stat.S_IMODE(info.st_mode) & ~STRIPPED, dir_fd=fd)
    os.chmod(rootfs, 0o755)


def publish(dest: Path) -> None:
    """Replace the rootfs jobs use with the self-tested new one (a rename, not a copy)."""
    old = dest / "rootfs.old"
    shutil.rmtree(old, ignore_errors=True)
    if (dest / "rootfs").exists():
        (dest / "rootfs").rename(old)
    (dest / "rootfs.new").rename(dest / "rootfs")
    (dest / "env.new").rename(dest / "env")
    shutil.rmtree(old, ignore_errors=True)


def selftest(rootfs: Path, env_file: Path) -> str:
    """Run the image's self-test from an exported rootfs, as a job would."""
    out = run([*PODMAN, "run", "--rm", *ULIMITS, "--network", "host", "--env-file",
               str(env_file), "--rootfs", str(rootfs), "/usr/local/bin/pyhpc-selftest"],
              stdout=subprocess.PIPE)
    return out.stdout


def prune(var: Variant, keep: str) -> None:
    """Drop older builds of this image (each holds a full copy of its layers under vfs)."""
    tags = podman("images", "--format", "{{.Repository}}:{{.Tag}}", f"localhost/{var.image}",
                  capture=True)
    for tag in tags.split():
        if tag not in (keep, f"localhost/{var.image}:latest"):
            subprocess.run([*PODMAN, "rmi", tag], stdout=subprocess.DEVNULL)
    subprocess.run([*PODMAN, "image", "prune", "-f"], stdout=subprocess.DEVNULL)


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], text=True, check=True,
                              stdout=subprocess.PIPE).stdout.split()[0])


def build(var: Variant, images_dir: Path, oci_archive: bool = False, force: bool = False,
          context_only: bool = False) -> dict[str, object]:
    """Build ``var`` unless up to date; returns the image record (also in image.json)."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None and not context_only:
            raise ContainerError(f"build: {tool} is not installed (the containers role "
                                 "installs it)", "build")
    if not context_only:
        check_base(var)
    ctx = CACHE / var.name
    text, key = prepare_context(var, ctx)
    dest = images_dir / var.image
    record_file = dest / "image.json"
    ref = f"localhost/{var.image}:{key[:12]}"
    if context_only:
        log(f"build context ready in {ctx}")
        return {"context": str(ctx)}
    if not force and record_file.exists() and (dest / "rootfs").is_dir() and image_exists(ref):
        record = json.loads(record_file.read_text())
        if record.get("key") == key:
            log(f"{var.image} is up to date ({ref}, {dest})")
            return dict(record, cached=True)
    start = time.monotonic()
    ensure_base(var)
    base_s = time.monotonic() - start
    log(f"building {ref}")
    podman("build", "--isolation", "chroot", *ULIMITS, "--network", "host", "--layers=false",
           "--pull=never", "-f", str(ctx / "Containerfile"), "-t", ref,
           "-t", f"localhost/{var.image}:latest", str(ctx))
    build_s = time.monotonic() - start
    new = export(var, ref, dest)
    # A failing self-test leaves the published rootfs and image.json as they were.
    output = selftest(new, dest / "env.new")
    freeze = run([*PODMAN, "run", "--rm", *ULIMITS, "--rootfs", str(new),
                  f"{var.venv}/bin/pip", "freeze", "--all"], stdout=subprocess.PIPE).stdout
    publish(dest)
    shutil.copy(ctx / "Containerfile", dest / "Containerfile")
    shutil.copy(ctx / f"{var.image}.def", dest / f"{var.image}.def")
    archive = dest.parent / f"{var.image}.oci.tar"
    if oci_archive:
        archive.unlink(missing_ok=True)
        podman("save", "--format", "oci-archive", "-o", str(archive), ref)
    total_s = time.monotonic() - start
    prune(var, ref)
    record = {
        "image": var.image, "variant": var.name, "ref": ref, "key": key,
        "image_id": podman("image", "inspect", "--format", "{{.Id}}", ref, capture=True),
        "image_size_bytes": int(podman("image", "inspect", "--format", "{{.Size}}", ref,
                                       capture=True)),
        "rootfs": str(dest / "rootfs"), "rootfs_bytes": du(dest / "rootfs"),
        "env_file": str(dest / "env"), "labels": dict(var.labels()),
        "base_seconds": round(base_s, 1), "build_seconds": round(build_s, 1),
        "total_seconds": round(total_s, 1), "selftest": output.splitlines(), "cached": False,
        # Every Python package in the image, transitive ones included.
        "pip_freeze": freeze.splitlines(),
        "oci_archive": str(archive) if oci_archive else None,
        "oci_archive_bytes": archive.stat().st_size if oci_archive else None,
    }
    record_file.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    log(f"built {ref} in {total_s:.0f} s; image {record['image_size_bytes'] / 1e6:.0f} MB; "
        f"rootfs {dest / 'rootfs'}")
    return record


def build_variant(variant: str, torch: str | None, images_dir: Path, *,
                  oci_archive: bool = False, force: bool = False,
                  context_only: bool = False) -> dict[str, object]:
    """``pyhpc containers build``: resolve ``variant`` (``torch``, when given, must be the
    spec's) and :func:`build` it under the build lock; returns the image record."""
    var = containers.variant(variant, torch=torch)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time: they share podman's store
        return build(var, images_dir, oci_archive=oci_archive, force=force,
                     context_only=context_only)
