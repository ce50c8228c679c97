#include "aggregator/model_store.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"

namespace cofab::aggregator {

using ps::ControlOp;
using ps::RejectReason;

struct ModelStore::Held {
  std::shared_ptr<Peer> peer;
  wire::Header header;
  Payload delta;
  int rank = -1;
  int64_t clock = 0;
  bool deferred = false;  // counted in modelDeferredNow: held before its apply or its answer
  bool applied = false;   // applied; its answer waits for SSP's read bound (answerWhenReadable)
  uint64_t version = 0;   // the slot's version right after it was applied
  uint64_t staleness = 0;
};

struct ModelStore::Slot {
  uint64_t key = 0;
  uint32_t chunk = 0;
  uint32_t chunkCount = 0;
  std::vector<float> value;
  uint64_t version = 0;
  std::vector<int64_t> last;  // last applied clock per worker, -1: none
  std::vector<Held> held;     // deferred applies
};

namespace {

// Updates of one worker a chunk holds unapplied at most (ModelStore::onApply).
constexpr std::ptrdiff_t kMaxHeldPerWorker = 16;

std::string where(uint64_t key, uint32_t chunk) {
  return "key=" + std::to_string(key) + " chunk=" + std::to_string(chunk);
}

// Answer with the version in `iteration` and an optional payload (kept alive by the send).
void answer(const Peer& peer, ControlOp op, const wire::Header& about, uint64_t version,
            std::shared_ptr<std::vector<uint8_t>> payload, DType dtype) {
  wire::Header h = ps::controlHeader(op, about);
  h.iteration = version;
  h.dtype = dtype;
  if (!payload) {
    peer.send(h, nullptr, 0, nullptr);
    return;
  }
  const uint8_t* data = payload->data();
  const size_t size = payload->size();
  peer.send(h, data, size, std::move(payload));
}

void answerApply(const Peer& peer, const wire::Header& about, bool dropped, uint64_t version,
                 uint64_t staleness, const std::string& why) {
  auto p = std::make_shared<std::vector<uint8_t>>(ps::kModelApplyReplyBytes + why.size(), 0);
  (*p)[0] = dropped ? 1 : 0;
  std::memcpy(p->data() + 8, &version, 8);
  std::memcpy(p->data() + 16, &staleness, 8);
  if (!why.empty()) std::memcpy(p->data() + ps::kModelApplyReplyBytes, why.data(), why.size());
  answer(peer, ControlOp::kModelApplied, about, version, std::move(p), DType::kU8);
}

}  // namespace

bool isModelRequest(uint8_t op) {
  return op == static_cast<uint8_t>(ControlOp::kModelInit) ||
         op == static_cast<uint8_t>(ControlOp::kModelPull) ||
         op == static_cast<uint8_t>(ControlOp::kModelApply) ||
         op == static_cast<uint8_t>(ControlOp::kModelElastic) ||
         op == static_cast<uint8_t>(ControlOp::kModelLeave) ||
         op == static_cast<uint8_t>(ControlOp::kModelApplyPull);
}

ModelStore::ModelStore(ModelStoreOptions options, Metrics& metrics)
    : options_(options),
      metrics_(metrics),
      goneSinceNs_(static_cast<size_t>(options.numWorkers), 0),
      left_(static_cast<size_t>(options.numWorkers), false),
      goneReason_(static_cast<size_t>(options.numWorkers)) {}

ModelStore::~ModelStore() = default;

bool ModelStore::live(int rank, int64_t now) const {
  const auto r = static_cast<size_t>(rank);
  if (left_[r]) return false;
  return goneSinceNs_[r] == 0 || (now - goneSinceNs_[r]) / 1000000 < options_.deadWorkerMs;
}

void ModelStore::onMessage(Event& e) {
  const auto op = static_cast<ControlOp>(e.header.opcode);
  const auto r = static_cast<size_t>(e.rank);
  if (op == ControlOp::kModelLeave) {
    left_[r] = true;
    const int64_t now = nowNs();
    for (auto& [id, slot] : slots_) {
      if (!slot->held.empty()) release(*slot, now);
    }
    return;
  }
  // Any request shows the worker is (again) part of the job.
  left_[r] = false;
  goneSinceNs_[r] = 0;
  switch (op) {
    case ControlOp::kModelInit:
      onInit(e);
      return;
    case ControlOp::kModelPull:
      onPull(e);
      return;
    case ControlOp::kModelApply:
      onApply(e);
      return;
    case ControlOp::kModelElastic:
      onElastic(e);
      return;
    case ControlOp::kModelApplyPull:
      onApplyPull(e);
      return;
    default:
      e.peer->reject(metrics_, RejectReason::kMalformed, e.header, "not a model store request");
  }
}

void ModelStore::onInit(Event& e) {
  const wire::Header& h = e.header;
  auto& ptr = slots_[ChunkId{h.key, h.chunkIndex}];
  const size_t count = e.payload->size() / sizeof(float);
  if (!ptr) {
    ptr = std::make_unique<Slot>();
    ptr->key = h.key;
    ptr->chunk = h.chunkIndex;
    ptr->chunkCount = h.chunkCount;
    ptr->value.resize(count);
    std::memcpy(ptr->value.data(), e.payload->data(), e.payload->size());
    ptr->last.assign(static_cast<size_t>(options_.numWorkers), -1);
    metrics_.sync.modelInits.fetch_add(1, std::memory_order_relaxed);
  } else if (ptr->value.size() != count || ptr->chunkCount != h.chunkCount) {
    e.peer->reject(metrics_, RejectReason::kWrongSize, h,
                   "model " + where(h.key, h.chunkIndex) + " was initialised with " +
                       std::to_string(ptr->value.size()) + " f32 of " +
                       std::to_string(ptr->chunkCount) + " chunks, got " + std::to_string(count) +
                       " of " + std::to_string(h.chunkCount));
    return;
  }
  answer(*e.peer, ControlOp::kModelAck, h, ptr->version, nullptr, DType::kU8);
}

ModelStore::Slot* ModelStore::find(Event& e, bool needValue) {
  const wire::Header& h = e.header;
  auto it = slots_.find(ChunkId{h.key, h.chunkIndex});
  if (it == slots_.end()) {
    e.peer->reject(metrics_, RejectReason::kUninitialized, h,
                   "model " + where(h.key, h.chunkIndex) +
                       " has not been initialised on this daemon (call init first)");
    return nullptr;
  }
  Slot& s = *it->second;
  const size_t count = e.payload ? e.payload->size() / sizeof(float) : 0;
  if (h.chunkCount != s.chunkCount || (needValue && count != s.value.size())) {
    e.peer->reject(metrics_, RejectReason::kWrongSize, h,
                   "model " + where(h.key, h.chunkIndex) + " has " +
                       std::to_string(s.value.size()) + " f32 of " + std::to_string(s.chunkCount) +
                       " chunks, got " + std::to_string(count) + " of " +
                       std::to_string(h.chunkCount));
    return nullptr;
  }
  return &s;
}

void ModelStore::onPull(Event& e) {
  Slot* s = find(e, false);
  if (!s) return;
  const auto* bytes = reinterpret_cast<const uint8_t*>(s->value.data());
  auto p = std::make_shared<std::vector<uint8_t>>(bytes, bytes + s->value.size() * sizeof(float));
  metrics_.sync.modelPulls.fetch_add(1, std::memory_order_relaxed);
  metrics_.bytesOut.fetch_add(p->size(), std::memory_order_relaxed);
  answer(*e.peer, ControlOp::kModelValue, e.header, s->version, std::move(p), DType::kF32);
}

void ModelStore::onElastic(Event& e) {
  Slot* s = find(e, true);
  if (!s) return;
  float alpha = 0;
  const auto bits = static_cast<uint32_t>(e.header.iteration);
  std::memcpy(&alpha, &bits, sizeof(alpha));
  if (!(alpha > 0.0f && alpha <= 1.0f)) {
    e.peer->reject(metrics_, RejectReason::kMalformed, e.header,
                   "elastic coefficient alpha must be in (0, 1], got " + std::to_string(alpha));
    return;
  }
  // d = alpha * (x - center); center += d. The payload buffer becomes d (answered as is).
  auto* x = reinterpret_cast<float*>(e.payload->data());
  float* center = s->value.data();
  for (size_t i = 0; i < s->value.size(); ++i) {
    float xi;
    std::memcpy(&xi, x + i, sizeof(float));
    const float d = alpha * (xi - center[i]);
    center[i] += d;
    std::memcpy(x + i, &d, sizeof(float));
  }
  s->version++;
  metrics_.sync.modelElastic.fetch_add(1, std::memory_order_relaxed);
  metrics_.bytesOut.fetch_add(e.payload->size(), std::memory_order_relaxed);
  answer(*e.peer, ControlOp::kModelValue, e.header, s->version, e.payload, DType::kF32);
}

void ModelStore::onApply(Event& e) {
  Slot* s = find(e, true);
  if (!s) return;
  if (e.header.iteration > (1ull << 62)) {
    e.peer->reject(metrics_, RejectReason::kMalformed, e.header,
                   "clock " + std::to_string(e.header.iteration) + " is out of range");
    return;
  }
  // Each update held before being applied keeps its delta. A client that gives up waiting and
  // goes on with its next clock (as docs/MODEL_STORE.md says it may) while the slowest worker
  // stays stalled would pile them up without bound: past kMaxHeldPerWorker, further ones from
  // that worker are dropped, with the reason.
  const auto waiting = std::count_if(s->held.begin(), s->held.end(),
                                     [&](const Held& h) { return h.rank == e.rank && !h.applied; });
  if (waiting >= kMaxHeldPerWorker) {
    metrics_.sync.modelDropped.fetch_add(1, std::memory_order_relaxed);
    answerApply(*e.peer, e.header, true, s->version, 0,
                "update " + where(s->key, s->chunk) +
                    " clock=" + std::to_string(e.header.iteration) + " from worker " +
                    std::to_string(e.rank) + " dropped: " + std::to_string(waiting) +
                    " of its updates already wait there for the staleness bound (the slowest "
                    "worker is stalled); pull and go on from a current clock");
    return;
  }
  Held held;
  held.peer = e.peer;
  held.header = e.header;
  held.delta = e.payload;
  held.rank = e.rank;
  held.clock = static_cast<int64_t>(e.header.iteration);
  s->held.push_back(std::move(held));
  release(*s, nowNs());
}

void ModelStore::onApplyPull(Event& e) {
  Slot* s = find(e, true);
  if (!s) return;
  const uint64_t base = e.header.iteration;
  if (base > s->version) {
    e.peer->reject(metrics_, RejectReason::kMalformed, e.header,
                   "model " + where(s->key, s->chunk) + ": the update was computed on version " +
                       std::to_string(base) + " but the chunk is only at version " +
                       std::to_string(s->version));
    return;
  }
  const uint64_t staleness = s->version - base;
  const uint64_t tau = static_cast<uint64_t>(options_.versionStaleness);
  const bool dropped = staleness > tau;
  // One round trip: the answer is the apply's outcome and the chunk's value after it.
  const size_t valueBytes = s->value.size() * sizeof(float);
  const size_t size = ps::kModelApplyReplyBytes + valueBytes;
  std::shared_ptr<uint8_t[]> p = std::make_shared_for_overwrite<uint8_t[]>(size);  // no zero-fill
  uint8_t* answerValue = p.get() + ps::kModelApplyReplyBytes;
  if (dropped) {
    metrics_.sync.modelDropped.fetch_add(1, std::memory_order_relaxed);
    std::memcpy(answerValue, s->value.data(), valueBytes);
  } else {
    // The add writes the answer's copy as it goes: one pass over the value, not two.
    const auto* delta = reinterpret_cast<const float*>(e.payload->data());
    float* v = s->value.data();
    for (size_t i = 0; i < s->value.size(); ++i) {
      float d;
      std::memcpy(&d, delta + i, sizeof(float));
      v[i] += d;
      std::memcpy(answerValue + i * sizeof(float), &v[i], sizeof(float));
    }
    s->version++;
    metrics_.sync.modelApplied.fetch_add(1, std::memory_order_relaxed);
    metrics_.sync.observeStaleness(staleness);
  }
  std::memset(p.get(), 0, ps::kModelApplyReplyBytes);
  p[0] = dropped ? 1 : 0;
  const auto tau32 = static_cast<uint32_t>(std::min<uint64_t>(tau, UINT32_MAX));
  std::memcpy(p.get() + 4, &tau32, 4);
  std::memcpy(p.get() + 8, &s->version, 8);
  std::memcpy(p.get() + 16, &staleness, 8);
  metrics_.sync.modelPulls.fetch_add(1, std::memory_order_relaxed);
  metrics_.bytesOut.fetch_add(valueBytes, std::memory_order_relaxed);
  wire::Header h = ps::controlHeader(ControlOp::kModelAppliedValue, e.header);
  h.iteration = s->version;
  h.dtype = DType::kU8;
  const uint8_t* data = p.get();
  e.peer->send(h, data, size, std::move(p));
}

bool ModelStore::tryApply(Slot& s, Held& held, int64_t now) {
  if (held.applied) return answerWhenReadable(s, held, now);
  const int64_t tau = options_.staleness;
  const int w = held.rank;
  const int64_t c = held.clock;
  const int64_t mine = s.last[static_cast<size_t>(w)];
  // Where each other worker is: the clock after its last applied one, or that of its oldest
  // update held here if higher (it has computed that clock already). With the applied clocks
  // alone, two workers whose clocks skipped ahead together (a resumed job, a key updated every
  // few steps) each waited for the other's old position: deferred for good.
  std::vector<int64_t> heldFrom(static_cast<size_t>(options_.numWorkers), INT64_MAX);
  for (const Held& h : s.held) {
    if (!h.applied && h.rank != w) {
      int64_t& f = heldFrom[static_cast<size_t>(h.rank)];
      f = std::min(f, h.clock);
    }
  }
  int slowest = -1, fastest = -1;
  int64_t minP = 0, maxL = 0;
  for (int u = 0; u < options_.numWorkers; ++u) {
    if (u == w || !live(u, now)) continue;
    const int64_t lu = s.last[static_cast<size_t>(u)];
    const int64_t from = heldFrom[static_cast<size_t>(u)];
    const int64_t pu = from == INT64_MAX ? lu + 1 : std::max(lu + 1, from);
    if (slowest < 0 || pu < minP) {
      slowest = u;
      minP = pu;
    }
    if (fastest < 0 || lu > maxL) {
      fastest = u;
      maxL = lu;
    }
  }
  const int64_t ahead = slowest >= 0 ? c - minP : 0;
  const int64_t behind = fastest >= 0 ? maxL - c : 0;
  auto drop = [&](uint64_t staleness, const std::string& why) {
    metrics_.sync.modelDropped.fetch_add(1, std::memory_order_relaxed);
    if (held.deferred) metrics_.sync.modelDeferredNow.fetch_sub(1, std::memory_order_relaxed);
    answerApply(*held.peer, held.header, true, s.version, staleness,
                "update " + where(s.key, s.chunk) + " clock=" + std::to_string(c) +
                    " from worker " + std::to_string(w) + " dropped: " + why);
    return true;
  };
  if (c <= mine) {
    return drop(static_cast<uint64_t>(mine - c),
                "its clock did not advance past its last applied clock " + std::to_string(mine));
  }
  if (behind > tau) {
    return drop(static_cast<uint64_t>(behind),
                "worker " + std::to_string(fastest) + " has applied clock " + std::to_string(maxL) +
                    ", more than the bound " + std::to_string(tau) + " ahead");
  }
  if (ahead > tau) {
    if (!held.deferred) {
      held.deferred = true;
      metrics_.sync.modelDeferred.fetch_add(1, std::memory_order_relaxed);
      metrics_.sync.modelDeferredNow.fetch_add(1, std::memory_order_relaxed);
      const auto g = static_cast<size_t>(slowest);
      std::string text = "apply " + where(s.key, s.chunk) + " clock=" + std::to_string(c) +
                         " from worker " + std::to_string(w) + " deferred: worker " +
                         std::to_string(slowest) + " is at clock " + std::to_string(minP) +
                         " and the bound is " + std::to_string(tau);
      if (goneSinceNs_[g] != 0) {
        text += " (its connection broke " + std::to_string((now - goneSinceNs_[g]) / 1000000) +
                " ms ago: " + goneReason_[g] + ")";
      }
      auto p = std::make_shared<std::vector<uint8_t>>(text.begin(), text.end());
      answer(*held.peer, ControlOp::kModelDeferred, held.header, s.version, std::move(p),
             DType::kU8);
    }
    return false;
  }
  const auto* delta = reinterpret_cast<const float*>(held.delta->data());
  float* v = s.value.data();
  for (size_t i = 0; i < s.value.size(); ++i) {
    float d;
    std::memcpy(&d, delta + i, sizeof(float));
    v[i] += d;
  }
  s.version++;
  s.last[static_cast<size_t>(w)] = c;
  held.delta.reset();  // its answer may wait for the read bound: the chunk's copy need not
  held.staleness = static_cast<uint64_t>(std::max<int64_t>({0, ahead, behind}));
  held.version = s.version;
  held.applied = true;
  metrics_.sync.modelApplied.fetch_add(1, std::memory_order_relaxed);
  metrics_.sync.observeStaleness(held.staleness);
  return answerWhenReadable(s, held, now);
}

bool ModelStore::answerWhenReadable(Slot& s, Held& held, int64_t now) {
  // SSP's read bound: the answer lets the worker pull and compute clock c+1, which must see
  // every live worker's updates up to clock c - tau (with tau = 0, everyone's clock c: BSP).
  // Holding the answer of an update already applied blocks nobody else, and the slowest worker
  // is never held (everyone else's clock is at least its own), so the job always progresses.
  const int64_t tau = options_.staleness;
  const int w = held.rank;
  const int64_t c = held.clock;
  int slowest = -1;
  int64_t minL = 0;
  for (int u = 0; u < options_.numWorkers; ++u) {
    if (u == w || !live(u, now)) continue;
    const int64_t lu = s.last[static_cast<size_t>(u)];
    if (slowest < 0 || lu < minL) {
      slowest = u;
      minL = lu;
    }
  }
  if (slowest >= 0 && minL < c - tau) {
    if (!held.deferred) {
      held.deferred = true;
      metrics_.sync.modelDeferred.fetch_add(1, std::memory_order_relaxed);
      metrics_.sync.modelDeferredNow.fetch_add(1, std::memory_order_relaxed);
      const std::string text =
          "apply " + where(s.key, s.chunk) + " clock=" + std::to_string(c) + " from worker " +
          std::to_string(w) + " applied; its answer waits for worker " + std::to_string(slowest) +
          " (last applied clock " + std::to_string(minL) + ") to reach clock " +
          std::to_string(c - tau) + " (bound " + std::to_string(tau) + ")";
      auto p = std::make_shared<std::vector<uint8_t>>(text.begin(), text.end());
      answer(*held.peer, ControlOp::kModelDeferred, held.header, held.version, std::move(p),
             DType::kU8);
    }
    return false;
  }
  if (held.deferred) metrics_.sync.modelDeferredNow.fetch_sub(1, std::memory_order_relaxed);
  answerApply(*held.peer, held.header, false, held.version, held.staleness, "");
  return true;
}

void ModelStore::release(Slot& s, int64_t now) {
  // Oldest clocks first: applying one can unblock the next.
  for (bool progress = true; progress && !s.held.empty();) {
    progress = false;
    std::stable_sort(s.held.begin(), s.held.end(), [](const Held& a, const Held& b) {
      return a.clock != b.clock ? a.clock < b.clock : a.rank < b.rank;
    });
    for (size_t i = 0; i < s.held.size();) {
      if (tryApply(s, s.held[i], now)) {
        s.held.erase(s.held.begin() + static_cast<std::ptrdiff_t>(i));
        progress = true;
      } else {
        ++i;
      }
    }
  }
}

void ModelStore::onWorkerGone(int rank, const std::string& reason) {
  const auto r = static_cast<size_t>(rank);
  if (r >= goneSinceNs_.size()) return;
  goneSinceNs_[r] = nowNs();
  goneReason_[r] = reason;
}

void ModelStore::tick() {
  const int64_t now = nowNs();
  for (auto& [id, slot] : slots_) {
    if (!slot->held.empty()) release(*slot, now);
  }
}

void ModelStore::drain(const std::string& why) {
  for (auto& [id, slot] : slots_) {
    for (Held& held : slot->held) {
      if (held.deferred) metrics_.sync.modelDeferredNow.fetch_sub(1, std::memory_order_relaxed);
      if (held.applied) {  // it took effect: say so rather than refuse it
        answerApply(*held.peer, held.header, false, held.version, held.staleness, "");
        continue;
      }
      held.peer->reject(metrics_, RejectReason::kDraining, held.header,
                        "held update " + where(slot->key, slot->chunk) + " refused: " + why);
    }
    slot->held.clear();
  }
}

}  // namespace cofab::aggregator
