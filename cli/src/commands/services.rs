//! `--service`, `--service-ready`, `--service-restart` and `--shared` of `crucible run` and
//! `crucible sandbox create`: a CI job's service containers (a database, a cache, a browser)
//! beside its own root, reached on `localhost`; and `crucible sandbox logs`.

use std::fmt;
use std::path::Path;

use anyhow::{Context, Result};
use api_types::{ContainerRequest, ReadyCheck, RestartPolicy, SharedMount};
use wire::FrameType;

use crate::{output, Global};

/// The service flags, as clap parses them.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct ServiceArgs {
    /// Run a service container NAME of IMAGE beside the job (repeatable). IMAGE is any image
    /// name the daemon knows, tag included (`db=postgres:16`). Its main process is the
    /// image's entrypoint and command unless --service-cmd gives one. Services share the
    /// sandbox's network (the job reaches them on localhost) and are up, and ready (see
    /// --service-ready), before the job starts. Both backends. The older form
    /// NAME=IMAGE:CMD, where CMD holds a space, still gives CMD.
    #[arg(long, value_name = "NAME=IMAGE", value_parser = parse_service)]
    pub service: Vec<ContainerRequest>,
    /// Service NAME's main process: COMMAND, run by `/bin/sh -c` (repeatable, one per service).
    #[arg(long, value_name = "NAME=COMMAND", value_parser = parse_named)]
    pub service_cmd: Vec<(String, String)>,
    /// The user service NAME's processes run as: a name of its image or a number, with an
    /// optional group (`USER[:GROUP]`, as `docker run --user`) [default: the image's user,
    /// else root]. PostgreSQL, for one, refuses to run as root.
    #[arg(long, value_name = "NAME=USER[:GROUP]", value_parser = parse_named)]
    pub service_user: Vec<(String, String)>,
    /// An environment variable of service NAME (repeatable): `--service-env
    /// db=POSTGRES_PASSWORD=secret`.
    #[arg(long, value_name = "NAME=KEY=VALUE", value_parser = parse_service_env)]
    pub service_env: Vec<(String, String, String)>,
    /// When service NAME counts as ready: `tcp:PORT` (something accepts connections on that
    /// loopback port) or `cmd:COMMAND` (COMMAND, run in the service by `/bin/sh -c`, exits 0),
    /// within 60 s [default: once its main process has started].
    #[arg(long, value_name = "NAME=tcp:PORT|cmd:COMMAND", value_parser = parse_ready)]
    pub service_ready: Vec<(String, ReadyCheck)>,
    /// Start service NAME's main process again whenever it fails (repeatable).
    #[arg(long, value_name = "NAME")]
    pub service_restart: Vec<String>,
    /// A directory shared by the job and every service, empty at first, mounted at PATH in
    /// each (repeatable): a Kubernetes emptyDir.
    #[arg(long, value_name = "NAME:PATH", value_parser = parse_shared)]
    pub shared: Vec<SharedMount>,
}

fn parse_service(text: &str) -> Result<ContainerRequest, String> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=IMAGE, got {text:?}"))?;
    let (image, command) = split_image_and_command(rest);
    if name.is_empty() || image.is_empty() {
        return Err(format!("expected NAME=IMAGE, got {text:?}"));
    }
    Ok(ContainerRequest {
        name: name.to_string(),
        image: Some(image.to_string()),
        command: command.map(shell_command),
        ..ContainerRequest::default()
    })
}

/// `IMAGE`, or the older `IMAGE:CMD`: what follows a `:` is a command only when it holds
/// whitespace, which no image name does (`postgres:16`, `localhost:5000/pg:16` are images).
fn split_image_and_command(text: &str) -> (&str, Option<&str>) {
    match text.split_once(':') {
        Some((image, command)) if command.contains(char::is_whitespace) => (image, Some(command)),
        _ => (text, None),
    }
}

fn shell_command(command: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), command.to_string()]
}

/// `NAME=VALUE` of the per-service flags; VALUE may hold `=` and `:`.
fn parse_named(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() => {
            Ok((name.to_string(), value.to_string()))
        }
        _ => Err(format!("expected NAME=VALUE, got {text:?}")),
    }
}

fn parse_service_env(text: &str) -> Result<(String, String, String), String> {
    let expected = || format!("expected NAME=KEY=VALUE, got {text:?}");
    let (name, variable) = text.split_once('=').ok_or_else(expected)?;
    let (key, value) = variable.split_once('=').ok_or_else(expected)?;
    if name.is_empty() || key.is_empty() {
        return Err(expected());
    }
    Ok((name.to_string(), key.to_string(), value.to_string()))
}

fn parse_ready(text: &str) -> Result<(String, ReadyCheck), String> {
    let (name, check) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=tcp:PORT or NAME=cmd:COMMAND, got {text:?}"))?;
    let check = if let Some(port) = check.strip_prefix("tcp:") {
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("tcp:PORT needs a port 1 to 65535, got {port:?}"))?;
        ReadyCheck {
            tcp_port: Some(port),
            ..ReadyCheck::default()
        }
    } else if let Some(command) = check.strip_prefix("cmd:") {
        ReadyCheck {
            command: Some(vec!["/bin/sh".into(), "-c".into(), command.to_string()]),
            ..ReadyCheck::default()
        }
    } else {
        return Err(format!(
            "expected NAME=tcp:PORT or NAME=cmd:COMMAND, got {text:?}"
        ));
    };
    Ok((name.to_string(), check))
}

fn parse_shared(text: &str) -> Result<SharedMount, String> {
    let (name, path) = text
        .split_once(':')
        .ok_or_else(|| format!("expected NAME:PATH, got {text:?}"))?;
    Ok(SharedMount {
        name: name.to_string(),
        path: path.to_string(),
        read_only: false,
    })
}

impl ServiceArgs {
    /// The request's `containers` and its own root's `shared`; a flag naming a service that
    /// was not declared is an error.
    pub(crate) fn containers(&self) -> Result<(Vec<ContainerRequest>, Vec<SharedMount>)> {
        let mut containers = self.service.clone();
        for (name, check) in &self.service_ready {
            named(&mut containers, "service-ready", name)?.ready = Some(check.clone());
        }
        for name in &self.service_restart {
            named(&mut containers, "service-restart", name)?.restart = RestartPolicy::OnFailure;
        }
        for (name, command) in &self.service_cmd {
            let service = named(&mut containers, "service-cmd", name)?;
            if service.command.is_some() {
                anyhow::bail!("service {name} has two commands (--service-cmd and NAME=IMAGE:CMD)");
            }
            service.command = Some(shell_command(command));
        }
        for (name, user) in &self.service_user {
            named(&mut containers, "service-user", name)?.user = Some(user.clone());
        }
        for (name, key, value) in &self.service_env {
            named(&mut containers, "service-env", name)?
                .env
                .insert(key.clone(), value.clone());
        }
        for service in &mut containers {
            service.shared = self.shared.clone();
        }
        Ok((containers, self.shared.clone()))
    }
}

/// The declared service `name`, for flag `--flag`.
fn named<'a>(
    containers: &'a mut [ContainerRequest],
    flag: &str,
    name: &str,
) -> Result<&'a mut ContainerRequest> {
    containers
        .iter_mut()
        .find(|c| c.name == name)
        .with_context(|| format!("--{flag} {name}…: no --service {name}=…"))
}

/// `crucible sandbox add ID --service …`: adds each service to the running sandbox, in order,
/// printing each one's name once it is ready (its JSON with `json`).
pub(crate) async fn add(
    global: &Global,
    id: &str,
    services: &ServiceArgs,
    json: bool,
) -> Result<()> {
    if services.service.is_empty() {
        anyhow::bail!("name at least one --service NAME=IMAGE to add");
    }
    let (containers, _) = services.containers()?;
    let client = global.client()?;
    for container in &containers {
        let info = client
            .add_container(id, container)
            .await
            .with_context(|| format!("adding container {} to sandbox {id}", container.name))?;
        if json {
            println!("{}", serde_json::to_string(&info)?);
        } else {
            println!("{}", output::escape(&info.name));
        }
    }
    Ok(())
}

/// Hands each stdout and stderr payload of a container's log to `on_output`, in order.
fn read_log(frames: &[u8], mut on_output: impl FnMut(FrameType, &[u8])) -> Result<()> {
    // A running container's log has no exit frame yet, so this reads frames rather than a
    // whole response stream.
    let mut decoder = wire::Decoder::new(wire::Direction::GuestToHost);
    decoder.push(frames);
    while let Some(frame) = decoder
        .next_frame()
        .context("the daemon sent a log that is not a frame stream")?
    {
        if matches!(frame.frame_type, FrameType::Stdout | FrameType::Stderr) {
            on_output(frame.frame_type, frame.payload);
        }
    }
    if decoder.buffered() != 0 {
        anyhow::bail!("the daemon sent a log that ends in half a frame");
    }
    Ok(())
}

/// `crucible sandbox logs ID CONTAINER`: its main process's stdout to stdout, its stderr to
/// stderr.
pub(crate) async fn logs(global: &Global, id: &str, container: &str) -> Result<()> {
    use std::io::Write;
    let frames = global.client()?.container_logs(id, container).await?;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    read_log(&frames, |kind, payload| match kind {
        FrameType::Stderr => stderr.extend_from_slice(payload),
        _ => stdout.extend_from_slice(payload),
    })?;
    std::io::stdout()
        .write_all(&stdout)
        .context("writing the log")?;
    std::io::stderr()
        .write_all(&stderr)
        .context("writing the log")?;
    Ok(())
}

/// Writes each of sandbox `id`'s containers' logs to `dir/NAME.log` (stdout and stderr as
/// they came, in order), for `crucible run --service-logs DIR`; returns why each log that
/// could not be written was not. Fails, writing nothing, when the daemon does not list the
/// containers or names one with what is not a container's name ([`UntrustedNames`]): a file
/// name made of it could lead anywhere (`../../x`, `/etc/x`), and this may run as root.
pub(crate) async fn save_logs(
    client: &client::Client,
    id: &str,
    dir: &Path,
) -> Result<Vec<anyhow::Error>> {
    let containers = client.containers(id).await?;
    let untrusted: Vec<String> = containers
        .iter()
        .filter(|c| !contract::cmdline::is_valid_name(&c.name))
        .map(|c| c.name.clone())
        .collect();
    if !untrusted.is_empty() {
        return Err(UntrustedNames(untrusted).into());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut failed = Vec::new();
    for container in &containers {
        let path = dir.join(format!("{}.log", container.name));
        let saved = async {
            let frames = client.container_logs(id, &container.name).await?;
            let mut text = Vec::new();
            read_log(&frames, |_, payload| text.extend_from_slice(payload))?;
            write_log(&path, &text)
        };
        if let Err(e) = saved.await {
            failed.push(e.context(format!("{}.log", container.name)));
        }
    }
    Ok(failed)
}

/// Containers the daemon named with what is not a container's name: the daemon's own rule
/// (`contract::cmdline::is_valid_name`, which the API checks every name it takes by) is
/// what makes a name safe to make a file name of.
#[derive(Debug)]
pub(crate) struct UntrustedNames(Vec<String>);

impl fmt::Display for UntrustedNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.0.iter().map(|name| format!("{name:?}")).collect();
        let (named, are_not) = match names.len() {
            1 => ("a container named", "is not a container name"),
            _ => ("containers named", "are not container names"),
        };
        write!(
            f,
            "the daemon reported {named} {}, which {are_not} (1 to 63 of a-z, 0-9 and -, \
             starting and ending with a letter or a digit): no log was written",
            names.join(", ")
        )
    }
}

impl std::error::Error for UntrustedNames {}

/// Writes `text` to the log file `path`, made if it is not there, but never through a
/// symbolic link (`O_NOFOLLOW`: the open fails), nor to anything but a regular file of one
/// link: what is already where a log goes may have been planted there, and this may run as
/// root. `O_NONBLOCK` makes a FIFO's open fail rather than wait for a reader; a regular file
/// ignores it.
fn write_log(path: &Path, text: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) && is_symlink(path) => {
            anyhow::bail!("refusing to write the log: it is a symbolic link")
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            anyhow::bail!("refusing to write the log: it is not a regular file")
        }
        Err(e) => return Err(anyhow::Error::new(e).context("opening the log")),
    };
    let metadata = file.metadata().context("opening the log")?;
    if !metadata.is_file() {
        anyhow::bail!("refusing to write the log: it is not a regular file");
    }
    if metadata.nlink() > 1 {
        anyhow::bail!(
            "refusing to write the log: it has {} hard links",
            metadata.nlink()
        );
    }
    file.set_len(0).context("emptying the log")?;
    file.write_all(text).context("writing the log")?;
    Ok(())
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_flags_become_containers() {
        let db = parse_service("db=default:nc -l -p 5432").expect("service");
        assert_eq!(db.image.as_deref(), Some("default"));
        assert_eq!(
            db.command,
            Some(vec!["/bin/sh".into(), "-c".into(), "nc -l -p 5432".into()])
        );
        let bare = parse_service("cache=redis").expect("no command");
        assert_eq!(bare.command, None);
        for image in [
            "postgres:16",
            "localhost:5000/pg:16",
            "pg@sha256:0123",
            "reg:5000/pg",
        ] {
            let tagged = parse_service(&format!("db={image}")).expect("an image name");
            assert_eq!(
                (tagged.image.as_deref(), tagged.command),
                (Some(image), None)
            );
        }
        for bad in ["db", "=x", "db=", "db=:cmd x"] {
            assert!(parse_service(bad).is_err(), "{bad}");
        }
        let (name, check) = parse_ready("db=tcp:5432").expect("tcp");
        assert_eq!((name.as_str(), check.tcp_port), ("db", Some(5432)));
        assert!(parse_ready("db=tcp:0").is_err());
        assert!(parse_ready("db=udp:53").is_err());
        let pg = parse_service("pg=postgres:16").expect("tagged");
        let args = ServiceArgs {
            service: vec![db, pg],
            service_ready: vec![(name, check)],
            service_restart: vec!["db".into()],
            service_cmd: vec![parse_named("pg=postgres -c fsync=off").expect("cmd")],
            service_user: vec![parse_named("pg=postgres:postgres").expect("user")],
            service_env: vec![parse_service_env("pg=POSTGRES_PASSWORD=a=b").expect("env")],
            shared: vec![parse_shared("work:/work").expect("shared")],
        };
        let (containers, shared) = args.containers().expect("containers");
        assert_eq!(containers[0].restart, RestartPolicy::OnFailure);
        assert_eq!(
            containers[0].ready.as_ref().and_then(|r| r.tcp_port),
            Some(5432)
        );
        assert_eq!(containers[0].shared, shared);
        let pg = &containers[1];
        assert_eq!(pg.command, Some(shell_command("postgres -c fsync=off")));
        assert_eq!(pg.user.as_deref(), Some("postgres:postgres"));
        assert_eq!(
            pg.env.get("POSTGRES_PASSWORD").map(String::as_str),
            Some("a=b")
        );
        assert!(parse_service_env("pg=NOVALUE").is_err());
        assert!(parse_named("pg=").is_err());
        let twice = ServiceArgs {
            service: vec![parse_service("db=default:sleep 1").expect("legacy")],
            service_cmd: vec![("db".into(), "sleep 2".into())],
            ..ServiceArgs::default()
        };
        let e = twice.containers().expect_err("two commands").to_string();
        assert!(e.contains("two commands"), "{e}");
        let unknown = ServiceArgs {
            service_restart: vec!["web".into()],
            ..ServiceArgs::default()
        };
        let e = unknown.containers().expect_err("unknown").to_string();
        assert!(e.contains("no --service web"), "{e}");
    }

    #[test]
    fn a_log_is_written_to_a_file_of_its_own_never_through_what_was_planted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("db.log");
        write_log(&log, b"first run, a longer log\n").expect("a new file");
        write_log(&log, b"second\n").expect("the same file again");
        assert_eq!(std::fs::read(&log).expect("read"), b"second\n");

        let target = dir.path().join("target");
        std::fs::write(&target, "precious\n").expect("write");
        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let dangling = dir.path().join("dangling.log");
        std::os::unix::fs::symlink(dir.path().join("made-by-following"), &dangling)
            .expect("symlink");
        let hard = dir.path().join("hard.log");
        std::fs::hard_link(&target, &hard).expect("hard link");
        let fifo = dir.path().join("fifo.log");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let subdir = dir.path().join("dir.log");
        std::fs::create_dir(&subdir).expect("mkdir");
        for (path, why) in [
            (&link, "it is a symbolic link"),
            (&dangling, "it is a symbolic link"),
            (&hard, "it has 2 hard links"),
            (&fifo, "it is not a regular file"),
            (&subdir, "Is a directory"),
        ] {
            let e = write_log(path, b"pwned\n").expect_err("refused");
            let e = report::chain(e.as_ref());
            assert!(e.contains(why), "{}: {e}", path.display());
        }
        assert_eq!(std::fs::read(&target).expect("read"), b"precious\n");
        assert!(!dir.path().join("made-by-following").exists());
    }

    #[test]
    fn names_that_are_no_container_names_are_quoted_in_the_refusal() {
        let one = UntrustedNames(vec!["../../x".into()]).to_string();
        assert!(
            one.starts_with("the daemon reported a container named \"../../x\", which is not"),
            "{one}"
        );
        let two = UntrustedNames(vec!["/abs/x".into(), "a\x1bb".into()]).to_string();
        assert!(
            two.contains("containers named \"/abs/x\", \"a\\u{1b}b\", which are not"),
            "{two}"
        );
    }

    #[test]
    fn a_log_without_an_exit_frame_is_read_and_half_a_frame_is_refused() {
        let mut frames = Vec::new();
        wire::encode_frames(FrameType::Stdout, b"out ", &mut frames);
        wire::encode_frames(FrameType::Stderr, b"err", &mut frames);
        wire::encode_frames(FrameType::Stdout, b"more", &mut frames);
        let mut seen = Vec::new();
        read_log(&frames, |kind, payload| seen.push((kind, payload.to_vec()))).expect("read");
        assert_eq!(
            seen,
            [
                (FrameType::Stdout, b"out ".to_vec()),
                (FrameType::Stderr, b"err".to_vec()),
                (FrameType::Stdout, b"more".to_vec())
            ]
        );
        let e = read_log(&frames[..frames.len() - 1], |_, _| {}).expect_err("cut");
        assert!(e.to_string().contains("half a frame"), "{e}");
    }
}
