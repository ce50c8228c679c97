// The coded task service's messages between a master and its workers (fabric/coded/).
//
// Every message is a wire::Header of type kData whose `opcode` is a CodedOp, `senderRank` the
// worker index (0 from the master), `sequence` the request id (the load's number in kLoad and
// kLoaded, 0 in kRegister and kShutdown). Payloads
// start with a fixed little-endian record (the structs below, copied as bytes: both ends run
// this build) followed, where noted, by row-major f32 matrix data. Decoders check lengths and
// shapes and answer a Status naming what was wrong; nothing from a peer is trusted.
//
//   kRegister      worker -> master   "I am worker i"                  (no payload)
//   kLoad          master -> worker   LoadRecord + the worker's block  (rows x cols f32)
//   kLoaded        worker -> master   the block is in place            (no payload)
//   kCompute       master -> worker   ComputeRecord + B                (bRows x bCols f32)
//   kResult        worker -> master   block x B                        (rows x bCols f32)
//   kCancel        master -> worker   abandon request `sequence`       (no payload)
//   kCancelReport  worker -> master   CancelRecord: where the task stopped
//   kTaskError     worker -> master   the task failed; payload = message text
//   kShutdown      master -> worker   leave (the worker's run() returns OK)
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/wire/header.h"

namespace cofab::coded {

enum class CodedOp : uint8_t {
  kRegister = 1,
  kLoad = 2,
  kLoaded = 3,
  kCompute = 4,
  kResult = 5,
  kCancel = 6,
  kCancelReport = 7,
  kTaskError = 8,
  kShutdown = 9,
};
const char* codedOpName(uint8_t op);

struct LoadRecord {
  int64_t rows = 0;  // rows of this worker's block (zero-padded rows included)
  int64_t cols = 0;
  int64_t tasks = 0;      // workers in the service (DelayQuery::tasks)
  int64_t rowBlock = 16;  // rows per cancellation check
  // DelayQuery::load: the fraction of the product one task computes, or 1 when the service's
  // delays do not scale with the load (CodedServiceOptions::loadScaledDelay false).
  double load = 1.0;
  double shiftMs = 0;  // shifted-exponential injected delay (0, 0: none)
  double tailMeanMs = 0;
  uint64_t seed = 1;
  double rowBlockDelayMs = 0;  // artificial extra time per row block (a slow worker), 0 = none
};

struct ComputeRecord {
  int64_t bRows = 0;
  int64_t bCols = 0;
};

// Where a cancelled task stopped.
enum class CancelStage : int64_t {
  kQueued = 0,     // never started: the cancel arrived while it waited behind other work
  kDelaying = 1,   // during the injected delay
  kComputing = 2,  // between row blocks of the product
  kFinished = 3,   // the task had already finished when the cancel arrived (nothing to stop)
};
const char* cancelStageName(CancelStage stage);

struct CancelRecord {
  int64_t stage = 0;  // CancelStage
  int64_t rowBlocksDone = 0;
  int64_t rowBlocksTotal = 0;
};

// `given` unless zero, else COFAB_CODED_SETUP_TIMEOUT_MS (setup: rendezvous, connect, load).
StatusOr<Duration> codedSetupTimeout(Duration given);

wire::Header codedHeader(CodedOp op, uint32_t sender, uint64_t request, uint64_t payloadBytes = 0);

// Payload = record bytes followed by `data` (may be empty).
template <typename Record>
std::vector<uint8_t> packRecord(const Record& record, std::span<const float> data = {});

// Whether a message carrying a rows x cols f32 matrix behind a `recordBytes` record can travel:
// the shape within the protocol's bounds (each side at most 2^24) and the payload within
// wire::kDefaultMaxPayload, the transports' message limit. InvalidArgument naming the shape and
// the limit otherwise. The master checks every block, B and result before it sends anything (a
// message past the limit would fail the receiver's connection: a dead worker instead of an
// error), and a worker checks its result before allocating it.
Status checkMatrixMessage(const char* what, int64_t rows, int64_t cols, size_t recordBytes);

// Checks that `payload` holds a Record followed by exactly `dataFloats(record)` floats.
StatusOr<LoadRecord> parseLoad(std::span<const uint8_t> payload, const float** data);
StatusOr<ComputeRecord> parseCompute(std::span<const uint8_t> payload, const float** data);
StatusOr<CancelRecord> parseCancel(std::span<const uint8_t> payload);

}  // namespace cofab::coded
