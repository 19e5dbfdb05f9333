"""examples/python run against the test daemon: the CI job passes and fails as its tree
says, and the concurrency example runs its 100 commands."""

import os
import pathlib
import subprocess
import sys

from conftest import make_client

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "python"
PACKAGE = ROOT / "sdks" / "python"


def run_example(daemon, name, *args, timeout=300):
    env = dict(os.environ, CRUCIBLE_HOST=str(daemon),
               PYTHONPATH=os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def make_repo(path, test_script):
    (path / "ci").mkdir(parents=True)
    (path / "src.txt").write_text("1 2 3\n")
    (path / "ci" / "build.sh").write_text(
        "set -e\nmkdir -p out\ntr ' ' '\\n' < src.txt > out/lines\n"
        "echo built $(wc -l < out/lines) lines\n"
        "echo run >> $CACHE_DIR/runs; echo cache runs: $(wc -l < $CACHE_DIR/runs)\n")
    (path / "ci" / "test.sh").write_text(test_script)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=60)
    subprocess.run([*git, "add", "."], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "-m", "tree"], check=True, timeout=60)
    # Uncommitted: must not reach the sandbox.
    (path / "ci" / "test.sh").write_text("echo dirty; exit 99\n")


def test_ci_job_passes_streams_logs_and_keeps_its_cache(daemon, tmp_path):
    make_repo(tmp_path / "ok", "set -e\n[ $(cat out/lines | wc -l) = 3 ] && echo tests passed\n")
    first = run_example(daemon, "ci_job.py", str(tmp_path / "ok"), "--cache", "pytest-ci:/cache")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "built 3 lines" in first.stdout and "tests passed" in first.stdout
    assert "cache runs: 1" in first.stdout and "dirty" not in first.stdout
    second = run_example(daemon, "ci_job.py", str(tmp_path / "ok"), "--cache", "pytest-ci:/cache")
    assert second.returncode == 0 and "cache runs: 2" in second.stdout, second.stdout
    with make_client(str(daemon)) as client:
        client.delete_cache("pytest-ci")


def test_ci_job_fails_with_the_failing_step(daemon, tmp_path):
    make_repo(tmp_path / "bad", "echo one test failed >&2\nexit 3\n")
    done = run_example(daemon, "ci_job.py", str(tmp_path / "bad"), "--cache", "pytest-ci2:/c")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "one test failed" in done.stderr and "test exited with 3" in done.stderr
    with make_client(str(daemon)) as client:
        client.delete_cache("pytest-ci2")


def test_concurrency_runs_100_commands_over_10_sandboxes(daemon):
    done = run_example(daemon, "concurrency.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("100 commands over 10 sandboxes: 100 ok"), done.stdout
