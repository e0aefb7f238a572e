"""CI (no GPU): the GPU check scripts under tests/ parse, and the helpers they share
(tests/gpu_lib.sh) keep each step inside the lane's time limit and always pack the logs:
a run on the lent GPU machine that overruns its limit returns almost nothing."""
import subprocess
import tarfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.mark.parametrize("script", sorted(p.name for p in TESTS.glob("*.sh")))
def test_script_parses(script):
    done = subprocess.run(["bash", "-n", str(TESTS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_gpu_lib_steps_time_limits_and_pack(tmp_path):
    script = """set -uo pipefail
LANE_LIMIT=40
source tests/gpu_lib.sh "$OUT_DIR"
note hello
step 5 a.log sleep 0.1; echo "first=$?"
step 1 a.log sleep 5; echo "second=$?"
LIMIT=10
step 30 a.log true; echo "third=$?"
pack
"""
    done = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"OUT_DIR": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    # a step runs under min(its own limit, the time left); timeout's 124 is its status; with
    # under 15 s left a step is refused (status 1) and says so
    assert "first=0" in done.stdout and "second=124" in done.stdout and "third=1" in done.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "hello" in summary and "skipped (no time left): true" in summary and "packed" in summary
    assert not (tmp_path / "out" / "logs").exists()   # packed, then removed
    with tarfile.open(tmp_path / "out" / "logs.tgz") as tar:
        log = tar.extractfile("logs/a.log").read().decode()
    assert "=== sleep 5 (limit 1s)" in log and "rc=124" in log
