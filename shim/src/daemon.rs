//! Which crucible daemon the shim talks to: `CRUCIBLE_HOST` (a Unix socket path, `unix:PATH`
//! or `http://host:port`), default the root daemon's socket; `CRUCIBLE_API_KEY` if set.
//! containerd starts shims with its own environment, so these are set on containerd.

/// The root daemon's socket.
pub const DEFAULT_SOCKET: &str = "/run/crucible/crucible.sock";

/// A client for the daemon the environment names, or why it cannot be made.
pub fn client_from_env() -> Result<client::Client, String> {
    let host = std::env::var("CRUCIBLE_HOST").unwrap_or_else(|_| DEFAULT_SOCKET.into());
    client_for(&host, std::env::var("CRUCIBLE_API_KEY").ok())
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
