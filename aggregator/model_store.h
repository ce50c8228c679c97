// ModelStore: the engine-side state of the asynchronous parameter server (docs/MODEL_STORE.md):
// per (key, chunk) an f32 vector, a version (updates applied) and every worker's clock, with
// INIT / PULL / APPLY / ELASTIC and SSP bounded staleness (bound tau = --staleness):
//
//   worker w applies at clock c; over the other live workers u, with L[u] their last applied
//   clock (-1 = none) and p[u] = L[u] + 1 the iteration u is working on:
//     c <= L[w]                       -> dropped (clock did not advance)
//     max L[u] - c > tau              -> dropped (the others moved on: too stale)
//     c - min p[u] > tau              -> deferred until that holds (the fast worker waits)
//     otherwise applied, staleness = max(0, c - min p[u], max L[u] - c) <= tau
//
// Version-bounded apply-and-pull (kModelApplyPull, bound tau_v = --version-staleness): the update
// carries the chunk version v its delta was computed on; with V the chunk's current version,
//     V - v <= tau_v  -> applied (staleness V - v), answered with the new value
//     otherwise       -> dropped (staleness V - v), answered with the current value
// Nobody waits for anybody in this mode; clocks and liveness play no part.
//
// A worker is live until it sends kModelLeave, or until --dead-worker-ms after its connection
// broke (kWorkerGone); any later message from it makes it live again.
//
// One ModelStore per engine, touched only by that engine's thread (slots are pinned to engines by
// (key, chunk) like rounds are). Answers go out through the Peer of the request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "aggregator/chunk_id.h"
#include "aggregator/engine.h"
#include "aggregator/metrics.h"

namespace cofab::aggregator {

class AggregatorServer;

struct ModelStoreOptions {
  int numWorkers = 1;
  int64_t staleness = 3;  // tau, in clocks
  int64_t deadWorkerMs = 2000;
  int64_t versionStaleness = 16;  // tau_v, in model versions (apply-and-pull)
};

// ControlOps of the model store that workers may send.
bool isModelRequest(uint8_t controlOp);

class ModelStore {
 public:
  ModelStore(ModelStoreOptions options, Metrics& metrics);
  ~ModelStore();
  ModelStore(const ModelStore&) = delete;
  ModelStore& operator=(const ModelStore&) = delete;

  // An Event::Kind::kModel (validated by AggregatorServer::onModelMessage).
  void onMessage(Event& e);
  void onWorkerGone(int rank, const std::string& reason);
  // Re-examines held updates (a worker may have become dead meanwhile).
  void tick();
  // The daemon stops: held updates are refused with kDraining.
  void drain(const std::string& why);

 private:
  struct Slot;
  struct Held;
  void onInit(Event& e);
  void onPull(Event& e);
  void onApply(Event& e);
  void onElastic(Event& e);
  void onApplyPull(Event& e);
  Slot* find(Event& e, bool needValue);
  // Applies, drops or keeps `held`; true when it is finished (applied or dropped).
  bool tryApply(Slot& s, Held& held, int64_t now);
  // Answers an applied update once SSP's read bound allows; true when answered.
  bool answerWhenReadable(Slot& s, Held& held, int64_t now);
  void release(Slot& s, int64_t now);
  bool live(int rank, int64_t now) const;

  const ModelStoreOptions options_;
  Metrics& metrics_;
  ChunkMap<std::unique_ptr<Slot>> slots_;
  std::vector<int64_t> goneSinceNs_;  // 0: connected
  std::vector<bool> left_;
  std::vector<std::string> goneReason_;
};

}  // namespace cofab::aggregator
