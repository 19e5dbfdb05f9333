//! A microVM pod's inbound connections. The VM has no network device in the pod's network
//! namespace, so the daemon listens there on one port and the namespace redirects every TCP
//! connection that arrives — at the pod's IP, or at its `127.0.0.1` (containerd's
//! port-forward) — to it (`namespace::pod_redirect`). Each accepted connection's original
//! port (`SO_ORIGINAL_DST`) is asked of the VM's agent (`connect_tcp`), and the two are
//! relayed. A connection that came to the pod's IP reaches only a service listening on every
//! address, as in a runc pod; the agent's egress proxy port is never reached.

use std::net::SocketAddrV4;
use std::os::fd::AsFd;
use std::sync::{Arc, Weak};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::egress::PodSockets;

/// A sandbox agent's one reply, and the connection it came on, or why not.
pub(crate) type AgentAnswer<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<(wire::agent::AgentReply, tokio::net::UnixStream), String>,
            > + Send
            + 'a,
    >,
>;

/// What the inbound connections are carried to: a sandbox's agent, asked one question on a new
/// connection (the sandbox implements it; this module knows no more of it).
pub(crate) trait AgentDialer: Send + Sync {
    /// Sends `request` to the sandbox's own agent and reads its one reply, with a deadline;
    /// the connection is returned for a reply that starts a stream.
    fn ask(&self, request: wire::agent::AgentRequest) -> AgentAnswer<'_>;
}

/// The most inbound connections one sandbox relays at once; past it a new one is closed as
/// soon as it is accepted (the pod's network may be anyone's to connect from).
pub const MAX_INBOUND_CONNECTIONS: usize = 256;

/// How many connections may wait in the listener's backlog.
const BACKLOG: i32 = 128;

/// Why a pod's inbound connections could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    /// The daemon's listener in the pod's namespace could not be made.
    #[error("pod network {path}: listening in it for the pod's inbound connections")]
    Listen {
        /// The pod's namespace.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The redirect to that listener could not be put in place.
    #[error(transparent)]
    Redirect(#[from] ::namespace::pod_redirect::PodRedirectError),
}

/// The daemon's end of one sandbox's inbound connections: its listener's task (which owns
/// the relays) and the redirect in the pod's namespace, both undone by [`PodInbound::close`].
#[derive(Debug)]
pub struct PodInbound {
    pod: Arc<PodSockets>,
    port: u16,
    accepting: JoinHandle<()>,
}

impl PodInbound {
    /// Listens in `pod`'s namespace, redirects its inbound TCP there, and relays each
    /// connection to `sandbox`'s agent from then on (never keeping it alive).
    pub(crate) async fn start(
        pod: Arc<PodSockets>,
        sandbox: Weak<dyn AgentDialer>,
    ) -> Result<PodInbound, InboundError> {
        let in_pod = pod.clone();
        let (listener, port) = tokio::task::spawn_blocking(move || listen(&in_pod))
            .await
            .map_err(|e| InboundError::Listen {
                path: pod.path().display().to_string(),
                source: std::io::Error::other(e.to_string()),
            })??;
        let in_pod = pod.clone();
        tokio::task::spawn_blocking(move || ::namespace::pod_redirect::install(&in_pod, port))
            .await
            .map_err(|e| InboundError::Listen {
                path: pod.path().display().to_string(),
                source: std::io::Error::other(e.to_string()),
            })??;
        let accepting = tokio::spawn(accept(listener, sandbox));
        Ok(PodInbound {
            pod,
            port,
            accepting,
        })
    }

    /// Stops accepting, ends the relays under way and takes the redirect out of the pod's
    /// namespace (a later sandbox in the same pod puts its own first).
    pub(crate) async fn close(self) {
        self.accepting.abort();
        let (pod, port) = (self.pod.clone(), self.port);
        let removed =
            tokio::task::spawn_blocking(move || ::namespace::pod_redirect::remove(&pod, port))
                .await;
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("{}", report::chain(&e)),
            Err(e) => tracing::warn!("removing a pod's inbound redirect: {e}"),
        }
    }
}

impl Drop for PodInbound {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// A listening socket of the pod's namespace on an ephemeral port of every IPv4 address.
fn listen(pod: &PodSockets) -> Result<(TcpListener, u16), InboundError> {
    let fail = |source| InboundError::Listen {
        path: pod.path().display().to_string(),
        source,
    };
    let socket = socket2::Socket::from(pod.tcp_socket(false).map_err(fail)?);
    let any = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    socket.bind(&any.into()).map_err(fail)?;
    socket.listen(BACKLOG).map_err(fail)?;
    let listener = std::net::TcpListener::from(socket);
    let port = listener.local_addr().map_err(fail)?.port();
    let listener = TcpListener::from_std(listener).map_err(fail)?;
    Ok((listener, port))
}

/// Accepts until aborted; the relays are this task's, and end with it.
async fn accept(listener: TcpListener, sandbox: Weak<dyn AgentDialer>) {
    let limit = Arc::new(Semaphore::new(MAX_INBOUND_CONNECTIONS));
    let mut relays = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = relays.join_next(), if !relays.is_empty() => continue,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors, say: back off rather than spin, and keep serving.
                tracing::debug!("a pod's inbound listener: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            tracing::debug!(
                "a pod's inbound connection closed: {MAX_INBOUND_CONNECTIONS} already relayed"
            );
            continue;
        };
        let sandbox = sandbox.clone();
        relays.spawn(async move {
            let _permit = permit;
            if let Err(why) = relay(tcp, sandbox).await {
                tracing::debug!("a pod's inbound connection: {why}");
            }
        });
    }
}

/// Has the sandbox's agent connect to the port `tcp` was meant for, then relays the two.
async fn relay(mut tcp: TcpStream, sandbox: Weak<dyn AgentDialer>) -> Result<(), String> {
    let asked = original_destination(&tcp)?;
    let request = wire::agent::AgentRequest::ConnectTcp {
        port: asked.port(),
        wildcard_only: !asked.ip().is_loopback(),
    };
    let Some(sandbox) = sandbox.upgrade() else {
        return Err("its sandbox is gone".into());
    };
    let answer = sandbox.ask(request).await;
    // The relay must not keep a deleted sandbox alive.
    drop(sandbox);
    match answer {
        Ok((wire::agent::AgentReply::Connected, mut agent)) => {
            tokio::io::copy_bidirectional(&mut tcp, &mut agent)
                .await
                .map(drop)
                .map_err(|e| format!("to {asked}: {e}"))
        }
        Ok((wire::agent::AgentReply::Error(body), _)) => {
            Err(format!("to {asked}: {}", body.message))
        }
        Ok((other, _)) => Err(format!("to {asked}: the agent answered {other:?}")),
        Err(e) => Err(format!("to {asked}: {e}")),
    }
}

/// Where `tcp` was going before the pod's namespace redirected it.
fn original_destination(tcp: &TcpStream) -> Result<SocketAddrV4, String> {
    let raw = nix::sys::socket::getsockopt(&tcp.as_fd(), nix::sys::socket::sockopt::OriginalDst)
        .map_err(|e| format!("SO_ORIGINAL_DST: {e}"))?;
    let ip = std::net::Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr));
    Ok(SocketAddrV4::new(ip, u16::from_be(raw.sin_port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A network namespace of its own (util-linux's `unshare`, as root), with `lo` up, held
    /// by a process that ends with the test.
    struct OtherNamespace {
        holder: std::process::Child,
        pod: Arc<PodSockets>,
    }

    impl OtherNamespace {
        fn new() -> OtherNamespace {
            let mut holder = std::process::Command::new("unshare")
                .args(["--net", "sleep", "60"])
                .spawn()
                .expect("unshare --net sleep");
            let path = format!("/proc/{}/ns/net", holder.id());
            // Until unshare has executed sleep, its namespace is still ours.
            for _ in 0..200 {
                if let Ok(pod) = PodSockets::open(std::path::Path::new(&path)) {
                    let up = pod
                        .run(std::process::Command::new("ip").args(["link", "set", "lo", "up"]))
                        .expect("ip link set lo up");
                    assert!(up.status.success(), "{up:?}");
                    return OtherNamespace {
                        holder,
                        pod: Arc::new(pod),
                    };
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = holder.kill();
            let _ = holder.wait();
            panic!("{path} was never another namespace");
        }

        fn nat_rules(&self) -> String {
            let out = self
                .pod
                .run(std::process::Command::new("iptables").args(["-w", "5", "-t", "nat", "-S"]))
                .expect("iptables -S");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    }

    impl Drop for OtherNamespace {
        fn drop(&mut self) {
            let _ = self.holder.kill();
            let _ = self.holder.wait();
        }
    }

    #[tokio::test]
    async fn a_connection_in_the_pods_namespace_reaches_the_listener_with_its_port() {
        let other = OtherNamespace::new();
        let (listener, port) = listen(&other.pod).expect("a listener in the namespace");
        let pod = other.pod.clone();
        tokio::task::spawn_blocking(move || ::namespace::pod_redirect::install(&pod, port))
            .await
            .expect("join")
            .expect("the redirect");
        let rules = other.nat_rules();
        assert!(
            rules.contains(&format!(
                "-A PREROUTING -p tcp -j REDIRECT --to-ports {port}"
            )) && rules.contains(&format!(
                "-A OUTPUT -o lo -p tcp -j REDIRECT --to-ports {port}"
            )),
            "{rules}"
        );
        // As containerd's port-forward dials it: 127.0.0.1:PORT inside the namespace.
        let socket = socket2::Socket::from(other.pod.tcp_socket(false).expect("a socket"));
        socket.set_nonblocking(false).expect("blocking");
        let asked = std::net::SocketAddr::from(([127, 0, 0, 1], 4567));
        let dialing = std::thread::spawn(move || socket.connect(&asked.into()).map(|_| socket));
        let (accepted, _) =
            tokio::time::timeout(std::time::Duration::from_secs(10), listener.accept())
                .await
                .expect("accepted within 10 s")
                .expect("accept");
        assert_eq!(
            original_destination(&accepted).expect("SO_ORIGINAL_DST"),
            SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 4567)
        );
        dialing.join().expect("join").expect("connected");
        // The host's own namespace was never touched.
        let ours = std::process::Command::new("iptables")
            .args(["-w", "5", "-t", "nat", "-S"])
            .output()
            .expect("iptables -S here");
        assert!(
            !String::from_utf8_lossy(&ours.stdout).contains(&format!("--to-ports {port}")),
            "the host's nat table has the pod's redirect"
        );
        let pod = other.pod.clone();
        tokio::task::spawn_blocking(move || ::namespace::pod_redirect::remove(&pod, port))
            .await
            .expect("join")
            .expect("removed");
        let rules = other.nat_rules();
        assert!(!rules.contains("REDIRECT"), "{rules}");
    }
}
