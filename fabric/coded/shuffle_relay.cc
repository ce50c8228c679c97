#include "fabric/coded/shuffle_relay.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fabric/ps/placement.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/registry.h"

namespace cofab::coded {

struct ShuffleEndpoint::Reply {
  wire::Header header;
  std::vector<uint8_t> payload;
};

StatusOr<std::unique_ptr<ShuffleEndpoint>> ShuffleEndpoint::connect(const std::string& address,
                                                                    int rank, Deadline deadline,
                                                                    const std::string& transport) {
  std::unique_ptr<ShuffleEndpoint> e(new ShuffleEndpoint);
  e->rank_ = rank;
  const std::string id = ps::workerPeerId(rank);
  COFAB_ASSIGN_OR_RETURN(e->ctx_, transport::Registry::create(transport, {.localId = id}));
  StatusOr<std::shared_ptr<transport::Connection>> c =
      e->ctx_->connect(address, {.localId = id}, deadline);
  if (!c.ok()) return c.status().withContext("shuffle " + id);
  e->conn_ = *c;
  e->postRecv();
  return e;
}

ShuffleEndpoint::~ShuffleEndpoint() {
  if (!ctx_) return;
  if (conn_ && conn_->status().ok()) {
    // Say goodbye so the daemon does not take this orderly exit for a lost worker.
    wire::Header h;
    h.type = wire::MessageType::kGoodbye;
    h.senderRank = static_cast<uint32_t>(rank_);
    auto sent = std::make_shared<std::atomic<bool>>(false);
    conn_->send(h, nullptr, 0, [sent](const Status&) { sent->store(true); });
    const Deadline d = Deadline::afterMs(1000);
    while (!sent->load() && !d.expired()) std::this_thread::sleep_for(Millis(1));
  }
  ctx_->close();
  ctx_->join();
}

void ShuffleEndpoint::postRecv() {
  conn_->recvOwned([this](const Status& st, const wire::Header& h, std::vector<uint8_t>&& p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok()) {
      if (error_.ok()) error_ = st.withContext("shuffle connection to the daemon");
    } else {
      replies_.push_back({h, std::move(p)});
    }
    cv_.notify_all();
    if (st.ok()) postRecv();
  });
}

StatusOr<ShuffleEndpoint::Reply> ShuffleEndpoint::next(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline.when(), [&] { return !replies_.empty() || !error_.ok(); });
  if (!replies_.empty()) {
    Reply r = std::move(replies_.front());
    replies_.pop_front();
    return r;
  }
  if (!error_.ok()) return error_;
  return DeadlineExceeded("shuffle: no answer from the daemon in time");
}

namespace {
// Sends still reading the caller's memory. upload() returns (also with an error) only once
// every send it started has completed: a daemon that refused the first message, or that is
// too slow for the deadline, would otherwise still be sent rows from memory the caller freed.
struct SendsInFlight {
  std::mutex mu;
  std::condition_variable cv;
  size_t left = 0;
  transport::SendCallback one() {
    return [self = this](const Status&) {
      std::lock_guard<std::mutex> lock(self->mu);
      if (--self->left == 0) self->cv.notify_all();
    };
  }
  // Waits for the last completion; past `deadline` it closes `conn`, which cancels what is
  // still queued (the callbacks follow promptly).
  void drain(transport::Connection& conn, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_until(lock, deadline.when(), [&] { return left == 0; })) return;
    lock.unlock();
    conn.close();
    lock.lock();
    cv.wait(lock, [&] { return left == 0; });
  }
};

Status replyError(const wire::Header& h, const std::vector<uint8_t>& p) {
  if (h.type != wire::MessageType::kControl) return OkStatus();
  // A reject starts with its reason byte; a failed round's payload is all text.
  std::string why;
  if (h.opcode == static_cast<uint8_t>(ps::ControlOp::kReject)) {
    why = ps::parseReject(p).describe();
  } else if (h.opcode == static_cast<uint8_t>(ps::ControlOp::kRoundFailed)) {
    why = p.empty() ? "the round failed" : std::string(p.begin(), p.end());
  } else {
    return OkStatus();
  }
  return RemoteError("shuffle: the daemon refused key " + std::to_string(h.key) + " iteration " +
                     std::to_string(h.iteration) + ": " + why);
}

// What a deadline message names: "2 of 5 (keys 101, 104)", at most 8 keys listed.
std::string missingKeys(size_t count, const std::vector<bool>& done,
                        const std::function<uint64_t(size_t)>& keyOf) {
  size_t missing = 0;
  std::string list;
  for (size_t i = 0; i < count; ++i) {
    if (done[i]) continue;
    if (missing < 8) list += (missing == 0 ? "" : ", ") + std::to_string(keyOf(i));
    ++missing;
  }
  if (missing > 8) list += ", ...";
  return std::to_string(missing) + " of " + std::to_string(count) + " (keys " + list + ")";
}

// next()'s DeadlineExceeded says only that the daemon was silent; the caller knows what for.
Status namingMissing(const Status& st, const std::string& what) {
  if (st.code() != StatusCode::kDeadlineExceeded) return st;
  return DeadlineExceeded("shuffle: " + what + " before the deadline");
}
}  // namespace

StatusOr<uint64_t> ShuffleEndpoint::upload(uint64_t epoch, uint64_t keyBase,
                                           std::span<const uint8_t> messages, size_t rowBytes,
                                           uint64_t planTag, Deadline deadline) {
  if (rowBytes == 0 || rowBytes % 4 != 0 || messages.size() % rowBytes != 0) {
    return InvalidArgument("shuffle upload: rowBytes must be a positive multiple of 4 dividing " +
                           std::to_string(messages.size()));
  }
  const size_t count = messages.size() / rowBytes;
  uint64_t sent = 0;
  SendsInFlight sends;
  sends.left = count;
  struct Drain {  // on every return below
    SendsInFlight& s;
    transport::Connection& c;
    Deadline d;
    ~Drain() { s.drain(c, d); }
  } drainOnReturn{sends, *conn_, deadline};
  for (size_t m = 0; m < count; ++m) {
    wire::Header h;
    h.type = wire::MessageType::kPush;
    h.opcode = ps::kPushFanOut;
    h.senderRank = static_cast<uint32_t>(rank_);
    h.key = keyBase + m;
    h.chunkCount = 1;
    h.iteration = epoch;
    h.dtype = DType::kF32;
    const transport::ConstSlice parts[] = {{messages.data() + m * rowBytes, rowBytes},
                                           {&planTag, kShufflePlanTagBytes}};
    conn_->send(h, parts, sends.one());
    sent += wire::kHeaderSize + rowBytes + kShufflePlanTagBytes;
  }
  // Each message's ack once: a stale one (an earlier call's, another epoch's) or a duplicate
  // must not make the upload look complete.
  std::vector<bool> acked(count, false);
  for (size_t got = 0; got < count;) {
    StatusOr<Reply> reply = next(deadline);
    if (!reply.ok()) {
      return namingMissing(reply.status(),
                           "epoch " + std::to_string(epoch) + " upload: no ack for " +
                               missingKeys(count, acked, [&](size_t m) { return keyBase + m; }));
    }
    Reply& r = *reply;
    // A release's answer (its sequence has the top bit: releaseOnce) may carry the key of a
    // message here, and in epoch 0 its iteration too, when it comes late: not an upload's ack.
    const bool mine = (r.header.sequence >> 63) == 0 && r.header.iteration == epoch &&
                      r.header.key >= keyBase && r.header.key - keyBase < count;
    if (!mine) continue;
    COFAB_RETURN_IF_ERROR(replyError(r.header, r.payload));
    if (r.header.type == wire::MessageType::kControl &&
        r.header.opcode == static_cast<uint8_t>(ps::ControlOp::kAck) &&
        !acked[r.header.key - keyBase]) {
      acked[r.header.key - keyBase] = true;
      ++got;
    }
  }
  return sent;
}

Status ShuffleEndpoint::release(uint64_t keyBase, uint64_t count, Deadline deadline) {
  // A daemon takes at most kMaxFanOutReleaseKeys keys per request: an epoch of more uploads
  // (allowed up to 2^32 - 1) used to fail its release and leave every slot allocated.
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, ps::kMaxFanOutReleaseKeys);
    COFAB_RETURN_IF_ERROR(releaseOnce(keyBase + done, n, deadline));
    done += n;
  }
  return OkStatus();
}

Status ShuffleEndpoint::releaseOnce(uint64_t keyBase, uint64_t count, Deadline deadline) {
  if (count == 0) return OkStatus();
  // Owned by the send: an error return below must not free it under a queued send.
  auto payload = std::make_shared<std::vector<uint8_t>>(8);
  for (size_t i = 0; i < 8; ++i) (*payload)[i] = static_cast<uint8_t>(count >> (8 * i));
  wire::Header h;
  h.type = wire::MessageType::kControl;
  h.opcode = static_cast<uint8_t>(ps::ControlOp::kFanOutRelease);
  h.senderRank = static_cast<uint32_t>(rank_);
  h.key = keyBase;
  h.chunkCount = 1;
  h.dtype = DType::kU8;
  h.sequence = (uint64_t{1} << 63) | ++releases_;
  conn_->send(h, payload->data(), payload->size(), [payload](const Status&) {});
  for (;;) {
    StatusOr<Reply> reply = next(deadline);
    if (!reply.ok()) {
      return namingMissing(reply.status(), "no answer to the release of keys " +
                                               std::to_string(keyBase) + " + " +
                                               std::to_string(count));
    }
    const Reply& r = *reply;
    // A late ack or reject for an earlier upload (its key may be keyBase too) is not this
    // release's answer: only a reply echoing the release's sequence is.
    if (r.header.type != wire::MessageType::kControl || r.header.sequence != h.sequence) continue;
    COFAB_RETURN_IF_ERROR(replyError(r.header, r.payload));
    if (r.header.opcode == static_cast<uint8_t>(ps::ControlOp::kAck)) return OkStatus();
  }
}

Status ShuffleEndpoint::pull(uint64_t epoch, uint64_t keyBase, std::span<const int64_t> offsets,
                             size_t rowBytes, uint64_t planTag, std::span<uint8_t> out,
                             Deadline deadline) {
  if (out.size() != offsets.size() * rowBytes) {
    return InvalidArgument("shuffle pull: out must hold " + std::to_string(offsets.size()) +
                           " rows of " + std::to_string(rowBytes) + " bytes");
  }
  std::unordered_map<uint64_t, size_t> slot;
  for (size_t i = 0; i < offsets.size(); ++i) {
    wire::Header h;
    h.type = wire::MessageType::kPull;
    h.senderRank = static_cast<uint32_t>(rank_);
    h.key = keyBase + static_cast<uint64_t>(offsets[i]);
    h.chunkCount = 1;
    h.iteration = epoch;
    h.dtype = DType::kF32;
    slot[h.key] = i;
    conn_->send(h, nullptr, 0, [](const Status&) {});
  }
  // Replies come from several engine threads: match them by key. Replies for other keys are
  // left over from an earlier call that failed at its first refusal: skip them. Each row is
  // counted once: a duplicate reply (a leftover of this very key) must not stand in for a row
  // that never came.
  std::vector<bool> filled(offsets.size(), false);
  for (size_t got = 0; got < offsets.size();) {
    StatusOr<Reply> reply = next(deadline);
    if (!reply.ok()) {
      return namingMissing(
          reply.status(),
          "epoch " + std::to_string(epoch) + " pull: no row for " +
              missingKeys(offsets.size(), filled, [&](size_t i) {
                return keyBase + static_cast<uint64_t>(offsets[i]);
              }));
    }
    Reply& r = *reply;
    if (slot.count(r.header.key) == 0 || r.header.iteration != epoch) continue;
    COFAB_RETURN_IF_ERROR(replyError(r.header, r.payload));
    if (r.header.type != wire::MessageType::kPullReply) continue;
    auto it = slot.find(r.header.key);
    if (r.payload.size() != rowBytes + kShufflePlanTagBytes) {
      const size_t row = r.payload.size() - std::min(r.payload.size(), kShufflePlanTagBytes);
      return InvalidArgument("shuffle pull: key " + std::to_string(r.header.key) +
                             " holds a row of " + std::to_string(row) +
                             " bytes, this worker's rowBytes is " + std::to_string(rowBytes) +
                             ": the master and the workers must use the same rowBytes");
    }
    uint64_t theirs = 0;
    std::memcpy(&theirs, r.payload.data() + rowBytes, kShufflePlanTagBytes);
    if (theirs != planTag) {
      return FailedPrecondition(
          "shuffle pull: key " + std::to_string(r.header.key) + " was uploaded for another plan " +
          "(tag " + std::to_string(theirs) + ", this worker's " + std::to_string(planTag) +
          "): the master and the workers must plan the same epoch and mode with the same "
          "CodedShuffle options (workers, cacheFraction, rows, seed)");
    }
    std::memcpy(out.data() + it->second * rowBytes, r.payload.data(), rowBytes);
    if (!filled[it->second]) {
      filled[it->second] = true;
      ++got;
    }
  }
  return OkStatus();
}

namespace {
// Every epoch has its own keys (iteration 0): the number of messages varies between epochs, and
// a key skipping an epoch would fall out of the daemon's one-round window. The epoch is in range
// (shuffleCheckPlan) and an epoch has fewer than 2^32 messages (shuffleUploadEpoch), so no two
// epochs or modes share a key.
uint64_t epochKeyBase(int64_t epoch, bool coded) {
  return (coded ? 0 : 1ull << 62) + (static_cast<uint64_t>(epoch) << 32);
}
}  // namespace

uint64_t shufflePlanTag(const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan,
                        bool coded, size_t rowBytes) {
  uint64_t h = 0;
  auto mix = [&h](uint64_t v) { h = ps::mix64(h ^ v); };
  mix(uint64_t(shuffle.workers()));
  mix(uint64_t(shuffle.cachedBy()));
  mix(uint64_t(shuffle.rows()));
  mix(uint64_t(plan.epoch));
  mix(coded ? 1 : 0);
  mix(rowBytes);
  for (const auto* lists : {&plan.batch, &plan.source}) {
    for (const auto& list : *lists) {
      mix(list.size());
      for (int64_t v : list) mix(uint64_t(v));
    }
  }
  for (const coding::ShuffleMessage& m : plan.messages) {
    mix(m.workers.size());
    for (int w : m.workers) mix(uint64_t(w));
    for (int64_t r : m.rows) mix(uint64_t(r));
  }
  return h;
}

Status shuffleCheckPlan(const coding::ShufflePlan& plan) {
  if (plan.epoch < 0 || plan.epoch >= kShuffleEpochLimit) {
    return InvalidArgument("shuffle: epoch " + std::to_string(plan.epoch) +
                           " outside [0, 2^30): two epochs would share message keys");
  }
  if (plan.source.size() != plan.batch.size()) {
    return InvalidArgument("shuffle: the plan's batch and source lists differ in size");
  }
  for (size_t w = 0; w < plan.batch.size(); ++w) {
    if (plan.source[w].size() != plan.batch[w].size()) {
      return InvalidArgument("shuffle: the plan's batch and source of worker " +
                             std::to_string(w) + " differ in size");
    }
  }
  return OkStatus();
}

std::vector<int64_t> shuffleOffsetsFor(const coding::ShufflePlan& plan, int worker, bool coded) {
  std::vector<int64_t> out;
  if (!shuffleCheckPlan(plan).ok()) return out;
  if (coded) {
    for (size_t m = 0; m < plan.messages.size(); ++m) {
      const auto& ws = plan.messages[m].workers;
      if (std::find(ws.begin(), ws.end(), worker) != ws.end()) {
        out.push_back(static_cast<int64_t>(m));
      }
    }
    return out;
  }
  int64_t next = 0;
  for (int w = 0; w < static_cast<int>(plan.batch.size()); ++w) {
    for (size_t i = 0; i < plan.batch[w].size(); ++i) {
      if (plan.source[w][i] < 0) continue;  // cached there: nothing sent
      if (w == worker) out.push_back(next);
      ++next;
    }
  }
  return out;
}

StatusOr<std::vector<uint8_t>> shuffleEpochMessages(const coding::CodedShuffle& shuffle,
                                                    const coding::ShufflePlan& plan, bool coded,
                                                    std::span<const uint8_t> data,
                                                    size_t rowBytes) {
  COFAB_RETURN_IF_ERROR(shuffleCheckPlan(plan));
  std::vector<uint8_t> messages;
  if (coded) {
    messages.resize(plan.messages.size() * rowBytes);
    COFAB_RETURN_IF_ERROR(shuffle.encode(plan, data, rowBytes, messages));
  } else {
    // The same checks encode() makes for the coded path: the plain rows are read from `data`.
    if (rowBytes == 0 || data.size() != static_cast<size_t>(shuffle.rows()) * rowBytes) {
      return InvalidArgument("shuffle upload: data must be rows x rowBytes = " +
                             std::to_string(shuffle.rows()) + " x " + std::to_string(rowBytes) +
                             " bytes, got " + std::to_string(data.size()));
    }
    for (size_t w = 0; w < plan.batch.size(); ++w) {
      for (size_t i = 0; i < plan.batch[w].size(); ++i) {
        if (plan.source[w][i] < 0) continue;
        const int64_t r = plan.batch[w][i];
        if (r < 0 || r >= shuffle.rows()) {
          return InvalidArgument("shuffle upload: the plan names row " + std::to_string(r) +
                                 " out of range");
        }
        const uint8_t* row = data.data() + static_cast<size_t>(r) * rowBytes;
        messages.insert(messages.end(), row, row + rowBytes);
      }
    }
  }
  return messages;
}

StatusOr<ShuffleEpochStats> shuffleUploadEpoch(ShuffleEndpoint& master,
                                               const coding::CodedShuffle& shuffle,
                                               const coding::ShufflePlan& plan, bool coded,
                                               std::span<const uint8_t> data, size_t rowBytes,
                                               Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(std::vector<uint8_t> messages,
                         shuffleEpochMessages(shuffle, plan, coded, data, rowBytes));
  ShuffleEpochStats stats;
  stats.messages = static_cast<int64_t>(messages.size() / rowBytes);
  stats.payloadBytes = messages.size();
  if (messages.empty()) return stats;
  if (stats.messages > static_cast<int64_t>(UINT32_MAX)) {
    return InvalidArgument("shuffle upload: " + std::to_string(stats.messages) +
                           " messages in one epoch; its keys hold at most 2^32 - 1");
  }
  COFAB_ASSIGN_OR_RETURN(
      stats.masterEgressBytes,
      master.upload(0, epochKeyBase(plan.epoch, coded), messages, rowBytes,
                    shufflePlanTag(shuffle, plan, coded, rowBytes), deadline));
  return stats;
}

Status shuffleReleaseEpoch(ShuffleEndpoint& master, const coding::ShufflePlan& plan, bool coded,
                           Deadline deadline) {
  COFAB_RETURN_IF_ERROR(shuffleCheckPlan(plan));
  uint64_t count = 0;
  if (coded) {
    count = plan.messages.size();
  } else {
    for (const auto& sources : plan.source) {
      for (int64_t src : sources) count += src >= 0 ? 1 : 0;  // one upload per needed row
    }
  }
  return master.release(epochKeyBase(plan.epoch, coded), count, deadline)
      .withContext("shuffle: releasing epoch " + std::to_string(plan.epoch));
}

Status shuffleReceiveEpoch(ShuffleEndpoint& worker, const coding::CodedShuffle& shuffle,
                           const coding::ShufflePlan& plan, bool coded,
                           const coding::WorkerCache& cache, size_t rowBytes,
                           std::span<uint8_t> batchOut, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(shuffleCheckPlan(plan));
  if (rowBytes != cache.rowBytes()) {  // before pulling anything
    return InvalidArgument("shuffle receive: rowBytes " + std::to_string(rowBytes) +
                           " does not match the cache's rows of " +
                           std::to_string(cache.rowBytes()) + " bytes");
  }
  const std::vector<int64_t> offsets = shuffleOffsetsFor(plan, cache.worker(), coded);
  std::vector<uint8_t> pulled(offsets.size() * rowBytes);
  COFAB_RETURN_IF_ERROR(worker.pull(0, epochKeyBase(plan.epoch, coded), offsets, rowBytes,
                                    shufflePlanTag(shuffle, plan, coded, rowBytes), pulled,
                                    deadline));
  return shuffleBuildBatch(shuffle, plan, coded, cache, rowBytes, offsets, pulled, batchOut);
}

Status shuffleBuildBatch(const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan,
                         bool coded, const coding::WorkerCache& cache, size_t rowBytes,
                         std::span<const int64_t> offsets, std::span<const uint8_t> received,
                         std::span<uint8_t> batchOut) {
  const int w = cache.worker();
  if (rowBytes == 0 || rowBytes != cache.rowBytes()) {
    return InvalidArgument("shuffle receive: rowBytes " + std::to_string(rowBytes) +
                           " does not match the cache's rows of " +
                           std::to_string(cache.rowBytes()) + " bytes");
  }
  if (received.size() != offsets.size() * rowBytes) {
    return InvalidArgument("shuffle receive: one received row per offset expected");
  }
  COFAB_RETURN_IF_ERROR(shuffleCheckPlan(plan));
  if (w < 0 || w >= static_cast<int>(plan.batch.size())) {
    return InvalidArgument("shuffle receive: the plan has no batch for worker " +
                           std::to_string(w));
  }
  // The plain path takes one received row per row the plan sends this worker, in order.
  const auto& sources = plan.source[w];
  const size_t sent = static_cast<size_t>(
      std::count_if(sources.begin(), sources.end(), [](int64_t s) { return s >= 0; }));
  if (!coded && offsets.size() != sent) {
    return InvalidArgument("shuffle receive: worker " + std::to_string(w) + " needs " +
                           std::to_string(sent) + " received rows, got " +
                           std::to_string(offsets.size()));
  }
  if (coded) {
    // decode() indexes messages by their plan index: place the received ones there.
    std::vector<uint8_t> all(plan.messages.size() * rowBytes, 0);
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (offsets[i] < 0 || static_cast<size_t>(offsets[i]) >= plan.messages.size()) {
        return InvalidArgument("shuffle receive: offset " + std::to_string(offsets[i]) +
                               " is not one of the epoch's " +
                               std::to_string(plan.messages.size()) + " messages");
      }
      std::memcpy(all.data() + offsets[i] * rowBytes, received.data() + i * rowBytes, rowBytes);
    }
    return shuffle.decode(plan, cache, all, batchOut);
  }
  const auto& batch = plan.batch[w];
  if (batchOut.size() != batch.size() * rowBytes) {
    return InvalidArgument("shuffle receive: batchOut must hold the worker's batch");
  }
  size_t next = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const uint8_t* src = nullptr;
    if (plan.source[w][i] < 0) {
      src = cache.row(batch[i]);
      if (src == nullptr) {
        return FailedPrecondition("shuffle receive: row " + std::to_string(batch[i]) +
                                  " is not in worker " + std::to_string(w) + "'s cache");
      }
    } else {
      src = received.data() + (next++) * rowBytes;
    }
    std::memcpy(batchOut.data() + i * rowBytes, src, rowBytes);
  }
  return OkStatus();
}

}  // namespace cofab::coded
