#!/usr/bin/env python3
"""A shell in a fresh sandbox, from this terminal: what `docker exec -it` is to a container.

    python3 examples/python/shell.py                 # sh
    python3 examples/python/shell.py top             # any command, on a terminal

The command runs on a pseudo-terminal in the sandbox, as large as this terminal. This
terminal is put in raw mode, so every key (Ctrl-C, Tab, the arrows) goes to the sandbox's
terminal as typed, and its line discipline and programs make of it what a local terminal
would; when this terminal is resized, the sandbox's is resized too, and its type ($TERM) is
passed along for full-screen programs. The script exits with the command's exit code, and the
sandbox is deleted. $CRUCIBLE_HOST picks the daemon.

Input that is not a terminal (a pipe) is sent as it comes, and its end is sent as the
terminal's end-of-file character: `echo 'stty size' | shell.py` prints 24 80.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import termios
import threading
import tty
from typing import Optional, Tuple

from crucible_sdk import CrucibleError, Exit, Sandbox, Session, Stdout


def window_size(fd: int) -> Tuple[int, int]:
    """The terminal's size as the sandbox takes it: (rows, cols)."""
    size = os.get_terminal_size(fd)
    return size.lines, size.columns


def forward_input(session: Session, keys: int, wake: int, sized_by: Optional[int]) -> None:
    """Sends what is typed, and this terminal's size after each SIGWINCH. Everything the
    session sends is sent from this one thread, so no two frames are ever written at once."""
    try:
        while True:
            ready, _, _ = select.select([keys, wake], [], [])
            if wake in ready:
                os.read(wake, 512)
                if sized_by is not None:
                    session.resize(*window_size(sized_by))
            if keys in ready:
                data = os.read(keys, 4096)
                if not data:  # the end of a piped input
                    session.close_stdin()
                    return
                session.send(data)
    except CrucibleError:
        return  # the command ended and its connection went with it: nothing left to send to


def main() -> int:
    parser = argparse.ArgumentParser(description="An interactive shell in a new sandbox.")
    parser.add_argument("command", nargs="*", default=["sh"], help="what to run (default: sh)")
    parser.add_argument("--image", default=None)
    args = parser.parse_args()

    keys, screen = sys.stdin.fileno(), sys.stdout.fileno()
    typed = os.isatty(keys)
    sized_by = screen if os.isatty(screen) else keys if typed else None
    size = window_size(sized_by) if sized_by is not None else None

    # SIGWINCH (this terminal was resized) wakes the input thread through a pipe: the handler
    # runs on the main thread, which must not write a frame while the input thread does.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGWINCH, lambda signum, frame: os.write(wake_w, b"w"))

    saved = termios.tcgetattr(keys) if typed else None
    with Sandbox.create(image=args.image) as sb:
        term = {"TERM": os.environ["TERM"]} if os.environ.get("TERM") else None
        with sb.interactive(args.command, tty=True, tty_size=size, env=term) as session:
            if saved is not None:
                tty.setraw(keys, termios.TCSADRAIN)
            try:
                threading.Thread(target=forward_input, args=(session, keys, wake_r, sized_by),
                                 daemon=True).start()
                code = 1
                for event in session:
                    if isinstance(event, Stdout):
                        sys.stdout.buffer.write(event.data)
                        sys.stdout.buffer.flush()
                    elif isinstance(event, Exit):
                        code = event.result.exit_code
            finally:
                if saved is not None:
                    termios.tcsetattr(keys, termios.TCSADRAIN, saved)
    return code if 0 <= code <= 255 else 1


if __name__ == "__main__":
    sys.exit(main())
