//! One request on a fresh connection, written and read by hand: the exec endpoints, where a
//! hyper connection's setup (a handshake, a connection task, channels between them) costs more
//! than the request itself. The request goes out in one write; the response head is parsed
//! once; the body is read from the socket as it comes.

use std::io::Cursor;

use http1::{HeadScanner, Limits, LineEnds, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Chain};

use crate::api_error_from;
use crate::connection::{Endpoint, Stream};
use crate::error::ClientError;

/// The bytes read past the head, then the connection.
pub(crate) type Reader = Chain<Cursor<Vec<u8>>, Stream>;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// What a response head may be: the daemon writes CRLF line ends, always.
const HEAD_LIMITS: Limits = Limits {
    max_head_bytes: MAX_HEAD,
    max_headers: 32,
    line_ends: LineEnds::CrlfOnly,
};
/// Largest error body read.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// A successful (200) response, its body still to read.
#[derive(Debug)]
pub(crate) struct Response {
    /// What came with the head, past it.
    pub(crate) rest: Vec<u8>,
    /// The connection.
    pub(crate) stream: Stream,
    /// Whether the body is in chunked transfer coding.
    pub(crate) chunked: bool,
    /// The `X-Crucible-*` headers that describe a frame stream, lowercased names.
    pub(crate) crucible_headers: Vec<(String, String)>,
}

impl Response {
    /// The value of the `X-Crucible-*` header `name` (lowercase), if the response had it.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.crucible_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body: what came with the head, then the connection.
    pub(crate) fn into_body(self) -> Reader {
        Cursor::new(self.rest).chain(self.stream)
    }
}

/// POSTs `body` (JSON) to `target` and reads the response head. A status other than 200 is
/// the daemon's error envelope, returned as [`ClientError::Api`].
pub(crate) async fn post(
    endpoint: &Endpoint,
    api_key: Option<&str>,
    target: &str,
    body: &[u8],
) -> Result<Response, ClientError> {
    let mut request = format!(
        "POST {target} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        endpoint.host_header(),
        body.len()
    );
    if let Some(key) = api_key {
        request.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    request.push_str("\r\n");
    let mut request = request.into_bytes();
    request.extend_from_slice(body);
    let mut stream = endpoint.connect().await?;
    stream
        .write_all(&request)
        .await
        .map_err(|e| ClientError::Http(format!("sending the request: {e}")))?;

    let mut buf = Vec::with_capacity(1024);
    // Resumes where the last read's search stopped: a head arriving in pieces costs linear time.
    let mut scanner = HeadScanner::new(MAX_HEAD);
    let head_end = loop {
        match scanner.scan(&buf) {
            Ok(Some(end)) => break end,
            Ok(None) => {}
            Err(e) => return Err(malformed(&e)),
        }
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| ClientError::Http(format!("reading the response: {e}")))?;
        if n == 0 {
            return Err(ClientError::Http(
                "the daemon closed the connection before answering".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = parse_head(&buf[..head_end])?;
    let mut rest = buf.split_off(head_end);
    if head.status != 200 {
        let want = head.content_length.unwrap_or(0).min(MAX_ERROR_BODY);
        while rest.len() < want {
            let mut chunk = vec![0u8; want - rest.len()];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => rest.extend_from_slice(&chunk[..n]),
            }
        }
        rest.truncate(want);
        let status =
            hyper::StatusCode::from_u16(head.status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
        return Err(api_error_from(status, &rest));
    }
    Ok(Response {
        rest,
        stream,
        chunked: head.chunked,
        crucible_headers: head.crucible_headers,
    })
}

/// What the client needs of a response head, copied out of the buffer it borrows.
struct Head {
    status: u16,
    content_length: Option<usize>,
    chunked: bool,
    crucible_headers: Vec<(String, String)>,
}

fn malformed(error: &http1::HeadError) -> ClientError {
    ClientError::Protocol(format!("malformed HTTP response from the daemon: {error}"))
}

/// Parses exactly one response head (through its empty line).
fn parse_head(head: &[u8]) -> Result<Head, ClientError> {
    let response = ResponseHead::parse(head, &HEAD_LIMITS).map_err(|e| malformed(&e))?;
    let headers = response.headers();
    Ok(Head {
        status: response.status(),
        // Beyond the address space is beyond every limit.
        content_length: headers
            .content_length()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        chunked: headers.is_chunked(),
        crucible_headers: headers
            .iter()
            .filter(|h| h.name.to_ascii_lowercase().starts_with("x-crucible-"))
            .filter_map(|h| Some((h.name.to_ascii_lowercase(), h.value_str()?.to_string())))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_say_status_length_and_coding() {
        let head = parse_head(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
              Transfer-Encoding: chunked\r\n\r\n",
        )
        .expect("valid");
        assert_eq!((head.status, head.chunked), (200, true));
        let head =
            parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\n\r\n").expect("valid");
        assert_eq!((head.status, head.content_length), (404, Some(12)));
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        // chunked is the final coding, not a substring.
        let head =
            parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunkedy\r\n\r\n").expect("valid");
        assert!(!head.chunked);
    }

    #[test]
    fn malformed_heads_say_what_is_wrong() {
        for (head, says) in [
            (&b"garbage\r\n\r\n"[..], "status line"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                "more than one Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n",
                "Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (b"HTTP/1.1 200 OK\nX: y\n\n", "bare LF"),
        ] {
            match parse_head(head) {
                Err(ClientError::Protocol(message)) => {
                    assert!(message.starts_with("malformed HTTP response"), "{message}");
                    assert!(message.contains(says), "{message}");
                }
                Err(other) => panic!("{other}"),
                Ok(_) => panic!("{:?} parsed", String::from_utf8_lossy(head)),
            }
        }
        let many: String = (0..=32).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(parse_head(many.as_bytes()).is_err());
    }

    /// A daemon on a Unix socket that answers one request with `response`, a byte at a time.
    async fn dribbling_daemon(response: &'static [u8]) -> (Endpoint, tokio::task::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!(
            "crucible-client-raw-{}-{}",
            std::process::id(),
            response.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let path = dir.join("d.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let daemon = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.ends_with(b"{}") {
                let n = stream.read(&mut chunk).await.expect("read the request");
                assert_ne!(n, 0, "the request ended early");
                request.extend_from_slice(&chunk[..n]);
            }
            for byte in response {
                stream.write_all(&[*byte]).await.expect("answer");
                tokio::task::yield_now().await;
            }
            let _ = stream.shutdown().await;
            let _ = std::fs::remove_dir_all(&dir);
        });
        (Endpoint::Unix(path), daemon)
    }

    #[test]
    fn a_head_read_in_pieces_leaves_the_bytes_past_it_as_the_body() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let (endpoint, daemon) = dribbling_daemon(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                  Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            )
            .await;
            let response = post(&endpoint, Some("k"), "/sandboxes/sb-1/exec", b"{}")
                .await
                .expect("a 200");
            assert!(response.chunked);
            let mut body = Vec::new();
            response
                .into_body()
                .read_to_end(&mut body)
                .await
                .expect("the body");
            assert_eq!(body, b"5\r\nhello\r\n0\r\n\r\n");
            daemon.await.expect("the daemon");

            let (endpoint, daemon) = dribbling_daemon(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\
                  Content-Length: 40\r\n\r\n{\"code\":\"not_found\",\"message\":\"no sb-1\"}",
            )
            .await;
            match post(&endpoint, None, "/sandboxes/sb-1/exec", b"{}").await {
                Err(ClientError::Api {
                    status,
                    code,
                    message,
                }) => assert_eq!(
                    (status, code.as_str(), message.as_str()),
                    (404, "not_found", "no sb-1")
                ),
                other => panic!("{other:?}"),
            }
            daemon.await.expect("the daemon");

            let (endpoint, daemon) = dribbling_daemon(b"HTTP/1.1 200 OK\r\nX: y\r\n").await;
            match post(&endpoint, None, "/sandboxes/sb-1/exec", b"{}").await {
                Err(ClientError::Http(message)) => {
                    assert!(message.contains("closed the connection before answering"))
                }
                other => panic!("{other:?}"),
            }
            daemon.await.expect("the daemon");
        });
    }
}
