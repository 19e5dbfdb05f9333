//! Waits with deadlines, for tests. A test that waits on a VM, a daemon or a peer without a
//! deadline hangs instead of failing when that peer dies (an `accept()` for a hello that never
//! comes); every such wait in crucible's tests goes through one of these, which kill what they
//! waited for and fail saying what did not happen.

#![forbid(unsafe_code)]

use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How often the polling waits look again.
const POLL: Duration = Duration::from_millis(10);

fn timed_out(what: &str, limit: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} did not happen within {limit:?}"),
    )
}

/// Waits for `child` to exit, at most `limit`; past it the child is killed (and reaped) and
/// the answer is a `TimedOut` error.
pub fn wait_within(child: &mut Child, limit: Duration) -> io::Result<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(timed_out(&format!("exit of process {}", child.id()), limit));
        }
        std::thread::sleep(POLL);
    }
}

/// Runs `command` to its end with stdin closed and stdout and stderr captured (read as they
/// come, so a chatty child never blocks on a full pipe). Past `limit` it is killed and the
/// error carries what it had printed.
pub fn output_within(command: &mut Command, limit: Duration) -> io::Result<Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_within(&mut child, limit);
    let collect = |h: std::thread::JoinHandle<Vec<u8>>| h.join().unwrap_or_default();
    let (stdout, stderr) = (collect(stdout), collect(stderr));
    match status {
        Ok(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "{command:?}: {e}; stdout so far {:?}, stderr so far {:?}",
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            ),
        )),
    }
}

/// Reads `pipe` to its end on a thread.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// The first connection to `listener`, waited for at most `limit`; the stream is blocking.
/// `alive` is asked between looks: when it says the peer is gone (the VM exited before it
/// connected), the wait ends at once with its reason.
pub fn accept_within(
    listener: &UnixListener,
    limit: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> io::Result<UnixStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + limit;
    let result = loop {
        match listener.accept() {
            Ok((stream, _)) => break Ok(stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => break Err(e),
        }
        if let Err(why) = alive() {
            break Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("no connection: {why}"),
            ));
        }
        if Instant::now() >= deadline {
            break Err(timed_out("a connection", limit));
        }
        std::thread::sleep(POLL);
    };
    listener.set_nonblocking(false)?;
    let stream = result?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Lines from a reader (a child's stdout), each waited for with a deadline.
#[derive(Debug)]
pub struct Lines {
    rx: mpsc::Receiver<io::Result<String>>,
}

impl Lines {
    /// Reads `reader` line by line on a thread.
    pub fn new(reader: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            loop {
                let mut line = String::new();
                let next = match reader.read_line(&mut line) {
                    Ok(0) => return,
                    Ok(_) => Ok(line),
                    Err(e) => Err(e),
                };
                let stop = next.is_err();
                if tx.send(next).is_err() || stop {
                    return;
                }
            }
        });
        Lines { rx }
    }

    /// The next line (with its newline), waited for at most `limit`; `Ok(None)` at the end.
    pub fn next_within(&self, limit: Duration) -> io::Result<Option<String>> {
        match self.rx.recv_timeout(limit) {
            Ok(line) => line.map(Some),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(timed_out("a line of output", limit)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_child_past_its_deadline_is_killed_and_reported() {
        let started = Instant::now();
        let e =
            output_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(10));
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(
            (out.stdout.as_slice(), out.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
    }

    #[test]
    fn output_of_a_chatty_child_never_fills_the_pipe() {
        let out = output_within(
            Command::new("sh").args(["-c", "head -c 1000000 /dev/zero"]),
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(out.stdout.len(), 1_000_000);
    }

    #[test]
    fn accept_ends_at_its_deadline_or_when_the_peer_is_gone() {
        let dir = std::env::temp_dir().join(format!("testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let e = accept_within(&listener, Duration::from_millis(100), || Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let e = accept_within(&listener, Duration::from_secs(30), || {
            Err("it exited".into())
        })
        .unwrap_err();
        assert!(e.to_string().contains("it exited"), "{e}");
        let _client = UnixStream::connect(&path).unwrap();
        accept_within(&listener, Duration::from_secs(5), || Ok(())).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lines_arrive_or_time_out() {
        let mut child = Command::new("sh")
            .args(["-c", "echo one; sleep 30"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Lines::new(child.stdout.take().unwrap());
        assert_eq!(
            lines
                .next_within(Duration::from_secs(10))
                .unwrap()
                .as_deref(),
            Some("one\n")
        );
        let e = lines.next_within(Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
