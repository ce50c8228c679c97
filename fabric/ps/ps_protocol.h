// The push-pull protocol between workers (PushPullClient) and aggregator daemons (cofab-aggd),
// and between a primary daemon and its backup. Shared by both ends, so it lives below them in
// fabric/. Every message is a wire::Header (fabric/wire/header.h, docs/WIRE.md) plus payload;
// this file only fixes how the aggregator uses the header's fields, the `opcode` byte in
// particular, so no new wire message types are needed. Byte-level description:
// docs/AGGREGATOR.md. Pure constants and functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fabric/wire/header.h"

namespace cofab::ps {

// kPush opcode bits.
enum PushBits : uint8_t {
  kPushAverage = 1u << 0,    // reduce op: average (else sum)
  kPushDeliver = 1u << 1,    // send the result back to this pusher when the round completes
  kPushForwarded = 1u << 2,  // a primary replicating a worker's contribution to its backup
  // Fan-out (coded shuffling's multicast, fabric/coded/shuffle_relay.h): this one push is the
  // round's result as it is, delivered to every puller; no other contribution is waited for.
  kPushFanOut = 1u << 6,
};
inline constexpr uint8_t kKnownPushBits =
    kPushAverage | kPushDeliver | kPushForwarded | kPushFanOut;

// kControl opcodes used by the aggregator protocol. Values are wire format: append only.
enum class ControlOp : uint8_t {
  kAck = 1,          // daemon -> worker: the push (key, chunk, iteration) is applied durably
  kReject = 2,       // daemon -> worker: payload = RejectReason byte + UTF-8 reason text
  kRoundFailed = 3,  // daemon -> worker: the round was released without a result; payload text
  kPing = 4,         // worker -> daemon: liveness probe (heartbeat)
  kPong = 5,         // daemon -> worker: answer to kPing
  kForwardAck = 6,   // backup -> primary: the forwarded contribution is applied
};

// Why a daemon refused a chunk (first payload byte of kReject). Append only.
enum class RejectReason : uint8_t {
  kFinishedIteration = 1,  // the round for that iteration is over
  kBeyondWindow = 2,       // iteration ahead of the open round by more than the window
  kUnknownWorker = 3,      // sender rank outside the job, or not the rank the connection claimed
  kWrongSize = 4,          // payload size differs from the chunk's established size
  kWrongDType = 5,         // dtype differs from the chunk's established dtype
  kUnsupportedDType = 6,   // not f32, f64, f16 or bf16
  kMalformed = 7,          // header fields inconsistent (chunk index, opcode bits, ...)
  kOversized = 8,          // payload larger than the daemon's --max-chunk-bytes
  kWrongOp = 9,            // sum/average differs from the round's
  kDraining = 10,          // the daemon is shutting down
};
inline constexpr uint8_t kMaxRejectReason = 10;

// "finished_iteration", "beyond_window", ... (metric label values); "unknown" otherwise.
std::string_view rejectReasonName(RejectReason reason);

// The peer ids the transport handshake carries: "worker 3", "agg 1".
std::string workerPeerId(int rank);
std::string aggregatorPeerId(int id);
// Parses "worker N" / "agg N"; -1 if `peerId` is not of that form.
int parseWorkerPeerId(std::string_view peerId);
int parseAggregatorPeerId(std::string_view peerId);

// Store keys under the daemons' prefix.
std::string serverAddressKey(std::string_view prefix, int id);  // "<prefix>/server/<id>"
std::string serverCountKey(std::string_view prefix);            // "<prefix>/count"

// A control header echoing the chunk identity of `about`.
wire::Header controlHeader(ControlOp op, const wire::Header& about);

}  // namespace cofab::ps
