// The push-pull protocol between workers (PushPullClient) and aggregator daemons (cofab-aggd),
// and between a primary daemon and its backup. Shared by both ends, so it lives below them in
// fabric/. Every message is a wire::Header (fabric/wire/header.h, docs/WIRE.md) plus payload;
// this file only fixes how the aggregator uses the header's fields, the `opcode` byte in
// particular, so no new wire message types are needed. Byte-level description:
// docs/AGGREGATOR.md. Pure constants and functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "fabric/wire/header.h"

namespace cofab::ps {

// kPush opcode bits.
enum PushBits : uint8_t {
  kPushAverage = 1u << 0,    // reduce op: average (else sum)
  kPushDeliver = 1u << 1,    // send the result back to this pusher when the round completes
  kPushForwarded = 1u << 2,  // a primary replicating a worker's contribution to its backup
  kPushInt8 = 1u << 3,       // payload is compress::Compression::kInt8 of f32 (also on the reply)
  kPushOneBit = 1u << 4,     // payload is compress::Compression::kOneBit of f32 (also on the reply)
  // Fan-out (coded shuffling's multicast, fabric/coded/shuffle_relay.h): this one push is the
  // round's result as it is, delivered to every puller; no other contribution is waited for.
  kPushFanOut = 1u << 6,
  // With kPushOneBit: the daemon keeps an error-feedback residual per (key, chunk) for the
  // results it recompresses (docs/COMPRESSION.md "Reply feedback"); without it the reply is
  // compressed statelessly.
  kPushReplyFeedback = 1u << 7,
};
inline constexpr uint8_t kPushCompressionBits = kPushInt8 | kPushOneBit;
inline constexpr uint8_t kKnownPushBits = kPushAverage | kPushDeliver | kPushForwarded |
                                          kPushCompressionBits | kPushFanOut | kPushReplyFeedback;

// kControl opcodes used by the aggregator protocol. Values are wire format: append only.
enum class ControlOp : uint8_t {
  kAck = 1,          // daemon -> worker: the push (key, chunk, iteration) is applied durably
  kReject = 2,       // daemon -> worker: payload = RejectReason byte + UTF-8 reason text
  kRoundFailed = 3,  // daemon -> worker: the round was released without a result; payload text
  kPing = 4,         // worker -> daemon: liveness probe (heartbeat)
  kPong = 5,         // daemon -> worker: answer to kPing
  kForwardAck = 6,   // backup -> primary: the forwarded contribution is applied
  // daemon -> worker, first message on the connection when the daemon runs with credits
  // (--credit-bytes): payload = the window as 8 bytes little-endian. The worker keeps at most
  // that many unacknowledged payload bytes outstanding to this daemon; each kAck returns the
  // credit of the chunk it acknowledges (docs/TRANSFER.md).
  kCredit = 7,
  // Model store (docs/MODEL_STORE.md). Requests worker -> daemon carry key/chunk/chunkCount,
  // dtype f32 and the chunk's elements; answers echo key/chunk.
  kModelInit = 10,      // payload: initial value; answer kModelAck (iteration = version)
  kModelPull = 11,      // no payload; answer kModelValue
  kModelApply = 12,     // iteration = worker clock, payload: delta; answer kModelApplied
  kModelElastic = 13,   // iteration = alpha's f32 bits, payload: x; answer kModelValue (d)
  kModelAck = 14,       // daemon -> worker: init done (or already done); iteration = version
  kModelValue = 15,     // daemon -> worker: iteration = version, payload: value (or d)
  kModelApplied = 16,   // daemon -> worker: payload ModelApplyReply (+ reason text if dropped)
  kModelDeferred = 17,  // daemon -> worker: the apply is held; payload text names the slow worker
  kModelLeave = 18,     // worker -> daemon: this worker leaves the model store (no payload)
  // Version-bounded apply-and-pull (docs/MODEL_STORE.md "Staleness units"): iteration = the
  // chunk's model version the delta was computed on, payload: delta; answer kModelAppliedValue.
  kModelApplyPull = 19,
  // daemon -> worker: payload ModelApplyReply (byte 4..7: the daemon's version bound, u32) then
  // the chunk's value after the apply (or, dropped, unchanged); iteration = that value's version.
  kModelAppliedValue = 20,
  // worker -> daemon: free the fan-out slots (kPushFanOut) of keys [key, key + count), chunk 0,
  // once every puller has its result (coded shuffling: the uploader, after the epoch). Payload:
  // count as 8 bytes little-endian. Answered with kAck once every engine has released them;
  // pulls for released keys are then rejected with kReleased. Keys that are not fan-out slots,
  // or still have pullers waiting, are left alone.
  kFanOutRelease = 21,
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
  // 11 and 12: unassigned (were held for the transfer manager, which needed none); never sent.
  kUninitialized = 13,     // model store: pull/apply/elastic on a key nobody initialised
  kWrongCompression = 14,  // compressed chunk malformed, or its codec differs from the round's
  // 15: held for another branch; never sent by this one.
  kReleased = 16,     // a pull for a fan-out key its uploader released (kFanOutRelease)
  kPullBacklog = 17,  // a pull for a chunk nobody pushed yet, past the daemon's bound on those
};
inline constexpr uint8_t kMaxRejectReason = 17;

// Payload of kModelApplied (little-endian): outcome (0 applied, 1 dropped), 7 zero bytes,
// version, staleness; then, for a dropped update, UTF-8 text saying why.
struct ModelApplyReply {
  uint8_t outcome = 0;
  uint64_t version = 0;
  uint64_t staleness = 0;
};
inline constexpr size_t kModelApplyReplyBytes = 24;
// The largest model store chunk: its apply-and-pull answer (the record, then the chunk) must be
// one message within the transports' bound (wire::kDefaultMaxPayload). Clients cut tensors no
// larger; daemons refuse a larger chunk as oversized.
inline constexpr size_t kMaxModelChunkBytes = wire::kDefaultMaxPayload - kModelApplyReplyBytes;

// "finished_iteration", "beyond_window", ... (metric label values); "unknown" otherwise.
std::string_view rejectReasonName(RejectReason reason);

// A kReject payload: the reason byte (kMalformed when missing) and the daemon's text.
struct Reject {
  RejectReason reason = RejectReason::kMalformed;
  std::string text;
  std::string describe() const;  // "<reason name>: <text>"
};
Reject parseReject(const std::vector<uint8_t>& payload);

// The reason a daemon gave for rejecting a chunk of a failed push-pull, read back from the
// operation's Status (the client's text: "<daemon> rejected <chunk>: <reason name>: <text>",
// context around it allowed), so that callers can tell reasons that share a StatusCode apart
// (FailedPrecondition: finished_iteration, beyond_window, draining). nullopt when `status` is
// not such a reject.
std::optional<RejectReason> rejectReasonOf(const Status& status);

// The peer ids the transport handshake carries: "worker 3", "agg 1".
std::string workerPeerId(int rank);
std::string aggregatorPeerId(int id);
// Parses "worker N" / "agg N"; -1 if `peerId` is not of that form.
int parseWorkerPeerId(std::string_view peerId);
int parseAggregatorPeerId(std::string_view peerId);

// Store keys under the daemons' prefix.
std::string serverAddressKey(std::string_view prefix, int id);  // "<prefix>/server/<id>"
std::string serverCountKey(std::string_view prefix);            // "<prefix>/count"
// The most daemons a job may have: cofab-aggd's --servers and the clients' discovery agree.
inline constexpr int kMaxDaemons = 65536;
// "<prefix>/max_chunk_bytes/<i>": daemon i's --max-chunk-bytes. A frame over twice that breaks
// the connection instead of being rejected, so clients check their chunk size at connect.
std::string serverMaxChunkKey(std::string_view prefix, int id);
// The most keys one ControlOp::kFanOutRelease may name (a daemon refuses more, so that one
// request cannot stall its engines); a client releases a larger range in pieces.
inline constexpr uint64_t kMaxFanOutReleaseKeys = uint64_t{1} << 24;

// A control header echoing the chunk identity of `about`.
wire::Header controlHeader(ControlOp op, const wire::Header& about);

}  // namespace cofab::ps
