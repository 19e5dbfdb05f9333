// The byte streams a frame stream travels on, as the frame readers see them: a one-shot
// answer's body (read only), a hijacked connection or a WebSocket (both ways).

/** Where a source's bytes go. */
export interface PipeSink {
  data(chunk: Buffer): void;
  /**
   * The stream ended. `refusal` is the transport's word for why, when it has one (a
   * WebSocket close code), used only if the stream ended before its exit frame.
   */
  end(refusal?: Error): void;
  error(e: Error): void;
}

/** Bytes from the daemon. */
export interface Source {
  /** Delivers bytes from now on (any the transport read early first). */
  start(sink: PipeSink): void;
  pause(): void;
  resume(): void;
  /** Drops the connection (which kills the command unless it was started with `onDisconnect: "keep"`). */
  close(): void;
}

/** A full-duplex byte stream to the daemon. */
export interface Pipe extends Source {
  /** Resolves once the bytes are handed to the OS (so a fast sender waits for a slow reader). */
  write(data: Buffer): Promise<void>;
}
