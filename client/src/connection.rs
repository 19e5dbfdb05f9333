//! Where the daemon is, and one HTTP/1.1 exchange over a fresh connection.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::error::ClientError;

/// The daemon's address: a Unix socket, or TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket path.
    Unix(PathBuf),
    /// `host:port` over plain HTTP.
    Tcp(String),
}

impl FromStr for Endpoint {
    type Err = ClientError;

    /// `http://host:port`, `unix:/path`, or a plain path.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("http://") {
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
                return Err(ClientError::BadEndpoint(s.into()));
            }
            return Ok(Endpoint::Tcp(authority.to_string()));
        }
        if s.starts_with("https://") {
            return Err(ClientError::BadEndpoint(format!(
                "{s} (TLS is not supported; put a proxy in front)"
            )));
        }
        let path = s.strip_prefix("unix:").unwrap_or(s);
        if path.is_empty() {
            return Err(ClientError::BadEndpoint(s.into()));
        }
        Ok(Endpoint::Unix(PathBuf::from(path)))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp(authority) => write!(f, "http://{authority}"),
        }
    }
}

impl Endpoint {
    /// The `Host` header to send.
    pub fn host_header(&self) -> String {
        match self {
            Endpoint::Unix(_) => "crucible".into(),
            Endpoint::Tcp(authority) => authority.clone(),
        }
    }

    /// A fresh connection.
    pub async fn connect(&self) -> Result<Stream, ClientError> {
        let result = match self {
            Endpoint::Unix(path) => UnixStream::connect(path).await.map(Stream::Unix),
            Endpoint::Tcp(authority) => TcpStream::connect(authority.as_str()).await.map(|s| {
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
        };
        result.map_err(|source| ClientError::Connect {
            endpoint: self.to_string(),
            source,
        })
    }
}

/// A connection to the daemon.
#[derive(Debug)]
pub enum Stream {
    /// Over a Unix socket.
    Unix(UnixStream),
    /// Over TCP.
    Tcp(TcpStream),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Sends one request on a new connection.
pub(crate) async fn send<B>(
    endpoint: &Endpoint,
    request: Request<B>,
) -> Result<Response<Incoming>, ClientError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = endpoint.connect().await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender.send_request(request).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_from_paths_and_urls() {
        assert_eq!(
            "/run/crucible/crucible.sock".parse::<Endpoint>().ok(),
            Some(Endpoint::Unix("/run/crucible/crucible.sock".into()))
        );
        assert_eq!(
            "unix:/tmp/c.sock".parse::<Endpoint>().ok(),
            Some(Endpoint::Unix("/tmp/c.sock".into()))
        );
        assert_eq!(
            "http://127.0.0.1:7070/".parse::<Endpoint>().ok(),
            Some(Endpoint::Tcp("127.0.0.1:7070".into()))
        );
        assert!("http://".parse::<Endpoint>().is_err());
        assert!("https://x:1".parse::<Endpoint>().is_err());
        assert!("".parse::<Endpoint>().is_err());
    }
}
