"""The wheel an operator installs starts anywhere: it carries the profiles, the migrations and
the sample knowledge base's documents, and finds them inside the installed package (issue 35).

The wheel is built from a copy of the checkout (setuptools reuses a ``build/`` folder, so an
in-place build could hold files the checkout no longer has) and installed into a fresh
virtual environment that borrows the project's already-installed dependencies: one ``.pth``
line names the project venv's site-packages. The ``.pth`` files inside a folder added that way
are not read, so the project's editable rag-stream stays out and the wheel's copy is the one
imported (checked). The service then starts in an empty directory on the default profile with
the stub engine (``tests/support/stub_server.py``: no engine start), embedded everything else.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from alembic.script import ScriptDirectory

from tests.support.server import ROOT, free_port
from tests.support.waiting import eventually_sync

# What the build reads; everything else in the checkout (the venv, models, caches) stays out.
_BUILD_INPUTS = ("pyproject.toml", "README.md", "rag_stream", "configs", "migrations", "docs")


@dataclass
class Installed:
    wheel: Path
    python: Path
    scripts: Path
    site_packages: Path
    env: dict[str, str]  # what every process of the installed package runs with


def _build_wheel(out: Path) -> Path:
    source = out / "source"
    source.mkdir()
    for name in _BUILD_INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, source / name)
    # no build isolation and no index: the project venv's setuptools builds it, offline
    pip_wheel = ["pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run(
        [sys.executable, "-m", *pip_wheel, "--wheel-dir", str(out), str(source)],
        check=True,
        timeout=120,
    )
    (wheel,) = out.glob("rag_stream-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(root)
    venv = root / "venv"
    # venv builds on the base interpreter (sys._base_executable), not on the project's venv
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "_project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: pip sees the project venv's rag-stream through the .pth line, and
    # must neither skip the wheel for it nor try to remove it
    pip_install = ["pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed"]
    subprocess.run([python, "-m", *pip_install, str(wheel)], check=True, timeout=120)
    # The stub server is test code: only the tests package is added, never the checkout root
    # (its rag_stream/ would shadow the installed one).
    path_dir = root / "pythonpath"
    path_dir.mkdir()
    (path_dir / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RAG_STREAM_") and k != "PYTHONPATH"
    }
    env.update(PYTHONPATH=str(path_dir), RAG_STREAM_MODELS_DIR=str(models_dir))
    return Installed(wheel, python, venv / "bin", site, env)


def test_the_wheel_carries_profiles_migrations_and_the_sample_documents(
    installed: Installed,
) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())

    def carried(folder: str, pattern: str) -> set[str]:
        return {
            f"rag_stream/{folder}/{p.relative_to(ROOT / folder).as_posix()}"
            for p in (ROOT / folder).glob(pattern)
        }

    profiles = carried("configs", "*.yaml")
    migrations = carried("migrations", "*.py") | carried("migrations", "versions/*.py")
    documents = carried("docs", "**/*.md")
    assert {"rag_stream/configs/default.yaml", "rag_stream/configs/production.yaml"} <= profiles
    assert "rag_stream/docs/protocol.md" in documents
    expected = profiles | migrations | documents | {"rag_stream/migrations/script.py.mako"}
    assert expected <= names, sorted(expected - names)
    # every module of the package, whichever subpackage it is in
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "rag_stream").rglob("*.py")}
    assert modules <= names, sorted(modules - names)


@pytest.fixture
def served(installed: Installed, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The installed package's service, started in an empty directory (its data goes to
    ``.data`` there, the default), on the stub engine: its URL and its directory."""
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [installed.python, "-m", "tests.support.stub_server"],
            env={**installed.env, "RAG_STREAM_PORT": str(port)},
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"the installed service exited with {proc.returncode}:\n{_tail(log)}")
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        eventually_sync(ready, f"/readyz of the installed service; log:\n{_tail(log)}", 60, 0.2)
        yield url, tmp_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)


def _tail(log: Path, n: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def test_the_installed_package_starts_in_any_directory_on_its_own_data(
    installed: Installed, served: tuple[str, Path]
) -> None:
    url, directory = served
    where = subprocess.run(
        [installed.python, "-c", "import rag_stream; print(rag_stream.__file__)"],
        env=installed.env,
        cwd=directory,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed.site_packages), where

    # the packaged migrations made the database, up to the newest revision
    head = ScriptDirectory(str(ROOT / "migrations")).get_current_head()
    with sqlite3.connect(directory / ".data" / "rag-stream.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        (version,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert {"jobs", "knowledge_bases", "api_keys"} <= tables
    assert version == head

    # the packaged sample documents were found: the sample KB is made only when they are
    # (filling it takes half a minute here; the first test checks every document is carried)
    def sample_kb_exists() -> bool:
        return httpx.get(f"{url}/v1/kbs/docs", timeout=5).status_code == 200

    eventually_sync(sample_kb_exists, "the sample KB", 20, 0.2)

    # the console script runs from here too, on the packaged profile and migrations
    upgraded = subprocess.run(
        [installed.scripts / "rag-stream", "db", "upgrade"],
        env=installed.env,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert "database at head" in upgraded.stdout
