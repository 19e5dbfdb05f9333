"""examples/python run against the test daemon: the CI job passes and fails as its tree
says, and the concurrency example runs its 100 commands."""

import fcntl
import os
import pathlib
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time

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


def test_shell_on_a_local_terminal_forwards_keys_and_its_size(daemon):
    """shell.py on a pseudo-terminal of ours, as a person's terminal would run it: keys go
    through, its size is the sandbox terminal's, and a resize (SIGWINCH) follows."""
    master, slave = pty.openpty()

    def set_size(rows, cols):
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    set_size(33, 99)
    env = dict(os.environ, CRUCIBLE_HOST=str(daemon), TERM="xterm-probe",
               PYTHONPATH=os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "shell.py")], stdin=slave,
                            stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def read_until(needle, seconds=60.0):
        deadline = time.monotonic() + seconds
        while needle not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([master], [], [], left)[0]:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the script has closed its terminal
                    chunk = b""
                assert chunk, f"shell.py ended: {bytes(seen)!r}"
                seen.extend(chunk)
        return True

    try:
        # The first output is the sandbox shell's prompt: by then our terminal is in raw mode.
        assert read_until(b" "), bytes(seen)
        os.write(master, b"stty size; echo term=$TERM\r")
        assert read_until(b"33 99\r\nterm=xterm-probe\r\n"), bytes(seen)
        set_size(44, 111)
        proc.send_signal(signal.SIGWINCH)
        for _ in range(10):  # the resize and the keys travel on two paths: ask until it shows
            os.write(master, b"stty size\r")
            if read_until(b"44 111\r\n", 3.0):
                break
        assert b"44 111\r\n" in seen, bytes(seen)
        os.write(master, b"exit 7\r")
        assert proc.wait(timeout=60) == 7, bytes(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(master)


def test_shell_with_piped_input_ends_with_it(daemon):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "shell.py")], input=b"stty size\nexit 4\n",
        capture_output=True, timeout=120,
        env=dict(os.environ, CRUCIBLE_HOST=str(daemon),
                 PYTHONPATH=os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 4, done.stdout + done.stderr
    assert b"24 80\r\n" in done.stdout, done.stdout  # the default size; the terminal's endings
