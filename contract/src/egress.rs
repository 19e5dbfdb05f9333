//! Egress: where a sandbox's proxy listens, and how its connections reach the daemon.

/// The port of the proxy the agent serves on the sandbox's loopback (127.0.0.1), Squid's
/// customary one.
pub const PROXY_PORT: u16 = 3128;

/// The host vsock port a microVM's agent connects to for each proxied connection.
pub const VSOCK_PORT: u32 = 1026;

/// The proxy's URL, as commands see it.
pub fn proxy_url() -> String {
    format!("http://127.0.0.1:{PROXY_PORT}")
}

/// The environment that points the usual tools (curl, pip, npm, cargo, git, Go) at the proxy:
/// both cases of the names, since tools disagree on which they read; the loopback is never
/// proxied.
pub fn proxy_env() -> Vec<(&'static str, String)> {
    let url = proxy_url();
    let no_proxy = "localhost,127.0.0.1".to_string();
    vec![
        ("HTTP_PROXY", url.clone()),
        ("HTTPS_PROXY", url.clone()),
        ("http_proxy", url.clone()),
        ("https_proxy", url),
        ("NO_PROXY", no_proxy.clone()),
        ("no_proxy", no_proxy),
    ]
}
