//! Which crucible daemon the shim talks to: `CRUCIBLE_HOST` (a Unix socket path, `unix:PATH`
//! or `http://host:port`), default the root daemon's socket; `CRUCIBLE_API_KEY` if set; and
//! how long its `containerd-` images may sit unused (`CRUCIBLE_SHIM_IMAGE_IDLE`). containerd
//! starts shims with its own environment, so these are set on containerd.

/// The root daemon's socket.
pub(crate) const DEFAULT_SOCKET: &str = "/run/crucible/crucible.sock";

/// A client for the daemon the environment names, or why it cannot be made.
pub(crate) fn client_from_env() -> Result<client::Client, String> {
    let host = std::env::var("CRUCIBLE_HOST").unwrap_or_else(|_| DEFAULT_SOCKET.into());
    client_for(&host, std::env::var("CRUCIBLE_API_KEY").ok())
}

/// How long an imported `containerd-` image may go unused before the shim prunes it (at a
/// container's delete): `CRUCIBLE_SHIM_IMAGE_IDLE` in seconds, default a day; `off` never.
pub(crate) fn image_idle_from_env() -> Result<Option<u64>, String> {
    image_idle(std::env::var("CRUCIBLE_SHIM_IMAGE_IDLE").ok().as_deref())
}

/// How long a process whose session broke off waits for the daemon to answer again (a daemon
/// restarted under `--live-restore`) before it is reported lost: `CRUCIBLE_SHIM_RECONNECT` in
/// seconds, default five minutes; `0` never waits.
pub(crate) fn reconnect_from_env() -> Result<std::time::Duration, String> {
    reconnect(std::env::var("CRUCIBLE_SHIM_RECONNECT").ok().as_deref())
}

/// The default of `CRUCIBLE_SHIM_RECONNECT`.
pub(crate) fn reconnect_from_env_default() -> std::time::Duration {
    std::time::Duration::from_secs(DEFAULT_RECONNECT_S)
}

/// Five minutes: room for an upgrade's restart, short enough that a daemon gone for good
/// does not leave containers RUNNING for long.
const DEFAULT_RECONNECT_S: u64 = 300;

fn reconnect(value: Option<&str>) -> Result<std::time::Duration, String> {
    let seconds = match value.map(str::trim) {
        None | Some("") => DEFAULT_RECONNECT_S,
        Some(seconds) => seconds
            .parse()
            .map_err(|_| format!("CRUCIBLE_SHIM_RECONNECT={seconds:?}: expected seconds"))?,
    };
    Ok(std::time::Duration::from_secs(seconds))
}

/// A day: a node that runs an image's pods daily keeps it imported.
const DEFAULT_IMAGE_IDLE_S: u64 = 86_400;

fn image_idle(value: Option<&str>) -> Result<Option<u64>, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(Some(DEFAULT_IMAGE_IDLE_S)),
        Some("off") => Ok(None),
        Some(seconds) => seconds.parse().map(Some).map_err(|_| {
            format!("CRUCIBLE_SHIM_IMAGE_IDLE={seconds:?}: expected seconds or \"off\"")
        }),
    }
}

fn client_for(host: &str, key: Option<String>) -> Result<client::Client, String> {
    let endpoint: client::Endpoint = host
        .parse()
        .map_err(|e| format!("CRUCIBLE_HOST={host:?}: {e}"))?;
    let client = client::Client::new(endpoint);
    Ok(match key.filter(|k| !k.is_empty()) {
        Some(key) => client.with_api_key(key),
        None => client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_idle_is_seconds_a_day_by_default_or_off() {
        assert_eq!(image_idle(None), Ok(Some(86_400)));
        assert_eq!(image_idle(Some("0")), Ok(Some(0)));
        assert_eq!(image_idle(Some(" 3600 ")), Ok(Some(3600)));
        assert_eq!(image_idle(Some("off")), Ok(None));
        assert!(image_idle(Some("1h")).is_err());
    }

    #[test]
    fn reconnect_is_seconds_five_minutes_by_default() {
        use std::time::Duration;
        assert_eq!(reconnect(None), Ok(Duration::from_secs(300)));
        assert_eq!(reconnect(Some("0")), Ok(Duration::ZERO));
        assert_eq!(reconnect(Some(" 30 ")), Ok(Duration::from_secs(30)));
        assert!(reconnect(Some("5m")).is_err());
    }

    #[test]
    fn a_socket_path_or_url_names_the_daemon() {
        let unix = client_for("/run/crucible/crucible.sock", None).expect("a client");
        assert_eq!(
            unix.endpoint(),
            &client::Endpoint::Unix("/run/crucible/crucible.sock".into())
        );
        let tcp = client_for("http://127.0.0.1:7070", Some("k".into())).expect("a client");
        assert_eq!(
            tcp.endpoint(),
            &client::Endpoint::Tcp("127.0.0.1:7070".into())
        );
    }
}
