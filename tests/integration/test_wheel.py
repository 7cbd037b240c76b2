"""A built wheel ships the schema: build it, install it into a fresh venv, and run
``mydata-batch db init`` against a fresh PostgreSQL database from outside the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _source_copy(dest: Path) -> Path:
    """The files a build reads, so building leaves nothing behind in the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("batch", "planning", "sql"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_installed_wheel_initialises_a_postgresql_database(tmp_path: Path,
                                                              pg_url: str) -> None:
    src = _source_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=90)
    (wheel,) = dist.glob("mydata_batch-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
    # the dependencies come from this environment (a plain path: its .pth files, and so
    # the editable install of the checkout, are not processed); the package from the wheel
    site.joinpath("deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=90)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import batch.db.engine as e; print(e.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(venv))  # not the checkout
    init = subprocess.run([str(venv / "bin" / "mydata-batch"), "--db", pg_url, "db", "init"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    tables = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import asyncio, sys\n"
         "from sqlalchemy import text\n"
         "from batch.db.engine import make_engine\n"
         "async def main():\n"
         "    e = make_engine(sys.argv[1])\n"
         "    async with e.connect() as c:\n"
         "        r = await c.execute(text(\"SELECT tablename FROM pg_tables WHERE \"\n"
         "                                 \"schemaname = 'public'\"))\n"
         "        print(' '.join(sorted(r.scalars())))\n"
         "    await e.dispose()\n"
         "asyncio.run(main())\n", pg_url],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert {"consents", "nodes", "schema_migrations"} <= set(tables.stdout.split())
