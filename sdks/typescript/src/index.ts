// The public surface of @crucible/sdk.

export { Crucible, Sandboxes } from "./client.js";
export type { CrucibleOptions } from "./client.js";
export { Container, Root, Sandbox, SIGNALS } from "./sandbox.js";
export type { ClientLike, ContainerLog, InteractiveOptions, ResumeOptions, RunOptions, SignalName, StreamOptions } from "./sandbox.js";
export { ExecStream } from "./exec.js";
export type { CollectOptions, ExecEvent, OutputCallbacks } from "./exec.js";
export { InteractiveSession } from "./interactive.js";
export { Files } from "./files.js";
export type { TarSource } from "./files.js";
export { Images } from "./images.js";
export type { ImageSource } from "./images.js";
export { Caches } from "./caches.js";
export { CommandError, CommandResult, ExecResult } from "./result.js";
export * from "./errors.js";
export {
  FRAME_TYPE_NAMES,
  FrameDecoder,
  FrameError,
  FrameType,
  HEADER_SIZE,
  MAX_PAYLOAD,
  decodeFrames,
  encodeFrame,
  encodeFrames,
} from "./codec.js";
export type { Direction, Frame, FrameErrorKind } from "./codec.js";
export { parseHost } from "./transport.js";
export type { Endpoint } from "./transport.js";
export type * from "./types.js";
export type { components, paths } from "./generated/openapi.js";
