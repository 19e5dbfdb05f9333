//! Carries one TCP connection's bytes over a stream to the host (a vsock connection), both
//! ways, each side's end of stream passed on as a half-close: egress relays a sandbox's
//! connection out, a microVM pod's inbound connections come in the same way.

use std::io;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use crate::log;

/// Relays `tcp` and `host` both ways until both directions have ended; `what` names the relay
/// in the log.
pub fn both_ways(tcp: TcpStream, host: UnixStream, what: &str) {
    let (Ok(tcp_reader), Ok(host_writer)) = (tcp.try_clone(), host.try_clone()) else {
        log::info(format_args!(
            "{what}: cloning the connection's descriptors failed"
        ));
        return;
    };
    let upstream = std::thread::Builder::new()
        .name(format!("{what}-up"))
        .spawn(move || tcp_to_host(tcp_reader, host_writer));
    if let Err(e) = &upstream {
        log::info(format_args!(
            "{what}: starting the relay's second thread: {e}"
        ));
        return;
    }
    host_to_tcp(host, tcp);
    if let Ok(upstream) = upstream {
        let _ = upstream.join();
    }
}

fn tcp_to_host(mut from: TcpStream, mut to: UnixStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn host_to_tcp(mut from: UnixStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn bytes_cross_both_ways_and_each_end_of_stream_is_passed_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (served, _) = listener.accept().expect("accept");
        let (host_side, mut far_end) = UnixStream::pair().expect("pair");
        let relay = std::thread::spawn(move || both_ways(served, host_side, "test"));
        client.write_all(b"ping").expect("write");
        client
            .shutdown(std::net::Shutdown::Write)
            .expect("half-close");
        let mut got = Vec::new();
        far_end
            .read_to_end(&mut got)
            .expect("the client's bytes, then its end");
        assert_eq!(got, b"ping");
        far_end.write_all(b"pong").expect("write back");
        far_end
            .shutdown(std::net::Shutdown::Write)
            .expect("half-close");
        let mut back = Vec::new();
        client
            .read_to_end(&mut back)
            .expect("the host's bytes, then its end");
        assert_eq!(back, b"pong");
        relay.join().expect("the relay ends");
    }
}
