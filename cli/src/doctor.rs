//! `crucible doctor`: what this host offers, which backend will run sandboxes, and whether a
//! daemon answers on the default socket; or, for a daemon named with --host or CRUCIBLE_HOST,
//! what that daemon says of itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use api_types::BackendKind;

use crate::{exit, output, Global};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The image directory to check on this host (unused with --host: the daemon has its own).
    #[arg(long, env = "CRUCIBLE_IMAGE", default_value_os_t = crate::default_image_dir())]
    image: PathBuf,
    /// The hypervisor to check microVM support for on this host, as `crucible serve
    /// --hypervisor` takes it (unused with --host).
    #[arg(long, value_parser = crate::serve::parse_hypervisor, default_value = "crucible-vmm")]
    hypervisor: api_types::Hypervisor,
}

/// How long doctor waits for a daemon's answer: a TCP address whose packets are dropped would
/// otherwise hold it for the kernel's connect timeout, minutes.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Image names shown on the `images:` line; the rest are counted.
const IMAGES_SHOWN: usize = 10;

/// Exits 0 with the report, or 125 when the daemon named with --host cannot be asked.
pub(crate) fn run(args: &Args, global: &Global) -> Result<i32> {
    let client = global.client()?;
    if global.host.is_some() {
        return named_daemon(&client, global.json);
    }
    this_host(args, &client, global.json).map(|()| 0)
}

/// What a daemon said when doctor asked it.
#[derive(Debug)]
enum DaemonAnswer {
    /// It answered `GET /healthz`. `images` is its answer to `GET /images` when asked: unlike
    /// the health check that needs the API key over TCP, so it also tells whether the key is
    /// taken.
    Answered {
        health: Health,
        images: Option<Result<Vec<String>, String>>,
    },
    /// Nothing listens there: no socket file, or the connection was refused.
    NotRunning(String),
    /// It could not be asked for another reason: no permission, no answer in time, an answer
    /// that is not a crucible daemon's.
    Failed(String),
}

/// What `GET /healthz` says. Every field may be missing: a daemon of another version may say
/// less, and a stranger answering on the port anything.
#[derive(Debug, Default, PartialEq, serde::Deserialize)]
struct Health {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    sandboxes: Option<u64>,
    #[serde(default)]
    default_backend: Option<String>,
}

/// Asks the daemon `client` talks to for its health and, with `with_images`, its images.
async fn ask(client: &client::Client, with_images: bool) -> DaemonAnswer {
    let health = match tokio::time::timeout(ANSWER_WAIT, client.health()).await {
        Err(_) => {
            return DaemonAnswer::Failed(format!("no answer within {} s", ANSWER_WAIT.as_secs()))
        }
        Ok(Err(error)) => return no_answer(&error),
        Ok(Ok(health)) => health,
    };
    let health = match serde_json::from_value::<Health>(health) {
        Ok(health) => health,
        Err(e) => {
            return DaemonAnswer::Failed(format!(
                "its answer to GET /healthz is not a crucible daemon's: {e}"
            ))
        }
    };
    let images = if with_images {
        Some(
            match tokio::time::timeout(ANSWER_WAIT, client.images()).await {
                Err(_) => Err(format!(
                    "no answer to GET /images within {} s",
                    ANSWER_WAIT.as_secs()
                )),
                Ok(Err(error)) => Err(images_refusal(&error)),
                Ok(Ok(images)) => Ok(images.into_iter().map(|image| image.name).collect()),
            },
        )
    } else {
        None
    };
    DaemonAnswer::Answered { health, images }
}

/// Why no daemon answered: nothing there, or something that could not be asked. The address
/// is shown beside it, so a connection error's own words are enough.
fn no_answer(error: &client::ClientError) -> DaemonAnswer {
    match error {
        client::ClientError::Connect { source, .. } => {
            let words = report::chain(source);
            match source.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    DaemonAnswer::NotRunning(words)
                }
                _ => DaemonAnswer::Failed(words),
            }
        }
        // A crucible daemon answers `/healthz` to anyone, without a key: an error status
        // comes from something else listening there (another server, a proxy).
        client::ClientError::Api {
            status,
            code,
            message,
        } => DaemonAnswer::Failed(format!(
            "GET /healthz was answered HTTP {status} ({code}){}: not a crucible daemon",
            if message.is_empty() {
                String::new()
            } else {
                format!(", {message:?}")
            }
        )),
        other => DaemonAnswer::Failed(report::chain(other)),
    }
}

/// Why `GET /images` failed, with what to do when the daemon refused the key.
fn images_refusal(error: &client::ClientError) -> String {
    let words = report::chain(error);
    match error {
        client::ClientError::Api { status: 401, .. } => {
            format!("{words}; give this daemon's key with --api-key or CRUCIBLE_API_KEY")
        }
        _ => words,
    }
}

impl DaemonAnswer {
    fn default_backend(&self) -> Option<&str> {
        match self {
            DaemonAnswer::Answered { health, .. } => health.default_backend.as_deref(),
            _ => None,
        }
    }

    /// The `daemon` object of `--json`, its text exact (unescaped).
    fn to_json(&self, address: &str) -> serde_json::Value {
        match self {
            DaemonAnswer::Answered { health, images } => {
                let mut value = serde_json::json!({
                    "address": address,
                    "reachable": true,
                    "status": health.status,
                    "sandboxes": health.sandboxes,
                    "default_backend": health.default_backend,
                });
                match images {
                    Some(Ok(names)) => value["images"] = serde_json::json!(names),
                    Some(Err(error)) => value["images_error"] = serde_json::json!(error),
                    None => {}
                }
                value
            }
            DaemonAnswer::NotRunning(error) => serde_json::json!({
                "address": address,
                "reachable": false,
                "running": false,
                "error": error,
            }),
            DaemonAnswer::Failed(error) => serde_json::json!({
                "address": address,
                "reachable": false,
                "error": error,
            }),
        }
    }
}

/// The `daemon:` line: whether the daemon at `address` answers, or why not. What a daemon
/// says is shown escaped, as everywhere a terminal shows it.
fn daemon_line(address: &str, answer: &DaemonAnswer) -> String {
    match answer {
        DaemonAnswer::Answered { health, .. } => match &health.status {
            Some(status) => format!(
                "daemon:            {address} answers (status {})",
                output::escape(status)
            ),
            None => format!("daemon:            {address} answers"),
        },
        DaemonAnswer::NotRunning(error) | DaemonAnswer::Failed(error) => format!(
            "daemon:            cannot reach {address}: {}",
            output::escape(error)
        ),
    }
}

/// The `daemon:` line for the default socket, where no daemon is no fault: `crucible run`
/// then starts its own.
fn local_daemon_line(address: &str, answer: &DaemonAnswer) -> String {
    match answer {
        // Nothing at the path, or nothing listening: the error's words would only repeat it.
        DaemonAnswer::NotRunning(_) => format!(
            "daemon:            none at {address} (`crucible serve` starts one, `crucible \
             run` its own)"
        ),
        _ => daemon_line(address, answer),
    }
}

/// The `sandboxes will use:` text for a daemon that answered: its default backend.
fn daemon_verdict(default_backend: Option<&str>, whose: &str) -> String {
    match default_backend {
        Some(backend) => format!("{} ({whose} default backend)", output::escape(backend)),
        None => format!("what {whose} default is (it does not say)"),
    }
}

/// Which backend sandboxes will use on this host, and on whose word.
#[derive(Debug, PartialEq)]
enum Verdict<'a> {
    /// The running daemon's default backend (`None`: it does not say).
    Daemon(Option<&'a str>),
    /// What a daemon started here would use: `crucible serve`, or `crucible run`'s own.
    ThisHost(BackendKind),
    /// No daemon runs, and one started here could run no sandbox.
    Nothing,
}

impl Verdict<'_> {
    /// A daemon that answers on the default socket is what client commands talk to, so its
    /// default backend is the answer, whatever this host's checks found (they are of the
    /// image under the current directory, which need not be the daemon's).
    fn on_this_host(daemon: &DaemonAnswer, usable: Option<BackendKind>) -> Verdict<'_> {
        match (daemon, usable) {
            (DaemonAnswer::Answered { health, .. }, _) => {
                Verdict::Daemon(health.default_backend.as_deref())
            }
            (_, Some(backend)) => Verdict::ThisHost(backend),
            (_, None) => Verdict::Nothing,
        }
    }

    /// `default_backend` of `--json`, exact.
    fn json_name(&self) -> String {
        match self {
            Verdict::Daemon(Some(backend)) => backend.to_string(),
            Verdict::Daemon(None) => "unknown".to_string(),
            Verdict::ThisHost(backend) => backend.to_string(),
            Verdict::Nothing => "none".to_string(),
        }
    }

    /// The text after `sandboxes will use:`; `image` is the directory this host's checks
    /// looked at, named when they found nothing usable but a daemon runs sandboxes anyway.
    fn text(&self, usable_here: bool, image: &Path) -> String {
        match self {
            Verdict::Daemon(backend) => {
                let theirs = daemon_verdict(*backend, "the running daemon's");
                if usable_here {
                    theirs
                } else {
                    format!(
                        "{theirs}; the checks above are of the image at {}, not the daemon's",
                        image.display()
                    )
                }
            }
            Verdict::ThisHost(backend) => backend.to_string(),
            Verdict::Nothing => "nothing works yet (see above)".to_string(),
        }
    }
}

/// The report on a daemon named with --host, one line each.
fn named_daemon_lines(address: &str, answer: &DaemonAnswer) -> Vec<String> {
    let mut lines = vec![daemon_line(address, answer)];
    let DaemonAnswer::Answered { health, images } = answer else {
        return lines;
    };
    if let Some(count) = health.sandboxes {
        lines.push(format!("sandboxes:         {count}"));
    }
    match images {
        Some(Ok(names)) => lines.push(format!("images:            {}", image_names(names))),
        Some(Err(error)) => lines.push(format!(
            "images:            not listed: {}",
            output::escape(error)
        )),
        None => {}
    }
    lines.push(format!(
        "sandboxes will use: {}",
        daemon_verdict(health.default_backend.as_deref(), "the daemon's")
    ));
    lines
}

/// Up to [`IMAGES_SHOWN`] names, escaped, and how many more.
fn image_names(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    let shown: Vec<String> = names
        .iter()
        .take(IMAGES_SHOWN)
        .map(|name| output::escape(name).into_owned())
        .collect();
    match names.len().saturating_sub(IMAGES_SHOWN) {
        0 => shown.join(", "),
        more => format!("{}, and {more} more", shown.join(", ")),
    }
}

/// Asks the daemon the user named, and only it: this host's features, or an image under the
/// current directory, say nothing of a daemon on another machine or one started with another
/// --image.
fn named_daemon(client: &client::Client, json: bool) -> Result<i32> {
    let answer = crate::runtime()?.block_on(ask(client, true));
    let address = client.endpoint().to_string();
    if json {
        output::print_json(&serde_json::json!({
            "daemon": answer.to_json(&address),
            "default_backend": answer.default_backend().unwrap_or("none"),
        }))?;
    } else {
        for line in named_daemon_lines(&address, &answer) {
            println!("{line}");
        }
    }
    Ok(match answer {
        DaemonAnswer::Answered { .. } => 0,
        _ => exit::CRUCIBLE_ERROR,
    })
}

/// This host as a daemon started here would see it, and the daemon on the default socket.
fn this_host(args: &Args, client: &client::Client, json: bool) -> Result<()> {
    let image = &args.image;
    // The daemon's own view, so doctor and `serve` can never disagree.
    let mut config = api::ServeConfig::new(image.clone());
    config.engine.hypervisor = args.hypervisor;
    let state = engine::Engine::new(config.engine);
    let report = state.host().clone();
    let agent = image.join("rootfs/init");
    let kernel = image.join("vmlinux");
    let microvm = state.unavailable_reason(BackendKind::Microvm);
    let namespace = state.unavailable_reason(BackendKind::Namespace);
    let chosen = state.default_backend();
    let usable = state.unavailable_reason(chosen).is_none();
    let storage = engine::storage::HostSupport::inspect();
    let daemon = crate::runtime()?.block_on(ask(client, false));
    let address = client.endpoint().to_string();
    let verdict = Verdict::on_this_host(&daemon, usable.then_some(chosen));
    if json {
        let value = serde_json::json!({
            "host": report,
            "image": {"dir": image, "agent": agent.is_file(), "kernel": kernel.is_file()},
            "backends": {
                "microvm": {
                    "available": microvm.is_none(),
                    "reason": microvm,
                    "hypervisor": args.hypervisor,
                },
                "namespace": {"available": namespace.is_none(), "reason": namespace},
            },
            "default_backend": verdict.json_name(),
            "storage": {"host": storage, "problem": storage.problem()},
            "daemon": daemon.to_json(&address),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    // The same probe and words as `crucible-vmm --host-info`.
    println!("KVM:               {}", report.kvm.describe());
    println!(
        "cgroups:           {}",
        match report.cgroup_version {
            2 => "v2 (unified)",
            1 => "v1 controllers",
            _ => "none mounted",
        }
    );
    println!(
        "user namespaces:   {}",
        if report.user_namespaces { "yes" } else { "no" }
    );
    println!(
        "running as root:   {}",
        if report.root { "yes" } else { "no" }
    );
    println!(
        "image:             {} (agent {}, kernel {})",
        image.display(),
        if agent.is_file() {
            "present"
        } else {
            "missing"
        },
        if kernel.is_file() {
            "present"
        } else {
            "missing"
        }
    );
    println!(
        "caches and disks:  {}",
        match storage.problem() {
            None => format!(
                "yes (mkfs.ext4 at {}, loop devices)",
                storage
                    .mkfs_ext4
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            Some(problem) => format!("no: {problem}"),
        }
    );
    let microvm_name = format!("microvm ({})", args.hypervisor);
    for (name, reason) in [(microvm_name.as_str(), &microvm), ("namespace", &namespace)] {
        match reason {
            None => println!("{name} backend: available"),
            Some(reason) => println!("{name} backend: unavailable: {reason}"),
        }
    }
    println!("{}", local_daemon_line(&address, &daemon));
    println!("sandboxes will use: {}", verdict.text(usable, image));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(
        backend: Option<&str>,
        images: Option<Result<Vec<String>, String>>,
    ) -> DaemonAnswer {
        DaemonAnswer::Answered {
            health: Health {
                status: Some("ok".into()),
                sandboxes: Some(2),
                default_backend: backend.map(String::from),
            },
            images,
        }
    }

    fn connect_error(kind: std::io::ErrorKind) -> client::ClientError {
        client::ClientError::Connect {
            endpoint: "http://127.0.0.1:9".into(),
            source: std::io::Error::from(kind),
        }
    }

    #[test]
    fn the_daemons_health_answer_is_read_and_anything_else_is_no_daemons() {
        // What `GET /healthz` answers today (api/src/routes.rs), with a field more.
        let health: Health = serde_json::from_value(serde_json::json!({
            "status": "ok", "sandboxes": 3, "default_backend": "microvm", "uptime_s": 9
        }))
        .expect("the daemon's health");
        assert_eq!(health.default_backend.as_deref(), Some("microvm"));
        assert_eq!(health.sandboxes, Some(3));
        let terse: Health = serde_json::from_value(serde_json::json!({})).expect("no fields");
        assert_eq!(terse, Health::default());
        assert!(serde_json::from_value::<Health>(serde_json::json!("ok")).is_err());
        assert!(serde_json::from_value::<Health>(serde_json::json!({"sandboxes": "x"})).is_err());
    }

    #[test]
    fn nothing_listening_is_told_from_a_daemon_that_cannot_be_asked() {
        for kind in [
            std::io::ErrorKind::NotFound,
            std::io::ErrorKind::ConnectionRefused,
        ] {
            assert!(
                matches!(no_answer(&connect_error(kind)), DaemonAnswer::NotRunning(_)),
                "{kind:?}"
            );
        }
        let DaemonAnswer::Failed(words) =
            no_answer(&connect_error(std::io::ErrorKind::PermissionDenied))
        else {
            panic!("permission denied is a daemon that cannot be asked");
        };
        assert!(words.contains("permission denied"), "{words}");
        // Something else on the port: a proxy's 404 is no crucible daemon's answer.
        let DaemonAnswer::Failed(words) = no_answer(&client::ClientError::Api {
            status: 404,
            code: "unknown".into(),
            message: String::new(),
        }) else {
            panic!("an error status is no daemon's answer");
        };
        assert_eq!(
            words,
            "GET /healthz was answered HTTP 404 (unknown): not a crucible daemon"
        );
    }

    #[test]
    fn a_refused_key_says_how_to_give_one() {
        let refusal = images_refusal(&client::ClientError::Api {
            status: 401,
            code: "unauthorized".into(),
            message: "missing or invalid API key".into(),
        });
        assert!(refusal.contains("missing or invalid API key"), "{refusal}");
        assert!(
            refusal.contains("--api-key or CRUCIBLE_API_KEY"),
            "{refusal}"
        );
        let other = images_refusal(&client::ClientError::Http("reset".into()));
        assert!(!other.contains("--api-key"), "{other}");
    }

    #[test]
    fn a_daemon_that_answers_decides_the_backend_never_nothing_works_yet() {
        let image = Path::new("target/crucible/image");
        let daemon = answered(Some("namespace"), None);
        // This directory has no image and this host no KVM, but the daemon runs sandboxes.
        let verdict = Verdict::on_this_host(&daemon, None);
        assert_eq!(verdict, Verdict::Daemon(Some("namespace")));
        assert_eq!(verdict.json_name(), "namespace");
        let text = verdict.text(false, image);
        assert_eq!(
            text,
            "namespace (the running daemon's default backend); the checks above are of the \
             image at target/crucible/image, not the daemon's"
        );
        // The daemon's choice wins over what a daemon started here would take.
        let verdict = Verdict::on_this_host(&daemon, Some(BackendKind::Microvm));
        assert_eq!(
            verdict.text(true, image),
            "namespace (the running daemon's default backend)"
        );
        let silent = answered(None, None);
        assert_eq!(Verdict::on_this_host(&silent, None).json_name(), "unknown");
        // Without a daemon (none there, or none that could be asked): what one started here
        // would use, as before.
        for no_daemon in [
            DaemonAnswer::NotRunning("No such file or directory (os error 2)".into()),
            DaemonAnswer::Failed("Permission denied (os error 13)".into()),
        ] {
            let verdict = Verdict::on_this_host(&no_daemon, Some(BackendKind::Namespace));
            assert_eq!(verdict.text(true, image), "namespace");
            assert_eq!(verdict.json_name(), "namespace");
            let verdict = Verdict::on_this_host(&no_daemon, None);
            assert_eq!(verdict.text(false, image), "nothing works yet (see above)");
            assert_eq!(verdict.json_name(), "none");
        }
    }

    #[test]
    fn a_named_daemon_is_reported_from_its_own_answers() {
        let images = vec!["default".to_string(), "python-3.12".to_string()];
        let lines = named_daemon_lines(
            "http://10.0.0.5:7070",
            &answered(Some("microvm"), Some(Ok(images))),
        );
        assert_eq!(
            lines,
            [
                "daemon:            http://10.0.0.5:7070 answers (status ok)",
                "sandboxes:         2",
                "images:            default, python-3.12",
                "sandboxes will use: microvm (the daemon's default backend)",
            ]
        );
        let refused = named_daemon_lines(
            "http://10.0.0.5:7070",
            &answered(None, Some(Err("missing or invalid API key".into()))),
        );
        assert!(refused
            .contains(&"images:            not listed: missing or invalid API key".to_string()));
        assert!(refused.contains(
            &"sandboxes will use: what the daemon's default is (it does not say)".to_string()
        ));
    }

    #[test]
    fn a_daemon_that_cannot_be_reached_is_named_with_the_error() {
        for answer in [
            DaemonAnswer::NotRunning("Connection refused (os error 111)".into()),
            DaemonAnswer::Failed("Connection refused (os error 111)".into()),
        ] {
            assert_eq!(
                named_daemon_lines("http://10.0.0.5:7070", &answer),
                [
                    "daemon:            cannot reach http://10.0.0.5:7070: Connection refused \
                  (os error 111)"
                ]
            );
        }
        // On the default socket, no daemon is no fault.
        let local = local_daemon_line(
            "unix:/run/crucible/crucible.sock",
            &DaemonAnswer::NotRunning("No such file or directory (os error 2)".into()),
        );
        assert!(
            local.contains("none at unix:/run/crucible/crucible.sock"),
            "{local}"
        );
    }

    #[test]
    fn what_the_daemon_says_is_escaped_on_a_terminal_and_exact_in_json() {
        let hostile = "ok\x1b]0;pwned\x07\nsandboxes will use: nothing";
        let answer = DaemonAnswer::Answered {
            health: Health {
                status: Some(hostile.into()),
                sandboxes: None,
                default_backend: Some(hostile.into()),
            },
            images: Some(Ok(vec![hostile.into()])),
        };
        let lines = named_daemon_lines("unix:/d.sock", &answer);
        for line in &lines {
            assert!(!line.chars().any(char::is_control), "{line:?}");
        }
        assert_eq!(lines.len(), 3, "no forged line: {lines:?}");
        let json = answer.to_json("unix:/d.sock");
        assert_eq!(json["status"], hostile);
        assert_eq!(json["images"][0], hostile);
        assert_eq!(json["reachable"], true);
    }

    #[test]
    fn many_images_are_counted_past_the_first_ten() {
        let names: Vec<String> = (0..13).map(|i| format!("img{i}")).collect();
        let shown = image_names(&names);
        assert!(shown.starts_with("img0, img1,"), "{shown}");
        assert!(shown.ends_with("img9, and 3 more"), "{shown}");
        assert_eq!(image_names(&[]), "none");
    }
}
