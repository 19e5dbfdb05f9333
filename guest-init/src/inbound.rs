//! A microVM pod's inbound connections (`connect_tcp`): the daemon accepts them in the pod's
//! network namespace on the host and asks the agent to connect each to the sandbox's port, as
//! it would have arrived in a runc pod. A connection that came to the pod's IP reaches only a
//! listener on every address; one bound to the loopback alone stays private, as in a runc pod.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use wire::agent::AgentReply;
use wire::ErrorBody;

/// How long connecting to the sandbox's own loopback may take (an answer is immediate unless
/// the listener's backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects to `port` on the sandbox's loopback, answers `connected` on `conn`, and relays
/// the two until both ends are done; or answers why not.
pub fn connect_tcp(mut conn: UnixStream, port: u16, wildcard_only: bool) {
    match connect(port, wildcard_only) {
        Ok(tcp) => {
            if wire::write_message(&mut conn, &AgentReply::Connected).is_ok()
                && conn.flush().is_ok()
            {
                crate::relay::both_ways(tcp, conn, "inbound");
            }
        }
        Err(body) => {
            let _ = wire::write_message(&mut conn, &AgentReply::Error(body));
        }
    }
}

fn connect(port: u16, wildcard_only: bool) -> Result<TcpStream, ErrorBody> {
    if port == contract::egress::PROXY_PORT {
        return Err(ErrorBody::new(
            "permission_denied",
            format!(
                "port {port} is the sandbox's egress proxy, which is never reached from \
                 outside it"
            ),
        ));
    }
    if wildcard_only && !listens_on_every_address(port) {
        return Err(ErrorBody::new(
            "not_found",
            format!(
                "nothing listens on port {port} of every address in the sandbox (a service \
                 bound to its loopback alone is not reached on the pod's address)"
            ),
        ));
    }
    let mut last = None;
    for ip in [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ] {
        match TcpStream::connect_timeout(&SocketAddr::new(ip, port), CONNECT_TIMEOUT) {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ErrorBody::new(
            "not_found",
            format!("nothing listens on port {port} of the sandbox's loopback"),
        ),
        Some(e) => ErrorBody::new(
            "io_error",
            format!("connecting to port {port} of the sandbox's loopback: {e}"),
        ),
        None => ErrorBody::new("io_error", format!("port {port}: no address tried")),
    })
}

/// Whether a TCP socket listens on `port` of `0.0.0.0` or `::`, as `/proc/net/tcp{,6}` list
/// them (the agent's network namespace is the whole guest's).
fn listens_on_every_address(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .map(|text| wildcard_listener_in(&text, port))
            .unwrap_or(false)
    })
}

/// Whether `table` (`/proc/net/tcp` or `tcp6`) has a socket in state `0A` (listen) whose local
/// address is all zeros and whose port is `port`.
fn wildcard_listener_in(table: &str, port: u16) -> bool {
    table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace();
        let (Some(_slot), Some(local), Some(_remote), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        let Some((address, local_port)) = local.split_once(':') else {
            return false;
        };
        state == "0A"
            && u16::from_str_radix(local_port, 16) == Ok(port)
            && !address.is_empty()
            && address.bytes().all(|b| b == b'0')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 101 1 0 100 0 0 10 0
   1: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 102 1 0 100 0 0 10 0
   2: 0100007F:1F92 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 103 1 0 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F93 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 104 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:1F94 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 105 1 0 100 0 0 10 0
";

    #[test]
    fn only_a_listener_on_every_address_counts() {
        assert!(wildcard_listener_in(TCP, 8080), "0.0.0.0:8080 listens");
        assert!(
            !wildcard_listener_in(TCP, 8081),
            "127.0.0.1:8081 is the loopback's alone"
        );
        assert!(
            !wildcard_listener_in(TCP, 8082),
            "an established connection listens not"
        );
        assert!(!wildcard_listener_in(TCP, 9), "nothing on 9");
        assert!(wildcard_listener_in(TCP6, 8083), ":::8083 listens");
        assert!(
            !wildcard_listener_in(TCP6, 8084),
            "::1 is the loopback's alone"
        );
        assert!(!wildcard_listener_in(
            "garbage\nnot a table at all\n: :",
            8080
        ));
    }

    #[test]
    fn a_listener_on_the_loopback_alone_is_refused_to_the_pod_address_not_to_the_loopback() {
        let loopback_only = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = loopback_only.local_addr().expect("addr").port();
        let refused = connect(port, true).expect_err("not on every address");
        assert_eq!(refused.code, "not_found", "{refused:?}");
        connect(port, false).expect("the loopback's own connection");
        let every = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        connect(every.local_addr().expect("addr").port(), true).expect("on every address");
    }

    #[test]
    fn the_egress_proxy_port_is_never_reached_from_outside() {
        let refused = connect(contract::egress::PROXY_PORT, false).expect_err("refused");
        assert_eq!(refused.code, "permission_denied", "{refused:?}");
    }
}
