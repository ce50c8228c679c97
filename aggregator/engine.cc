#include "aggregator/engine.h"

#include <algorithm>
#include <sstream>

#include "aggregator/compressed_reduce.h"
#include "aggregator/model_store.h"
#include "aggregator/reducer.h"
#include "core/clock.h"
#include "core/log.h"

namespace cofab::aggregator {

using ps::RejectReason;

struct Engine::Slot {
  uint64_t key = 0;
  uint32_t chunk = 0;
  uint32_t chunkCount = 0;
  DType dtype = DType::kF32;
  // 0 until a push established the chunk: a pull may create the slot first (pushes are never
  // empty), with the pull's dtype and chunkCount until then.
  size_t bytes = 0;
  uint64_t cur = 0;

  // The open round.
  std::vector<Payload> contribution;             // by rank
  std::vector<uint8_t> state;                    // 0 absent, 1 waiting for backup, 2 durable
  // By rank: when it was forwarded to the backup; 0 once the backup acked it (the send is over:
  // the backup has it all) or never forwarded.
  std::vector<int64_t> forwardedNs;
  std::vector<std::shared_ptr<Peer>> pusher;     // who to ack, by rank
  std::vector<std::shared_ptr<Peer>> deliverTo;  // push-back results
  std::vector<std::pair<std::shared_ptr<Peer>, wire::Header>> pullers;
  int present = 0;
  int durable = 0;
  bool average = false;
  int64_t openedNs = 0;
  bool counted = false;  // in open_rounds: kept equal to open() by Engine::noteOpen

  // The last finished round: answers duplicates and late pulls.
  bool hasLast = false;
  uint64_t lastIter = 0;  // the round lastResult / lastFailure belong to
  std::shared_ptr<const std::vector<uint8_t>> lastResult;
  std::string lastFailure;  // non-empty: it was released without a result

  // Compressed push-pull (compressed_reduce.h): codec, element count and block of every
  // contribution; with reply feedback (ps::kPushReplyFeedback) the residual of the daemon's own
  // 1-bit recompression of the results, logicalCount floats allocated at the first completed
  // round and kept as long as the slot (docs/COMPRESSION.md "Reply feedback").
  compress::Compression codec = compress::Compression::kNone;
  size_t logicalCount = 0;
  size_t block = 0;
  bool replyFeedback = false;
  std::vector<float> residual;

  // Got a fan-out push (the upload is the result): ControlOp::kFanOutRelease may free it.
  bool fanOut = false;

  bool open() const { return present > 0 || !pullers.empty(); }
};

namespace {
// The most rounds nobody contributed to that a later push passes over (Engine::onPush): rounds
// every worker dropped, several in a row when a key's updates keep missing their deadlines.
// Further ahead is beyond the window, as a push for a round after an open one always is.
constexpr uint64_t kMaxSkippedRounds = 8;
std::string roundName(uint64_t key, uint32_t chunk, uint64_t iteration) {
  return "key=" + std::to_string(key) + " chunk=" + std::to_string(chunk) +
         " iteration=" + std::to_string(iteration);
}
}  // namespace

void Engine::countCompressedOut(const Slot& s, uint64_t sends, size_t resultBytes) {
  if (s.codec == compress::Compression::kNone) return;
  metrics_.sync.compressedBytesOut.fetch_add(sends * resultBytes, std::memory_order_relaxed);
  metrics_.sync.logicalBytesOut.fetch_add(sends * s.logicalCount * sizeof(float),
                                          std::memory_order_relaxed);
}

Engine::Engine(int index, EngineOptions options, Metrics& metrics, ForwardFn forward,
               BackupSilentFn backupSilent)
    : index_(index),
      options_(options),
      metrics_(metrics),
      forward_(std::move(forward)),
      backupSilent_(std::move(backupSilent)),
      groups_(GradientGroups::create(options.numWorkers, options.gradientStragglers).value()),
      goneSinceNs_(static_cast<size_t>(options.numWorkers), 0),
      goneReason_(static_cast<size_t>(options.numWorkers)),
      goneLeft_(static_cast<size_t>(options.numWorkers), false),
      models_(std::make_unique<ModelStore>(
          ModelStoreOptions{options.numWorkers, options.staleness, options.deadWorkerMs,
                            options.versionStaleness},
          metrics)) {
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { stop(); }

void Engine::post(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(event));
    metrics_.engineQueueDepth[static_cast<size_t>(index_)].store(queue_.size(),
                                                                 std::memory_order_relaxed);
  }
  cv_.notify_one();
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Engine::run() {
  std::vector<Event> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, Millis(50), [&] { return !queue_.empty() || stop_; });
      if (queue_.empty() && stop_) break;
      batch.swap(queue_);
      metrics_.engineQueueDepth[static_cast<size_t>(index_)].store(0, std::memory_order_relaxed);
    }
    for (Event& e : batch) {
      // Credits: a push is consumed (its credit returns) once its engine takes it.
      // Before handle(): the ack it may send must never overtake the credit it returns.
      if (e.kind == Event::Kind::kPush && e.payload) {
        metrics_.noteConsumed(e.peer ? &e.peer->creditUsed : nullptr, e.payload->size());
      }
      handle(e);
    }
    batch.clear();
    tick();
  }
}

void Engine::handle(Event& e) {
  switch (e.kind) {
    case Event::Kind::kPush:
      onPush(e);
      break;
    case Event::Kind::kPull:
      onPull(e);
      break;
    case Event::Kind::kForwardAck:
      onForwardAck(e);
      break;
    case Event::Kind::kWorkerGone:
      onWorkerGone(e);
      if (!e.left) models_->onWorkerGone(e.rank, e.reason);
      break;
    case Event::Kind::kWorkerBack:
      onWorkerBack(e);
      break;
    case Event::Kind::kBackupLost:
      onBackupLost();
      break;
    case Event::Kind::kDrain:
      failOpenRounds(e.reason);
      models_->drain(e.reason);
      break;
    case Event::Kind::kModel:
      models_->onMessage(e);
      break;
    case Event::Kind::kRelease:
      onRelease(e);
      break;
  }
}

std::unique_ptr<Engine::Slot> Engine::newSlot(const wire::Header& h) const {
  auto s = std::make_unique<Slot>();
  s->key = h.key;
  s->chunk = h.chunkIndex;
  s->chunkCount = h.chunkCount;
  s->dtype = h.dtype;
  s->cur = options_.firstIteration;
  const auto n = static_cast<size_t>(options_.numWorkers);
  s->contribution.resize(n);
  s->state.assign(n, 0);
  s->forwardedNs.assign(n, 0);
  s->pusher.resize(n);
  return s;
}

Engine::Slot& Engine::slotFor(const wire::Header& h, bool* created) {
  auto& ptr = slots_[ChunkId{h.key, h.chunkIndex}];
  *created = ptr == nullptr;
  if (!ptr) {
    ptr = newSlot(h);
    metrics_.slots.fetch_add(1, std::memory_order_relaxed);
  }
  return *ptr;
}

void Engine::onPush(Event& e) {
  const wire::Header& h = e.header;
  const bool forwarded = (h.opcode & ps::kPushForwarded) != 0;
  const int rank = static_cast<int>(h.senderRank);
  // A compressed contribution must be well formed before it may establish a slot.
  compress::EncodedInfo encoded;
  auto codec = compressionOfPush(h.opcode);
  if (codec.ok() && *codec != compress::Compression::kNone) {
    auto info = h.dtype == DType::kF32
                    ? compress::inspect(*codec, e.payload->data(), e.payload->size())
                    : StatusOr<compress::EncodedInfo>(
                          InvalidArgument("compression applies to f32 chunks only"));
    if (!info.ok()) codec = info.status();
    if (info.ok()) encoded = *info;
  }
  if (!codec.ok()) {
    e.peer->reject(metrics_, RejectReason::kWrongCompression, h, codec.status().message());
    return;
  }
  // --max-chunk-bytes bounds what the chunk decodes to as well: the reduction allocates that
  // (per contribution), and a few KiB of 1-bit code may claim 32 times as many bytes.
  if (encoded.count > options_.maxChunkBytes / sizeof(float)) {
    e.peer->reject(metrics_, RejectReason::kOversized, h,
                   std::string(compress::compressionName(*codec)) + " chunk decodes to " +
                       std::to_string(encoded.count) + " f32 (" +
                       std::to_string(encoded.count * sizeof(float)) +
                       " bytes), beyond --max-chunk-bytes " +
                       std::to_string(options_.maxChunkBytes));
    return;
  }
  // A refused push leaves no state behind: it is checked against the slot (or a new one, not
  // yet kept), and creates the slot or defines its shape only once it is stored (define below).
  const ChunkId id{h.key, h.chunkIndex};
  auto found = slots_.find(id);
  std::unique_ptr<Slot> fresh = found == slots_.end() ? newSlot(h) : nullptr;
  Slot& s = fresh ? *fresh : *found->second;
  const bool replyFeedback = (h.opcode & ps::kPushReplyFeedback) != 0;
  // No push stored yet (a new slot, or one only pulls reached): this one will define the chunk.
  const bool defines = s.bytes == 0;
  auto define = [&] {
    if (!defines) return;
    if (fresh) {
      slots_[id] = std::move(fresh);  // `s` stays valid: the Slot itself does not move
      metrics_.slots.fetch_add(1, std::memory_order_relaxed);
    } else {
      adoptPushShape(s, h);
    }
    s.bytes = e.payload->size();
    s.codec = *codec;
    s.logicalCount = encoded.count;
    s.block = encoded.block;
    s.replyFeedback = replyFeedback;
  };
  // Draining: the contribution a round already open waits for (or a resend of the round just
  // finished) is still taken, so that round completes; anything that would open a round is not.
  const bool intoOpenRound = !fresh && s.present > 0 && h.iteration == s.cur;
  const bool resend = !fresh && s.hasLast && h.iteration == s.lastIter;
  if (e.draining && !intoOpenRound && !resend) {
    e.peer->reject(metrics_, RejectReason::kDraining, h, "the daemon is shutting down");
    return;
  }
  if (!defines && (*codec != s.codec || encoded.count != s.logicalCount ||
                   encoded.block != s.block || replyFeedback != s.replyFeedback)) {
    auto describe = [](compress::Compression c, size_t count, size_t block, bool feedback) {
      return std::string(compress::compressionName(c)) + " (" + std::to_string(count) +
             " elements, block " + std::to_string(block) + (feedback ? ", reply feedback)" : ")");
    };
    e.peer->reject(metrics_, RejectReason::kWrongCompression, h,
                   "chunk is " + describe(s.codec, s.logicalCount, s.block, s.replyFeedback) +
                       ", got " + describe(*codec, encoded.count, encoded.block, replyFeedback));
    return;
  }
  if (!defines && h.dtype != s.dtype) {
    e.peer->reject(metrics_, RejectReason::kWrongDType, h,
                   "chunk has dtype " + std::string(dtypeName(s.dtype)) + ", got " +
                       std::string(dtypeName(h.dtype)));
    return;
  }
  if (!defines && (e.payload->size() != s.bytes || h.chunkCount != s.chunkCount)) {
    e.peer->reject(metrics_, RejectReason::kWrongSize, h,
                   "chunk has " + std::to_string(s.bytes) + " bytes of " +
                       std::to_string(s.chunkCount) + " chunks, got " +
                       std::to_string(e.payload->size()) + " bytes of " +
                       std::to_string(h.chunkCount));
    return;
  }
  const bool deliver = (h.opcode & ps::kPushDeliver) != 0;
  if (resend) {
    // A fan-out upload is the round's result itself, so a resend carries the same bytes. Other
    // bytes are another upload to keys nobody released (a second shuffle of the same shape, a
    // job resumed at an epoch it never released): acking it as a resend would leave the old
    // rows for the workers to decode, with no error anywhere. Compared only on this rare path.
    if ((h.opcode & ps::kPushFanOut) != 0 && !forwarded && s.fanOut && s.lastResult &&
        *s.lastResult != *e.payload) {
      e.peer->reject(metrics_, RejectReason::kWrongOp, h,
                     "these keys still hold another upload of iteration " +
                         std::to_string(s.lastIter) + ": release it first (or use other keys)");
      return;
    }
    // A resend for the round finished last (lost ack, or a failover): answer, never apply.
    metrics_.chunksDuplicate.fetch_add(1, std::memory_order_relaxed);
    if (forwarded) {
      e.peer->sendControl(ps::ControlOp::kForwardAck, h);
      return;
    }
    if (!s.lastFailure.empty()) {
      e.peer->sendText(ps::ControlOp::kRoundFailed, h, s.lastFailure);
      return;
    }
    e.peer->sendControl(ps::ControlOp::kAck, h);
    if (deliver) {
      e.peer->sendResult(metrics_, h, s.lastResult);
      countCompressedOut(s, 1, s.lastResult->size());
    }
    return;
  }
  if (h.iteration < s.cur) {
    e.peer->reject(metrics_, RejectReason::kFinishedIteration, h,
                   "the open round is iteration " + std::to_string(s.cur));
    return;
  }
  // Rounds nobody contributed to (or pulls), up to kMaxSkippedRounds of them, are passed over by
  // a push for a later one: every worker dropped them (a TransferManager's dropped unit uses its
  // round up). A worker that did send one of them later gets finished_iteration, loudly,
  // instead of being summed with another round. Applied below, once nothing can refuse the push.
  const bool skip = h.iteration > s.cur && h.iteration - s.cur <= kMaxSkippedRounds && !s.open();
  auto passOver = [&] {
    if (!skip) return;
    metrics_.roundsSkipped.fetch_add(h.iteration - s.cur, std::memory_order_relaxed);
    s.cur = h.iteration;  // the kept result stays, answering resends of its round (lastIter)
  };
  if (h.iteration > s.cur && !skip) {
    e.peer->reject(metrics_, RejectReason::kBeyondWindow, h,
                   "the open round is iteration " + std::to_string(s.cur) +
                       " and the window is 0 (one round at a time per chunk)");
    return;
  }
  if ((h.opcode & ps::kPushFanOut) != 0 && !forwarded) {
    // Fan-out: this upload is the result, for every puller of the round (coded shuffling).
    if (s.present > 0) {
      e.peer->reject(metrics_, RejectReason::kWrongOp, h,
                     "a fan-out push into a round that already has contributions");
      return;
    }
    passOver();
    define();
    metrics_.chunksApplied.fetch_add(1, std::memory_order_relaxed);
    metrics_.noteWorkerIteration(rank, h.iteration);
    s.fanOut = true;
    e.peer->sendControl(ps::ControlOp::kAck, h);
    if (deliver) s.deliverTo.push_back(e.peer);
    finishRound(s, e.payload);
    return;
  }
  const bool average = (h.opcode & ps::kPushAverage) != 0;
  if (average && groups_.enabled()) {
    // The reducer would divide by the number of groups, not of data partitions.
    e.peer->reject(metrics_, RejectReason::kWrongOp, h,
                   "gradient-coded rounds are sums (divide by the number of workers yourself)");
    return;
  }
  if (s.present > 0 && average != s.average) {
    e.peer->reject(metrics_, RejectReason::kWrongOp, h,
                   std::string("the round is a ") + (s.average ? "average" : "sum"));
    return;
  }
  passOver();
  define();  // from here on the push is stored, or a duplicate of one stored
  const auto r = static_cast<size_t>(rank);
  if (!forwarded) {
    // A resend on the same connection must not get the result twice.
    if (deliver && std::find(s.deliverTo.begin(), s.deliverTo.end(), e.peer) == s.deliverTo.end()) {
      s.deliverTo.push_back(e.peer);
    }
    s.pusher[r] = e.peer;
  }
  if (s.state[r] != 0) {
    // Duplicate within the open round: applied once; acked again once durable.
    metrics_.chunksDuplicate.fetch_add(1, std::memory_order_relaxed);
    if (forwarded) {
      e.peer->sendControl(ps::ControlOp::kForwardAck, h);
    } else if (s.state[r] == 2) {
      e.peer->sendControl(ps::ControlOp::kAck, h);
    }
    return;
  }
  s.average = average;
  s.contribution[r] = e.payload;
  s.present++;
  noteOpen(s);
  metrics_.chunksApplied.fetch_add(1, std::memory_order_relaxed);
  // The lag gauge counts stored pushes only: a refused one (say far beyond the window) says
  // nothing about where its worker is.
  metrics_.noteWorkerIteration(rank, h.iteration);
  if (s.codec != compress::Compression::kNone) {
    metrics_.sync.compressedChunksIn.fetch_add(1, std::memory_order_relaxed);
    metrics_.sync.compressedBytesIn.fetch_add(s.bytes, std::memory_order_relaxed);
    metrics_.sync.logicalBytesIn.fetch_add(s.logicalCount * sizeof(float),
                                           std::memory_order_relaxed);
  }
  if (forwarded) {
    // This daemon is the backup: applied here is durable; tell the primary.
    metrics_.forwardedApplied.fetch_add(1, std::memory_order_relaxed);
    s.state[r] = 1;
    e.peer->sendControl(ps::ControlOp::kForwardAck, h);
    markDurable(s, rank);
    return;
  }
  s.state[r] = 1;
  wire::Header fh = h;
  fh.opcode = static_cast<uint8_t>(
      (h.opcode & (ps::kPushAverage | ps::kPushCompressionBits | ps::kPushReplyFeedback)) |
      ps::kPushForwarded);
  if (forward_ && forward_(fh, e.payload)) {
    metrics_.chunksForwarded.fetch_add(1, std::memory_order_relaxed);
    s.forwardedNs[r] = nowNs();
    return;  // durable when the backup acks (onForwardAck), or the backup is lost (tick)
  }
  markDurable(s, rank);
}

void Engine::markDurable(Slot& s, int rank) {
  const auto r = static_cast<size_t>(rank);
  if (s.state[r] != 1) return;
  s.state[r] = 2;
  s.durable++;
  if (s.pusher[r]) {
    wire::Header about;
    about.key = s.key;
    about.chunkIndex = s.chunk;
    about.chunkCount = s.chunkCount;
    about.iteration = s.cur;
    about.dtype = s.dtype;
    about.senderRank = static_cast<uint32_t>(rank);
    s.pusher[r]->sendControl(ps::ControlOp::kAck, about);
  }
  maybeComplete(s);
}

void Engine::onForwardAck(const Event& e) {
  const wire::Header& h = e.header;
  auto it = slots_.find(ChunkId{h.key, h.chunkIndex});
  if (it == slots_.end()) return;
  Slot& s = *it->second;
  if (h.iteration != s.cur || h.senderRank >= static_cast<uint32_t>(options_.numWorkers)) return;
  s.forwardedNs[h.senderRank] = 0;
  markDurable(s, static_cast<int>(h.senderRank));
}

void Engine::onBackupLost() {
  for (auto& [id, slot] : slots_) {
    for (int r = 0; r < options_.numWorkers; ++r) markDurable(*slot, r);
  }
}

void Engine::maybeComplete(Slot& s) {
  if (groups_.enabled() ? groups_.covered(s.state) : s.durable == options_.numWorkers) complete(s);
}

void Engine::complete(Slot& s) {
  // Gradient coding: one contribution per group, in group order; else every rank in order.
  std::vector<int> ranks = groups_.chosen(s.state);
  if (!groups_.enabled()) {
    ranks.resize(static_cast<size_t>(options_.numWorkers));
    for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  }
  std::vector<const uint8_t*> inputs(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) inputs[i] = s.contribution[ranks[i]]->data();
  // The result overwrites the first input's buffer (the reducer allows exactly that alias): no
  // allocation, zero-fill or page faults per round. Nothing else reads it any more — with
  // replication the round completes once the backup acked every forwarded copy. Except when
  // the backup was lost instead (onBackupLost): a forward of that buffer may still be on its
  // way to the socket, and summing into it would send the backup a half-reduced "contribution"
  // it keeps for a failover. The result gets a buffer of its own then.
  Payload result = s.contribution[static_cast<size_t>(ranks[0])];
  if (s.forwardedNs[static_cast<size_t>(ranks[0])] != 0) {
    result = std::make_shared<std::vector<uint8_t>>(result->size());
  }
  if (s.codec != compress::Compression::kNone) {
    // Decompress, fold in f32 in rank order, recompress (with reply feedback: with the slot's
    // residual, which therefore survives across rounds).
    float* residual = nullptr;
    if (s.replyFeedback) {
      s.residual.resize(s.logicalCount, 0.0f);
      residual = s.residual.data();
    }
    std::vector<Payload> chosen;
    for (int r : ranks) chosen.push_back(s.contribution[static_cast<size_t>(r)]);
    result = compressedReduce(s.codec, s.average, chosen, s.logicalCount, s.block, residual);
    countCompressedOut(s, s.deliverTo.size() + s.pullers.size(), result->size());
  } else {
    reduceInRankOrder(s.dtype, s.average, inputs, s.bytes / dtypeSize(s.dtype), result->data());
  }
  finishRound(s, std::move(result));
}

void Engine::finishRound(Slot& s, Payload result) {
  wire::Header about;
  about.key = s.key;
  about.chunkIndex = s.chunk;
  about.chunkCount = s.chunkCount;
  about.iteration = s.cur;
  about.dtype = s.dtype;
  std::shared_ptr<const std::vector<uint8_t>> shared = result;
  for (const auto& peer : s.deliverTo) peer->sendResult(metrics_, about, shared);
  for (const auto& [peer, h] : s.pullers) peer->sendResult(metrics_, h, shared);
  s.hasLast = true;
  s.lastIter = s.cur;
  s.lastResult = std::move(shared);
  s.lastFailure.clear();
  metrics_.roundsCompleted.fetch_add(1, std::memory_order_relaxed);
  resetRound(s);
}

void Engine::noteOpen(Slot& s) {
  if (s.open() == s.counted) return;
  s.counted = s.open();
  if (s.counted) {
    s.openedNs = nowNs();
    openRounds_.fetch_add(1, std::memory_order_relaxed);
    metrics_.openRounds.fetch_add(1, std::memory_order_relaxed);
  } else {
    openRounds_.fetch_sub(1, std::memory_order_relaxed);
    metrics_.openRounds.fetch_sub(1, std::memory_order_relaxed);
  }
}

void Engine::resetRound(Slot& s) {
  for (auto& c : s.contribution) c.reset();
  for (auto& p : s.pusher) p.reset();
  std::fill(s.state.begin(), s.state.end(), 0);
  std::fill(s.forwardedNs.begin(), s.forwardedNs.end(), 0);
  s.deliverTo.clear();
  s.pullers.clear();
  s.present = 0;
  s.durable = 0;
  s.cur++;
  noteOpen(s);
}

void Engine::onPull(Event& e) {
  const wire::Header& h = e.header;
  const bool known = slots_.count(ChunkId{h.key, h.chunkIndex}) != 0;
  // Draining: a pull may wait for a round that contributions already opened (it may still
  // complete), or take the result of the one just finished; it does not open a round of its
  // own, which no push could complete now (they are refused) and the drain would wait for
  // until its timeout.
  const auto refuseWhileDraining = [&] {
    e.peer->reject(metrics_, RejectReason::kDraining, h, "the daemon is shutting down");
  };
  if (!known && wasReleased(h.key)) {
    e.peer->reject(metrics_, RejectReason::kReleased, h,
                   "the fan-out round was released by its uploader (ControlOp kFanOutRelease)");
    return;
  }
  if (e.draining && !known) {
    refuseWhileDraining();
    return;
  }
  if (!known && pulledOnly_ >= options_.maxPulledOnly) {
    // Each slot costs a few vectors of --workers entries: pulls for chunks nobody pushes (a
    // wrong key, a hostile peer) must not grow the daemon without bound.
    e.peer->reject(metrics_, RejectReason::kPullBacklog, h,
                   std::to_string(options_.maxPulledOnly) +
                       " chunks on this engine are pulled and not yet pushed by anyone "
                       "(COFAB_AGG_MAX_PULLED_ONLY); is the key right?");
    return;
  }
  bool created = false;  // == !known
  Slot& s = slotFor(h, &created);
  if (created) ++pulledOnly_;
  // Only a push defines the chunk: before one (bytes 0) an earlier pull's dtype and chunk count
  // are no rule for this pull; the first push refuses the waiting pulls that do not match it.
  if (s.bytes != 0 && (h.dtype != s.dtype || h.chunkCount != s.chunkCount)) {
    e.peer->reject(metrics_, RejectReason::kWrongDType, h, "pull does not match the chunk");
    return;
  }
  if (s.hasLast && h.iteration == s.lastIter) {
    if (!s.lastFailure.empty()) {
      e.peer->sendText(ps::ControlOp::kRoundFailed, h, s.lastFailure);
    } else {
      e.peer->sendResult(metrics_, h, s.lastResult);
      countCompressedOut(s, 1, s.lastResult->size());
    }
    return;
  }
  if (h.iteration != s.cur) {
    e.peer->reject(
        metrics_,
        h.iteration < s.cur ? RejectReason::kFinishedIteration : RejectReason::kBeyondWindow, h,
        "the open round is iteration " + std::to_string(s.cur));
    return;
  }
  if (e.draining && s.present == 0) {
    refuseWhileDraining();
    return;
  }
  s.pullers.emplace_back(e.peer, h);
  noteOpen(s);
}

namespace {
// Released ranges remembered for rejecting late pulls (one per release, e.g. per shuffle epoch).
constexpr size_t kReleasedRangesKept = 4096;
}  // namespace

void Engine::onRelease(const Event& e) {
  uint64_t count = 0;
  for (size_t i = 0; i < 8; ++i) count |= static_cast<uint64_t>((*e.payload)[i]) << (8 * i);
  const uint64_t first = e.header.key;
  for (uint64_t k = first; k < first + count; ++k) {
    auto it = slots_.find(ChunkId{k, 0});
    if (it == slots_.end()) continue;  // another engine's, or never uploaded
    const Slot& s = *it->second;
    // Only finished fan-out rounds: a reduction's slot, or one with pullers waiting, stays.
    if (!s.fanOut || s.open()) continue;
    slots_.erase(it);
    metrics_.slots.fetch_sub(1, std::memory_order_relaxed);
    metrics_.fanOutReleased.fetch_add(1, std::memory_order_relaxed);
  }
  released_.emplace_back(first, count);
  if (released_.size() > kReleasedRangesKept) released_.pop_front();
  if (e.enginesLeft->fetch_sub(1) == 1) e.peer->sendControl(ps::ControlOp::kAck, e.header);
}

bool Engine::wasReleased(uint64_t key) const {
  for (const auto& [first, count] : released_) {
    if (key >= first && key - first < count) return true;
  }
  return false;
}

void Engine::onWorkerGone(const Event& e) {
  const auto r = static_cast<size_t>(e.rank);
  if (r >= goneSinceNs_.size()) return;
  goneSinceNs_[r] = nowNs();
  goneReason_[r] = e.reason;
  goneLeft_[r] = e.left;
}

void Engine::adoptPushShape(Slot& s, const wire::Header& h) {
  // The first push of a slot a pull created: the pusher defines the chunk. Pullers that asked
  // for another dtype or chunk count are refused now, as they would have been after the push.
  --pulledOnly_;
  s.dtype = h.dtype;
  s.chunkCount = h.chunkCount;
  std::vector<std::pair<std::shared_ptr<Peer>, wire::Header>> kept;
  for (auto& [peer, pull] : s.pullers) {
    if (pull.dtype == s.dtype && pull.chunkCount == s.chunkCount) {
      kept.emplace_back(std::move(peer), pull);
    } else {
      peer->reject(metrics_, RejectReason::kWrongDType, pull, "pull does not match the chunk");
    }
  }
  s.pullers.swap(kept);
  // Refusing every puller may close the round the pull opened; the push that follows reopens
  // it (noteOpen keeps the count right either way).
  noteOpen(s);
}

void Engine::onWorkerBack(const Event& e) {
  const auto r = static_cast<size_t>(e.rank);
  if (r >= goneSinceNs_.size()) return;
  goneSinceNs_[r] = 0;
  goneReason_[r].clear();
}

std::string Engine::missingWorkers(const Slot& s, int64_t now, bool* anyGone) const {
  std::ostringstream os;
  *anyGone = false;
  bool first = true;
  for (size_t r = 0; r < s.state.size(); ++r) {
    if (s.state[r] == 2) continue;
    os << (first ? "" : ", ") << "worker " << r;
    first = false;
    if (s.state[r] == 1) {
      os << " (waiting for the backup's ack)";
    } else if (goneSinceNs_[r] != 0) {
      os << (goneLeft_[r] ? " (left " : " (connection lost ") << (now - goneSinceNs_[r]) / 1000000
         << " ms ago: " << goneReason_[r] << ")";
      *anyGone = true;
    } else {
      os << " (connected, not yet pushed)";
    }
  }
  return os.str();
}

void Engine::tick() {
  models_->tick();
  const int64_t now = nowNs();
  for (auto& [id, slot] : slots_) {
    Slot& s = *slot;
    if (!s.open()) continue;
    if (backupSilent_ && !backupSilentReported_) {
      for (size_t r = 0; r < s.state.size(); ++r) {
        const int64_t waitedMs = (now - s.forwardedNs[r]) / 1000000;
        if (s.state[r] != 1 || waitedMs < options_.backupAckTimeoutMs) continue;
        // Once ended, replication stays off (every engine marks its waiting contributions
        // durable); while the backup still answers, ask again at a later tick.
        backupSilentReported_ =
            backupSilent_("worker " + std::to_string(r) + "'s contribution to round " +
                          roundName(s.key, s.chunk, s.cur) + " forwarded " +
                          std::to_string(waitedMs) + " ms ago");
        break;
      }
    }
    bool gone = false;
    int64_t goneFor = -1;
    // Before any contribution (only pulls waiting) the round does not yet say whom it waits
    // for: a fan-out round needs its one uploader, not every worker. A lost worker releases it
    // from its first contribution on; until then only the round timeout does.
    for (size_t r = 0; r < s.state.size() && s.present > 0; ++r) {
      // A lost worker whose group is covered, or may still be by a member that is not gone
      // (gradient coding), fails nothing: counting only covered groups failed the round at the
      // first tick after another group's push, before the group-mate had pushed.
      if (s.state[r] == 0 && goneSinceNs_[r] != 0 &&
          !(groups_.enabled() &&
            groups_.groupMayBeCovered(s.state, goneSinceNs_, static_cast<int>(r)))) {
        gone = true;
        goneFor = std::max(goneFor, (now - goneSinceNs_[r]) / 1000000);
      }
    }
    const int64_t openFor = (now - s.openedNs) / 1000000;
    if ((gone && goneFor >= options_.deadWorkerMs) || openFor >= options_.roundTimeoutMs) {
      bool anyGone = false;
      std::string missing = missingWorkers(s, now, &anyGone);
      failRound(s, "round " + roundName(s.key, s.chunk, s.cur) + " released after " +
                       std::to_string(openFor) + " ms, missing " + missing);
    }
  }
}

void Engine::failRound(Slot& s, const std::string& why) {
  COFAB_LOG(kWarn, "aggd") << why;
  wire::Header about;
  about.key = s.key;
  about.chunkIndex = s.chunk;
  about.chunkCount = s.chunkCount;
  about.iteration = s.cur;
  about.dtype = s.dtype;
  for (const auto& p : s.pusher) {
    if (p) p->sendText(ps::ControlOp::kRoundFailed, about, why);
  }
  for (const auto& [peer, h] : s.pullers) peer->sendText(ps::ControlOp::kRoundFailed, h, why);
  s.hasLast = true;
  s.lastIter = s.cur;
  s.lastResult.reset();
  s.lastFailure = why;
  metrics_.roundsFailed.fetch_add(1, std::memory_order_relaxed);
  resetRound(s);
}

void Engine::failOpenRounds(const std::string& why) {
  for (auto& [id, slot] : slots_) {
    if (slot->open()) {
      failRound(*slot, "round " + roundName(slot->key, slot->chunk, slot->cur) + ": " + why);
    }
  }
}

}  // namespace cofab::aggregator
