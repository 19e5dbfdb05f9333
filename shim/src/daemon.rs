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
