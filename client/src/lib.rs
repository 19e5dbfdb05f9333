//! A typed client for the crucible API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), client::ClientError> {
//! let crucible = client::Client::new("/run/crucible/crucible.sock".parse()?);
//! let sandbox = crucible.create(&Default::default()).await?;
//! let output = crucible.exec_collect(&sandbox.id, &wire::ExecRequest::new(["uname", "-a"])).await?;
//! print!("{}", String::from_utf8_lossy(&output.stdout));
//! crucible.delete(&sandbox.id).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod chunked;
mod connection;
mod error;
mod exec;
mod raw;
mod session;

use std::path::Path;

use api_types::{CreateSandbox, SandboxInfo, SandboxList};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use wire::{ErrorBody, ExecRequest, FilesPutResult};

pub use connection::Endpoint;
pub use error::ClientError;
pub use exec::{ExecEvent, ExecOutput, ExecStream};
pub use session::{AttachPosition, Session, SessionReader, SessionWriter};

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    api_key: Option<String>,
}

/// A downloaded file: how many bytes, and what the daemon said of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Download {
    /// The bytes written.
    pub bytes: u64,
    /// Its permission bits in the sandbox (`st_mode & 0o7777`), when the daemon says.
    pub mode: Option<u32>,
    /// Its modification time in the sandbox, when the daemon says.
    pub modified: Option<std::time::SystemTime>,
}

impl Client {
    /// A client of the daemon at `endpoint`, without an API key.
    pub fn new(endpoint: Endpoint) -> Self {
        Client {
            endpoint,
            api_key: None,
        }
    }

    /// Sends `Authorization: Bearer <key>` on every request.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The daemon's address.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.endpoint.host_header());
        if let Some(key) = &self.api_key {
            builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        builder
    }

    async fn send<B>(&self, request: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let response = connection::send(&self.endpoint, request).await?;
        if response.status().is_client_error() || response.status().is_server_error() {
            return Err(api_error(response).await);
        }
        Ok(response)
    }

    async fn json<T: DeserializeOwned>(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<T, ClientError> {
        let response = self.send(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol(format!("unexpected JSON from the daemon: {e}")))
    }

    fn json_body<T: serde::Serialize>(
        &self,
        method: Method,
        path: &str,
        value: &T,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let body = serde_json::to_vec(value).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.request(method, path)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    fn empty(&self, method: Method, path: &str) -> Result<Request<Full<Bytes>>, ClientError> {
        self.request(method, path)
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<serde_json::Value, ClientError> {
        self.json(self.empty(Method::GET, "/healthz")?).await
    }

    /// `GET /metrics`, the Prometheus text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let response = self.send(self.empty(Method::GET, "/metrics")?).await?;
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// `POST /sandboxes`: creates a sandbox and returns once its agent is ready.
    pub async fn create(&self, request: &CreateSandbox) -> Result<SandboxInfo, ClientError> {
        self.json(self.json_body(Method::POST, "/sandboxes", request)?)
            .await
    }

    /// `GET /sandboxes`.
    pub async fn list(&self) -> Result<Vec<SandboxInfo>, ClientError> {
        let list: SandboxList = self.json(self.empty(Method::GET, "/sandboxes")?).await?;
        Ok(list.sandboxes)
    }

    /// `GET /sandboxes/{id}`.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.json(self.empty(Method::GET, &format!("/sandboxes/{}", path_segment(id)))?)
            .await
    }

    /// `PATCH /sandboxes/{id}`: new memory and CPU limits for a running sandbox.
    pub async fn update(
        &self,
        id: &str,
        request: &api_types::UpdateSandbox,
    ) -> Result<SandboxInfo, ClientError> {
        let path = format!("/sandboxes/{}", path_segment(id));
        self.json(self.json_body(Method::PATCH, &path, request)?)
            .await
    }

    /// `DELETE /sandboxes/{id}`.
    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        self.send(self.empty(Method::DELETE, &format!("/sandboxes/{}", path_segment(id)))?)
            .await?;
        Ok(())
    }

    /// `POST /sandboxes/{id}/signal`: sends `signal` to every process of the sandbox but its
    /// agent.
    pub async fn signal(&self, id: &str, signal: i32) -> Result<(), ClientError> {
        self.signal_in(
            id,
            None,
            api_types::SignalRequest {
                signal,
                exec_id: None,
            },
        )
        .await
    }

    /// `POST /sandboxes/{id}/signal` with an `exec_id`: `signal` to that running command's
    /// process group only (404 when no command of that name runs).
    pub async fn signal_exec(
        &self,
        id: &str,
        exec_id: &str,
        signal: i32,
    ) -> Result<(), ClientError> {
        self.signal_in(
            id,
            None,
            api_types::SignalRequest {
                signal,
                exec_id: Some(exec_id.to_string()),
            },
        )
        .await
    }

    /// `POST /sandboxes/{id}/signal?container=NAME`: `request`'s signal to its command, or to
    /// every process but the agent, of one of the sandbox's containers (`None`: its own root).
    pub async fn signal_in(
        &self,
        id: &str,
        container: Option<&str>,
        request: api_types::SignalRequest,
    ) -> Result<(), ClientError> {
        let body =
            serde_json::to_vec(&request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let target = format!(
            "/sandboxes/{}/signal{}",
            path_segment(id),
            first_query(in_container(container))
        );
        let request = self
            .request(Method::POST, &target)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send(request).await?;
        Ok(())
    }

    /// `GET /sandboxes/{id}/stats`: what the sandbox uses now.
    pub async fn stats(&self, id: &str) -> Result<wire::SandboxStats, ClientError> {
        self.json(self.empty(
            Method::GET,
            &format!("/sandboxes/{}/stats", path_segment(id)),
        )?)
        .await
    }

    /// `GET /sandboxes/{id}/stats?container=NAME`: what one of the sandbox's containers uses
    /// (its processes' share, with the sandbox's limits).
    pub async fn container_stats(
        &self,
        id: &str,
        container: &str,
    ) -> Result<wire::SandboxStats, ClientError> {
        self.json(self.empty(
            Method::GET,
            &format!(
                "/sandboxes/{}/stats?container={}",
                path_segment(id),
                query_value(container)
            ),
        )?)
        .await
    }

    /// `GET /caches`: the caller's named caches (every one for the admin key and the Unix
    /// socket).
    pub async fn caches(&self) -> Result<Vec<api_types::CacheInfo>, ClientError> {
        let list: api_types::CacheList = self.json(self.empty(Method::GET, "/caches")?).await?;
        Ok(list.caches)
    }

    /// `DELETE /caches/{name}`: deletes one of the caller's caches (refused while in use).
    pub async fn delete_cache(&self, name: &str) -> Result<(), ClientError> {
        self.send(self.empty(Method::DELETE, &format!("/caches/{}", path_segment(name)))?)
            .await?;
        Ok(())
    }

    /// `DELETE /caches`: deletes every cache of the caller's not in use; returns those kept.
    pub async fn clear_caches(&self) -> Result<Vec<api_types::CacheInfo>, ClientError> {
        let list: api_types::CacheList = self.json(self.empty(Method::DELETE, "/caches")?).await?;
        Ok(list.caches)
    }

    /// `GET /images`: the built-in image, then the caller's imported images (every owner's
    /// for the admin key and the Unix socket).
    pub async fn images(&self) -> Result<Vec<api_types::ImageInfo>, ClientError> {
        let list: api_types::ImageList = self.json(self.empty(Method::GET, "/images")?).await?;
        Ok(list.images)
    }

    /// `GET /images/{name}`: one of the caller's images.
    pub async fn image(&self, name: &str) -> Result<api_types::ImageInfo, ClientError> {
        self.json(self.empty(Method::GET, &format!("/images/{}", path_segment(name)))?)
            .await
    }

    /// `DELETE /images/{name}`: removes one of the caller's images (refused while a sandbox
    /// uses it).
    pub async fn delete_image(&self, name: &str) -> Result<(), ClientError> {
        self.send(self.empty(Method::DELETE, &format!("/images/{}", path_segment(name)))?)
            .await?;
        Ok(())
    }

    /// `DELETE /images`: removes the caller's images that no sandbox uses, idle for at least
    /// `unused_for_s` seconds and named `prefix…` (`docker image prune -a`).
    pub async fn prune_images(
        &self,
        unused_for_s: u64,
        prefix: &str,
    ) -> Result<api_types::ImagesPruned, ClientError> {
        self.json(self.empty(
            Method::DELETE,
            &format!(
                "/images?unused_for_s={unused_for_s}&prefix={}",
                query_value(prefix)
            ),
        )?)
        .await
    }

    /// `POST /images?name=NAME`: imports the archive `archive` streams (an OCI layout tarred,
    /// an OCI archive, a `docker save` archive or a rootfs tarball, gzip or not) as `name`,
    /// replacing the caller's image of that name.
    pub async fn import_image<R>(
        &self,
        name: &str,
        archive: R,
    ) -> Result<api_types::ImageInfo, ClientError>
    where
        R: AsyncRead + Send + 'static,
    {
        self.post_stream(&format!("/images?name={}", query_value(name)), archive)
            .await
    }

    /// `POST /sandboxes/{id}/exec`: runs a command and streams its output as events.
    pub async fn exec(&self, id: &str, request: &ExecRequest) -> Result<ExecStream, ClientError> {
        let target = format!("/sandboxes/{}/exec", path_segment(id));
        let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = raw::post(&self.endpoint, self.api_key.as_deref(), &target, &body).await?;
        Ok(ExecStream::new(response))
    }

    /// `POST /sandboxes/{id}/exec?container=NAME`: [`Client::exec`] in one of the sandbox's
    /// containers.
    pub async fn exec_in(
        &self,
        id: &str,
        container: &str,
        request: &ExecRequest,
    ) -> Result<ExecStream, ClientError> {
        let target = format!(
            "/sandboxes/{}/exec?container={}",
            path_segment(id),
            query_value(container)
        );
        let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = raw::post(&self.endpoint, self.api_key.as_deref(), &target, &body).await?;
        Ok(ExecStream::new(response))
    }

    /// `GET /sandboxes/{id}/containers`.
    pub async fn containers(&self, id: &str) -> Result<Vec<api_types::ContainerInfo>, ClientError> {
        let list: api_types::ContainerList = self
            .json(self.empty(
                Method::GET,
                &format!("/sandboxes/{}/containers", path_segment(id)),
            )?)
            .await?;
        Ok(list.containers)
    }

    /// `POST /sandboxes/{id}/containers`: adds a container to the running sandbox; answers
    /// once it is ready.
    pub async fn add_container(
        &self,
        id: &str,
        request: &api_types::ContainerRequest,
    ) -> Result<api_types::ContainerInfo, ClientError> {
        let target = format!("/sandboxes/{}/containers", path_segment(id));
        self.json(self.json_body(Method::POST, &target, request)?)
            .await
    }

    /// `DELETE /sandboxes/{id}/containers/{name}`: removes the container, every process in it.
    pub async fn remove_container(&self, id: &str, name: &str) -> Result<(), ClientError> {
        let target = format!(
            "/sandboxes/{}/containers/{}",
            path_segment(id),
            path_segment(name)
        );
        self.send(self.empty(Method::DELETE, &target)?).await?;
        Ok(())
    }

    /// `GET /sandboxes/{id}/containers/{name}/logs`: the kept output of the container's main
    /// process, as an exec frame stream (decode it with [`wire::FrameReader`]).
    pub async fn container_logs(&self, id: &str, name: &str) -> Result<Bytes, ClientError> {
        let uri = format!(
            "/sandboxes/{}/containers/{}/logs",
            path_segment(id),
            path_segment(name)
        );
        let response = self.send(self.empty(Method::GET, &uri)?).await?;
        Ok(response.into_body().collect().await?.to_bytes())
    }

    /// `GET /sandboxes/{id}/execs`: the sandbox's commands that can be found by `exec_id`
    /// (running, or ended with a result not yet collected), oldest first.
    pub async fn execs(&self, id: &str) -> Result<Vec<wire::ExecStatus>, ClientError> {
        let list: wire::ExecList = self
            .json(self.empty(
                Method::GET,
                &format!("/sandboxes/{}/execs", path_segment(id)),
            )?)
            .await?;
        Ok(list.execs)
    }

    /// `GET /sandboxes/{id}/execs/{exec_id}`: one command's status.
    pub async fn exec_status(
        &self,
        id: &str,
        exec_id: &str,
    ) -> Result<wire::ExecStatus, ClientError> {
        self.json(self.empty(
            Method::GET,
            &format!(
                "/sandboxes/{}/execs/{}",
                path_segment(id),
                path_segment(exec_id)
            ),
        )?)
        .await
    }

    /// `DELETE /sandboxes/{id}/execs/{exec_id}`: ends a command (its process group gets
    /// SIGKILL) and forgets it, or forgets an ended one's result nobody collected.
    pub async fn delete_exec(&self, id: &str, exec_id: &str) -> Result<(), ClientError> {
        self.send(self.empty(
            Method::DELETE,
            &format!(
                "/sandboxes/{}/execs/{}",
                path_segment(id),
                path_segment(exec_id)
            ),
        )?)
        .await?;
        Ok(())
    }

    /// `POST /sandboxes/{id}/execs/{exec_id}/attach?offset=N`: re-attaches to a command whose
    /// connection dropped, from output byte `offset` (the stdout and stderr bytes already
    /// received); the stream ends with its one exit frame, whose `output_dropped_bytes` counts
    /// what was no longer kept.
    pub async fn attach(
        &self,
        id: &str,
        exec_id: &str,
        offset: u64,
    ) -> Result<ExecStream, ClientError> {
        let target = format!(
            "/sandboxes/{}/execs/{}/attach?offset={offset}",
            path_segment(id),
            path_segment(exec_id)
        );
        let response = raw::post(&self.endpoint, self.api_key.as_deref(), &target, b"").await?;
        Ok(ExecStream::new(response))
    }

    /// `POST /sandboxes/{id}/execs/{exec_id}/attach?offset=N&stdin=1`: re-attaches to an
    /// interactive command that outlives its connection (`on_disconnect: keep`) over a
    /// hijacked connection, from output byte `offset`; the position says which stdin bytes
    /// it took (send on from there).
    pub async fn attach_interactive(
        &self,
        id: &str,
        exec_id: &str,
        offset: u64,
    ) -> Result<(Session, AttachPosition), ClientError> {
        self.attach_interactive_in(id, None, exec_id, offset).await
    }

    /// [`Client::attach_interactive`] to a command of one of the sandbox's containers
    /// (`None`: its own root).
    pub async fn attach_interactive_in(
        &self,
        id: &str,
        container: Option<&str>,
        exec_id: &str,
        offset: u64,
    ) -> Result<(Session, AttachPosition), ClientError> {
        let key = self.api_key.as_deref();
        session::attach(&self.endpoint, key, id, container, exec_id, offset).await
    }

    /// Runs a command and collects all its output.
    pub async fn exec_collect(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> Result<ExecOutput, ClientError> {
        self.exec(id, request).await?.collect().await
    }

    /// `POST /sandboxes/{id}/exec?stdin=1`: an interactive session over a hijacked connection.
    pub async fn interactive(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> Result<Session, ClientError> {
        self.interactive_in(id, None, request).await
    }

    /// [`Client::interactive`] in one of the sandbox's containers (`None`: its own root).
    pub async fn interactive_in(
        &self,
        id: &str,
        container: Option<&str>,
        request: &ExecRequest,
    ) -> Result<Session, ClientError> {
        session::open(
            &self.endpoint,
            self.api_key.as_deref(),
            id,
            container,
            request,
        )
        .await
    }

    /// `POST /sandboxes/{id}/files?path=DIR`: uploads a tar stream, extracted beneath `dir`.
    pub async fn put_tar<R>(
        &self,
        id: &str,
        dir: &str,
        tar: R,
    ) -> Result<FilesPutResult, ClientError>
    where
        R: AsyncRead + Send + 'static,
    {
        self.put_tar_in(id, None, dir, tar).await
    }

    /// [`Client::put_tar`] into one of the sandbox's containers (`None`: its own root).
    pub async fn put_tar_in<R>(
        &self,
        id: &str,
        container: Option<&str>,
        dir: &str,
        tar: R,
    ) -> Result<FilesPutResult, ClientError>
    where
        R: AsyncRead + Send + 'static,
    {
        let path = format!(
            "/sandboxes/{}/files?path={}{}",
            path_segment(id),
            query_value(dir),
            in_container(container)
        );
        self.post_stream(&path, tar).await
    }

    /// POSTs what `reader` streams as an `application/x-tar` body to `path`; decodes the JSON
    /// answer.
    async fn post_stream<R, T>(&self, path: &str, reader: R) -> Result<T, ClientError>
    where
        R: AsyncRead + Send + 'static,
        T: DeserializeOwned,
    {
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024)
            .map_ok(hyper::body::Frame::data);
        let body = http_body_util::StreamBody::new(stream);
        let request = self
            .request(Method::POST, path)
            .header(hyper::header::CONTENT_TYPE, "application/x-tar")
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = self.send(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol(format!("unexpected JSON from the daemon: {e}")))
    }

    /// Uploads a local file or directory tree (as a tar built on the fly) beneath `dir`. A
    /// directory's contents land under `dir/<its name>`, as `cp -r` would put them.
    pub async fn put_path(
        &self,
        id: &str,
        local: &Path,
        dir: &str,
    ) -> Result<FilesPutResult, ClientError> {
        self.put_path_in(id, None, local, dir).await
    }

    /// [`Client::put_path`] into one of the sandbox's containers (`None`: its own root).
    pub async fn put_path_in(
        &self,
        id: &str,
        container: Option<&str>,
        local: &Path,
        dir: &str,
    ) -> Result<FilesPutResult, ClientError> {
        let local = local.to_path_buf();
        let name = local
            .file_name()
            .map(|n| n.to_os_string())
            .ok_or_else(|| ClientError::Local(format!("{} has no file name", local.display())))?;
        let metadata = std::fs::metadata(&local)
            .map_err(|e| ClientError::Local(format!("{}: {e}", local.display())))?;
        let (writer, reader) = tokio::io::duplex(64 * 1024);
        let builder = tokio::task::spawn_blocking(move || {
            let mut tar = tar::Builder::new(tokio_util::io::SyncIoBridge::new(writer));
            tar.follow_symlinks(false);
            if metadata.is_dir() {
                tar.append_dir_all(&name, &local)?;
            } else {
                tar.append_path_with_name(&local, &name)?;
            }
            let mut out = tar.into_inner()?;
            std::io::Write::flush(&mut out)?;
            out.shutdown()
        });
        let result = self.put_tar_in(id, container, dir, reader).await;
        match builder.await {
            Ok(Ok(())) => result,
            Ok(Err(e)) => result.and(Err(ClientError::Local(format!("building the tar: {e}")))),
            Err(e) => result.and(Err(ClientError::Local(format!("building the tar: {e}")))),
        }
    }

    /// `GET /sandboxes/{id}/files?path=FILE`: streams one file's bytes into `out`; returns
    /// how many were written.
    pub async fn get_file<W>(&self, id: &str, path: &str, out: &mut W) -> Result<u64, ClientError>
    where
        W: AsyncWrite + Unpin,
    {
        Ok(self.download_file(id, path, out).await?.bytes)
    }

    /// [`Client::get_file`], with what the daemon says of the file: its permission bits
    /// (`X-Crucible-Mode`) and modification time (`Last-Modified`).
    pub async fn download_file<W>(
        &self,
        id: &str,
        path: &str,
        out: &mut W,
    ) -> Result<Download, ClientError>
    where
        W: AsyncWrite + Unpin,
    {
        let uri = files_uri(id, path);
        let response = self.send(self.empty(Method::GET, &uri)?).await?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let expected = header("content-length").and_then(|v| v.parse::<u64>().ok());
        let mode = header("x-crucible-mode").and_then(|v| u32::from_str_radix(&v, 8).ok());
        let modified = header("last-modified").and_then(|v| httpdate::parse_http_date(&v).ok());
        let mut body = response.into_body();
        let mut written = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                out.write_all(&data)
                    .await
                    .map_err(|e| ClientError::Local(format!("writing the download: {e}")))?;
                written += data.len() as u64;
            }
        }
        out.flush()
            .await
            .map_err(|e| ClientError::Local(format!("writing the download: {e}")))?;
        if let Some(expected) = expected {
            if written != expected {
                return Err(ClientError::Protocol(format!(
                    "download ended after {written} of {expected} bytes"
                )));
            }
        }
        Ok(Download {
            bytes: written,
            mode,
            modified,
        })
    }

    /// `GET /sandboxes/{id}/files?path=PATH` with `Accept: application/x-tar`: the directory
    /// (or file) as a tar archive written to `out`, entries named relative to it (the top
    /// directory is `./`). An archive the agent could not finish is an error here, never a
    /// short archive taken for whole. Returns the archive's size.
    pub async fn download_tree<W>(
        &self,
        id: &str,
        path: &str,
        out: &mut W,
    ) -> Result<u64, ClientError>
    where
        W: AsyncWrite + Unpin,
    {
        let uri = files_uri(id, path);
        let request = self
            .request(Method::GET, &uri)
            .header(hyper::header::ACCEPT, "application/x-tar")
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut body = self.send(request).await?.into_body();
        let mut written = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ClientError::Protocol(format!(
                    "the archive of {id}:{path} ended after {written} bytes, cut short: {e}"
                ))
            })?;
            if let Ok(data) = frame.into_data() {
                out.write_all(&data)
                    .await
                    .map_err(|e| ClientError::Local(format!("writing the archive: {e}")))?;
                written += data.len() as u64;
            }
        }
        out.flush()
            .await
            .map_err(|e| ClientError::Local(format!("writing the archive: {e}")))?;
        Ok(written)
    }
}

use futures_util::TryStreamExt;

/// `GET /sandboxes/{id}/files?path=PATH`'s target.
fn files_uri(id: &str, path: &str) -> String {
    format!(
        "/sandboxes/{}/files?path={}",
        path_segment(id),
        query_value(path)
    )
}

/// Reads an error response's JSON envelope.
async fn api_error(response: Response<Incoming>) -> ClientError {
    let status = response.status();
    let body = match response.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return ClientError::Http(e.to_string()),
    };
    api_error_from(status, &body)
}

pub(crate) fn api_error_from(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(error) => ClientError::Api {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            code: "unknown".into(),
            message: String::from_utf8_lossy(body).trim().to_string(),
        },
    }
}

/// Percent-encodes a path segment.
fn path_segment(s: &str) -> String {
    encode(s, |b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// `&container=NAME` to add to a query, or nothing for the sandbox's own root (`None`).
pub(crate) fn in_container(container: Option<&str>) -> String {
    container.map_or_else(String::new, |name| {
        format!("&container={}", query_value(name))
    })
}

/// A query of one `&`-led parameter (or none) made the first: `?…`.
fn first_query(parameter: String) -> String {
    match parameter.strip_prefix('&') {
        Some(rest) => format!("?{rest}"),
        None => parameter,
    }
}

/// Percent-encodes a query value.
fn query_value(s: &str) -> String {
    encode(s, |b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b))
}

fn encode(s: &str, keep: impl Fn(u8) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if keep(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
