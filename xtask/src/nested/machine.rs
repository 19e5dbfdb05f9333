//! One L1 run: QEMU TCG emulating an AMD CPU with SVM and nested paging, booting the Debian
//! kernel with the L1 initramfs. L1's kernel console goes to `console.log`; its result port
//! (the second serial port) is a Unix socket this process listens on and reads live, so a
//! watchdog notices when L1 falls silent (its `/init` prints a heartbeat every 5 s), and every
//! line is kept in `results.log`. Nothing leaves the machine: no network device at all.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::verdict::{self, Ending, Event, Transcript, Verdict};

/// The emulated machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Machine {
    /// QEMU's `-cpu` (must offer `svm` and `npt`).
    pub cpu: String,
    /// vCPUs (each one host thread under multi-threaded TCG).
    pub smp: u32,
    /// Memory in MiB: the initramfs stays in it, and the L2 guests run in it.
    pub mem_mib: u32,
    /// `kvm_amd` module parameters, e.g. `nested=1 npt=1`.
    pub kvm_amd: String,
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "-cpu {} -smp {} -m {}M, kvm_amd {}",
            self.cpu,
            self.smp,
            self.mem_mib,
            if self.kvm_amd.is_empty() {
                "defaults"
            } else {
                &self.kvm_amd
            }
        )
    }
}

/// How long a run may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// No line from L1 for this long means it froze (it prints a heartbeat every 5 s).
    pub silence: Duration,
    /// The whole run.
    pub deadline: Duration,
}

/// What one run left behind.
#[derive(Debug)]
pub(crate) struct Run {
    /// The verdict.
    pub verdict: Verdict,
    /// What L1 said.
    pub transcript: Transcript,
    /// How long it took.
    pub elapsed: Duration,
    /// Where its logs are.
    pub dir: PathBuf,
}

/// Boots L1 once in `dir` (its logs stay there) and judges the run. `echo` prints L1's
/// output as it arrives (its heartbeats excepted).
pub(crate) fn run(
    qemu: &Path,
    kernel: &super::l1_kernel::L1Kernel,
    initrd: &Path,
    machine: &Machine,
    limits: Limits,
    dir: &Path,
    echo: bool,
) -> Result<Run> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let started = Instant::now();
    let socket = dir.join("results.sock");
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    let console = dir.join("console.log");
    let monitor = dir.join("monitor.sock");
    let qemu_log = dir.join("qemu.log");
    let log = std::fs::File::create(&qemu_log)?;
    // why std::process::Command: QEMU runs supervised while its serial output is read (pre_exec
    // for the parent-death signal, killed on silence or the deadline), which xshell cannot do.
    let mut command = Command::new(qemu);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe; it changes the child's own parent-death signal: QEMU must not outlive
    // this process (a CI runner killing the tier would otherwise leave L1 running).
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .args(["-accel", "tcg", "-cpu", &machine.cpu])
        .args(["-smp", &machine.smp.to_string()])
        .args(["-m", &format!("{}M", machine.mem_mib)])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &kernel_command_line(machine)])
        .arg("-chardev")
        .arg(format!("file,id=console,path={}", console.display()))
        .args(["-serial", "chardev:console"])
        .arg("-chardev")
        .arg(format!("socket,id=results,path={}", socket.display()))
        .args(["-serial", "chardev:results"])
        // Where a frozen L1's vCPUs are is asked here before it is killed.
        .arg("-monitor")
        .arg(format!("unix:{},server=on,wait=off", monitor.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", qemu.display()))?;
    let mut result = watch(&mut child, &listener, limits, dir, echo, started);
    if let Ok((_, Ending::Silent { at, .. } | Ending::Deadline { at, .. })) = &mut result {
        *at = where_frozen(&monitor, dir);
    }
    // Whatever happened, QEMU does not outlive the run.
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&monitor);
    let (transcript, ending) = result?;
    let console_text = std::fs::read_to_string(&console).unwrap_or_default();
    Ok(Run {
        verdict: verdict::judge(&transcript, &console_text, &ending),
        transcript,
        elapsed: started.elapsed(),
        dir: dir.to_path_buf(),
    })
}

/// L1's kernel command line: the console on the first serial port; on a panic or an oops,
/// reboot at once, which `-no-reboot` turns into QEMU's exit (a quick, classified failure
/// rather than a hang); no address-space randomization, so that a frozen L1's instruction
/// pointers mean the same from run to run; the kvm_amd parameters reach `/init` as
/// `L1_KVM_AMD`.
fn kernel_command_line(machine: &Machine) -> String {
    format!(
        "console=ttyS0 panic=-1 oops=panic nokaslr rdinit=/init L1_KVM_AMD={}",
        machine.kvm_amd.replace(' ', ",")
    )
}

/// Reads L1's result port until it closes, the watchdog fires or the deadline passes.
fn watch(
    child: &mut Child,
    listener: &UnixListener,
    limits: Limits,
    dir: &Path,
    echo: bool,
    started: Instant,
) -> Result<(Transcript, Ending)> {
    let mut transcript = Transcript::default();
    let Some(stream) = accept_within(listener, child, Duration::from_secs(30))? else {
        let status = child.try_wait()?.map(describe).unwrap_or_default();
        return Ok((
            transcript,
            Ending::Exited(format!("QEMU never connected its result port {status}")),
        ));
    };
    let (tx, rx) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line).replace('\r', "");
                    if tx.send(Some(text)).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(None);
    });
    let mut results = std::fs::File::create(dir.join("results.log"))?;
    let mut last_heard = Instant::now();
    loop {
        if started.elapsed() > limits.deadline {
            return Ok((
                transcript,
                Ending::Deadline {
                    limit: limits.deadline,
                    at: String::new(),
                },
            ));
        }
        if last_heard.elapsed() > limits.silence {
            return Ok((
                transcript,
                Ending::Silent {
                    quiet: last_heard.elapsed(),
                    at: String::new(),
                },
            ));
        }
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Some(line)) => {
                last_heard = Instant::now();
                results.write_all(line.as_bytes())?;
                let event = verdict::parse(&line);
                if echo && event != Some(Event::Heartbeat) {
                    eprint!("    L1| {line}");
                    if !line.ends_with('\n') {
                        eprintln!();
                    }
                }
                if let Some(e) = event {
                    transcript.record(e);
                }
            }
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    // The port closed: QEMU is exiting (L1 powered off, or it died).
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break describe(s);
        }
        if Instant::now() > deadline {
            break "it did not exit within 30 s of closing its result port".into();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Ok((transcript, Ending::Exited(status)))
}

fn describe(status: ExitStatus) -> String {
    status.to_string()
}

/// QEMU connects to the result port as it starts; `None` if it exited or took too long.
fn accept_within(
    listener: &UnixListener,
    child: &mut Child,
    limit: Duration,
) -> Result<Option<std::os::unix::net::UnixStream>> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(Some(stream));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("accepting QEMU's result port"),
        }
        if child.try_wait()?.is_some() || Instant::now() > deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where L1's vCPUs are, from QEMU's monitor (`info registers -a`); the monitor's whole answer
/// is kept in `frozen-registers.txt`. (Debian ships no real `System.map`: L1 boots with
/// `nokaslr`, so the addresses are those of its `-dbg` package, and its own soft-lockup
/// report on the console names the function.) Best effort: an empty string when the monitor
/// does not answer within a few seconds.
fn where_frozen(monitor: &Path, dir: &Path) -> String {
    use std::io::Read;
    let Ok(mut conn) = std::os::unix::net::UnixStream::connect(monitor) else {
        return String::new();
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = conn.write_all(b"info registers -a\n");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 65536];
    while let Ok(n) = conn.read(&mut chunk) {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let _ = std::fs::write(dir.join("frozen-registers.txt"), &text);
    let rips: Vec<String> = text
        .split("RIP=")
        .skip(1)
        .filter_map(|rest| u64::from_str_radix(rest.get(..16)?, 16).ok())
        .enumerate()
        .map(|(cpu, rip)| format!("vCPU {cpu} at {rip:#x}"))
        .collect();
    rips.join(", ")
}
