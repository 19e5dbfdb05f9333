//! Where a backend's proxied connections go: each is served in a task of its own, up to a cap
//! per sandbox, so a sandbox that opens connections without end cannot take the daemon's
//! descriptors and memory (two sockets and two relay buffers each) from everyone else.

use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::proxy::{serve, EgressContext};
use engine::egress::{EgressSink, EgressStream};

/// Most proxied connections one sandbox may have open at once, by default: far above what a
/// package manager opens (npm's 50 sockets, pip's 10, cargo's HTTP/2 multiplexing).
pub const MAX_CONNECTIONS_PER_SANDBOX: usize = 256;

/// The sink of one sandbox: serves each connection with `context`, at most `limit` at once;
/// past it a connection is answered `429` and closed.
pub(crate) fn sink(context: Arc<EgressContext>, limit: usize) -> EgressSink {
    let slots = Arc::new(Semaphore::new(limit));
    Arc::new(move |stream| {
        let context = context.clone();
        let permit = slots.clone().try_acquire_owned().ok();
        tokio::spawn(async move {
            let Some(_permit) = permit else {
                context.counters.add_denied();
                tracing::info!(
                    sandbox = %context.sandbox_id,
                    verdict = "too many connections",
                    "egress"
                );
                match stream {
                    EgressStream::Tcp(s) => refuse(s, &context, limit).await,
                    EgressStream::Unix(s) => refuse(s, &context, limit).await,
                }
                return;
            };
            match stream {
                EgressStream::Tcp(s) => serve(s, &context).await,
                EgressStream::Unix(s) => serve(s, &context).await,
            }
        });
    })
}

async fn refuse<S: AsyncWrite + Unpin>(mut stream: S, context: &EgressContext, limit: usize) {
    let body = format!(
        "crucible egress: sandbox {} already has {limit} proxied connections open, its limit\n",
        context.sandbox_id
    );
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\nX-Crucible-Egress: denied\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::egress::EgressCounters;

    use crate::policy::EgressPolicy;
    use crate::proxy::SystemResolver;
    use crate::rules::Allowlist;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn past_its_cap_a_sandbox_gets_429_and_the_others_are_served() {
        let context = Arc::new(EgressContext {
            sandbox_id: "sb-0000000000000001".into(),
            policy: Arc::new(EgressPolicy::new(&[], &Allowlist::default()).expect("policy")),
            counters: Arc::new(EgressCounters::default()),
            resolver: Arc::new(SystemResolver),
            pod: None,
        });
        let sink = sink(context.clone(), 1);
        // The first holds the only slot: it sends nothing, so its head never completes.
        let (held, held_daemon) = tokio::net::UnixStream::pair().expect("pair");
        sink(EgressStream::Unix(held_daemon));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (mut second, second_daemon) = tokio::net::UnixStream::pair().expect("pair");
        sink(EgressStream::Unix(second_daemon));
        let mut answer = String::new();
        second.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 429 "), "{answer}");
        assert!(answer.contains("sb-0000000000000001"), "{answer}");
        assert_eq!(context.counters.snapshot().denied, 1);
        drop(held);
    }
}
