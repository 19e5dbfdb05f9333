//! Relays an agent's response frame stream to a client without re-encoding it: whole frames are
//! forwarded as the exact bytes received, never half a frame, so that if the agent is lost
//! mid-stream the daemon can still end the stream with a valid synthesized exit frame.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use wire::{encode_exit_payload, encode_frames, Decoder, Direction, ExecResult, FrameType};

use crate::agent::AgentError;

/// The bytes of an exit frame reporting a failure (`exit_code: -1` + `error`).
pub(crate) fn failure_frame(error: impl Into<String>) -> Bytes {
    let payload = encode_exit_payload(&ExecResult::failed(error));
    let mut out = Vec::with_capacity(payload.len() + wire::HEADER_SIZE);
    encode_frames(FrameType::Exit, &payload, &mut out);
    Bytes::from(out)
}

/// How the relayed stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RelayEnd {
    /// The agent's own exit frame was forwarded.
    Exited,
    /// The agent was lost; a synthesized exit frame carrying this error was forwarded.
    Lost(String),
}

/// Pulls chunks of whole frames from an agent connection.
#[derive(Debug)]
pub(crate) struct ResponseRelay<R> {
    reader: R,
    decoder: Decoder,
    end: Option<RelayEnd>,
}

impl<R: AsyncRead + Unpin> ResponseRelay<R> {
    /// Relays the response stream read from `reader`.
    pub(crate) fn new(reader: R) -> Self {
        ResponseRelay {
            reader,
            // Starts small and grows to what the stream needs: a preallocated 128 KiB per exec
            // held 12 MiB for 100 concurrent `echo`s, and the daemon's RSS kept it.
            decoder: Decoder::new(Direction::GuestToHost),
            end: None,
        }
    }

    /// How the stream ended, once it has.
    pub(crate) fn end(&self) -> Option<&RelayEnd> {
        self.end.as_ref()
    }

    /// The next chunk for the client: `Ok` with one or more whole frames, or `Err` with why the
    /// agent was lost, after which the caller sends [`failure_frame`]. `None` once the exit
    /// frame was forwarded or the loss reported.
    pub(crate) async fn next_chunk(&mut self) -> Option<Result<Bytes, AgentError>> {
        if self.end.is_some() {
            return None;
        }
        loop {
            match self.decoder.take_whole_frames() {
                Ok([]) => {}
                Ok(frames) => {
                    let chunk = Bytes::copy_from_slice(frames);
                    if self.decoder.saw_exit() {
                        self.end = Some(RelayEnd::Exited);
                    }
                    return Some(Ok(chunk));
                }
                Err(e) => {
                    return Some(self.lose(format!("the agent sent an invalid frame stream: {e}")))
                }
            }
            match self.reader.read(self.decoder.unfilled_mut()).await {
                Ok(0) => {
                    let why = match self.decoder.finish() {
                        Err(e) => format!("the agent connection closed mid-stream: {e}"),
                        Ok(()) => "the agent connection closed without an exit frame".into(),
                    };
                    return Some(self.lose(why));
                }
                Ok(n) => self.decoder.mark_filled(n),
                Err(e) => return Some(self.lose(format!("reading from the agent failed: {e}"))),
            }
        }
    }

    fn lose(&mut self, error: String) -> Result<Bytes, AgentError> {
        self.end = Some(RelayEnd::Lost(error.clone()));
        Err(AgentError::Stream(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{FrameReader, FrameWriter};

    async fn relay_all(input: Vec<u8>) -> (Vec<u8>, Option<RelayEnd>) {
        let mut relay = ResponseRelay::new(&input[..]);
        let mut out = Vec::new();
        while let Some(chunk) = relay.next_chunk().await {
            match chunk {
                Ok(frames) => out.extend_from_slice(&frames),
                Err(why) => out.extend_from_slice(&failure_frame(format!("lost: {why}"))),
            }
        }
        (out, relay.end().cloned())
    }

    fn decode(bytes: &[u8]) -> Vec<(FrameType, Vec<u8>)> {
        let mut reader = FrameReader::new(bytes, Direction::GuestToHost);
        let mut frames = Vec::new();
        while let Some(f) = reader
            .read_frame()
            .expect("relay output is always a valid stream")
        {
            frames.push((f.frame_type, f.payload.to_vec()));
        }
        frames
    }

    #[tokio::test]
    async fn forwards_agent_bytes_unchanged() {
        let mut w = FrameWriter::new(Vec::new());
        w.write_data(FrameType::Stdout, &vec![1u8; 100_000])
            .expect("write");
        w.write_exit(&ExecResult::default()).expect("write");
        let input = w.into_inner();
        let (out, end) = relay_all(input.clone()).await;
        assert_eq!(out, input);
        assert_eq!(end, Some(RelayEnd::Exited));
    }

    #[tokio::test]
    async fn a_cut_stream_ends_with_a_synthesized_exit_frame_and_no_half_frame() {
        let mut w = FrameWriter::new(Vec::new());
        w.write_data(FrameType::Stdout, b"complete").expect("write");
        w.write_data(FrameType::Stdout, b"cut in the middle")
            .expect("write");
        let mut input = w.into_inner();
        input.truncate(input.len() - 5);
        let (out, end) = relay_all(input).await;
        let frames = decode(&out);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0], (FrameType::Stdout, b"complete".to_vec()));
        let result: ExecResult = serde_json::from_slice(&frames[1].1).expect("exit JSON");
        assert_eq!(result.exit_code, -1);
        assert!(
            result
                .error
                .starts_with("lost: the agent connection closed mid-stream"),
            "{}",
            result.error
        );
        assert!(matches!(end, Some(RelayEnd::Lost(_))));
    }

    #[tokio::test]
    async fn garbage_from_the_agent_becomes_an_in_band_error() {
        let (out, _) = relay_all(vec![42, 0, 0, 0, 0, 0, 0, 0]).await;
        let frames = decode(&out);
        let result: ExecResult = serde_json::from_slice(&frames[0].1).expect("exit JSON");
        assert!(
            result.error.contains("unknown frame type 42"),
            "{}",
            result.error
        );
    }
}
