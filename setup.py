"""pyhpc's one build step: the wheel carries the repository's slurm/, containers/ and
workshops/ (the one source, kept at the top level) as pyhpc/_data/, where pyhpc.paths finds
them. The metadata is pyproject.toml's; an editable install copies nothing (pyhpc reads the
checkout's folders).
"""
from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: Each top-level folder and the files of it that pyhpc reads at run time.
DATA = {
    "slurm": ["etc/*.j2", "jobs/*.j2"],
    "containers": ["spec.yml", "templates/*.j2"],
    "workshops": ["*.ipynb"],
}


def data_files() -> list[Path]:
    """The shipped files, relative to the repository; a pattern that matches nothing stops
    the build (a wheel without its job templates renders no job)."""
    found: list[Path] = []
    for folder, patterns in DATA.items():
        for pattern in patterns:
            matches = sorted(p for p in (HERE / folder).glob(pattern) if p.is_file())
            if not matches:
                raise SystemExit(f"setup.py: {folder}/{pattern} matches no file in {HERE}")
            found += [p.relative_to(HERE) for p in matches]
    return found


class BuildPy(build_py):
    """build_py, then the data copied into the build's pyhpc/_data/."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for path in data_files():
            target = Path(self.build_lib, "pyhpc", "_data", path)
            self.mkpath(str(target.parent))
            self.copy_file(str(HERE / path), str(target))

    def get_source_files(self) -> list[str]:
        """The package's sources and the data: what an sdist holds, so its wheel has them too."""
        return [*super().get_source_files(), *(str(p) for p in data_files())]


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPy})
