//! One request on a fresh connection, written and read by hand: the exec endpoints, where a
//! hyper connection's setup (a handshake, a connection task, channels between them) costs more
//! than the request itself. The request goes out in one write; the response head is parsed
//! once; the body is read from the socket as it comes.

use std::io::Cursor;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Chain};

use crate::api_error_from;
use crate::connection::{Endpoint, Stream};
use crate::error::ClientError;

/// The bytes read past the head, then the connection.
pub(crate) type Reader = Chain<Cursor<Vec<u8>>, Stream>;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
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
}

impl Response {
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
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(ClientError::Protocol(
                "the daemon's response head is too large".into(),
            ));
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
    })
}

struct Head {
    status: u16,
    content_length: Option<usize>,
    chunked: bool,
}

fn parse_head(head: &[u8]) -> Result<Head, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => {
            return Err(ClientError::Protocol(
                "malformed HTTP response from the daemon".into(),
            ))
        }
    }
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    Ok(Head {
        status: response.code.unwrap_or(0),
        content_length: header("content-length").and_then(|v| v.trim().parse().ok()),
        chunked: header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked")),
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
    }
}
