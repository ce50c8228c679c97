// SyncMetrics: the daemon's counters for the training-sync features — the model store (SSP
// bounded staleness, EASGD; docs/MODEL_STORE.md) and compressed push-pull
// (docs/COMPRESSION.md) — rendered into /metrics next to the aggregation counters.
//
// Relaxed atomics written by engine and I/O threads, read by the HTTP thread. Part of Metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>

namespace cofab::aggregator {

struct SyncMetrics {
  // Staleness histogram bucket bounds (clocks); the last bucket is +Inf.
  static constexpr std::array<uint64_t, 10> kStalenessBounds{0, 1, 2, 3, 4, 6, 8, 16, 32, 64};

  std::atomic<uint64_t> modelInits{0};
  std::atomic<uint64_t> modelPulls{0};
  std::atomic<uint64_t> modelApplied{0};
  std::atomic<uint64_t> modelDeferred{0};  // applies held at least once
  std::atomic<uint64_t> modelDropped{0};
  std::atomic<uint64_t> modelElastic{0};
  std::atomic<uint64_t> modelDeferredNow{0};
  std::atomic<uint64_t> stalenessMax{0};
  std::atomic<uint64_t> stalenessSum{0};
  std::array<std::atomic<uint64_t>, kStalenessBounds.size() + 1> stalenessBuckets{};

  std::atomic<uint64_t> compressedChunksIn{0};
  std::atomic<uint64_t> compressedBytesIn{0};  // on the wire
  std::atomic<uint64_t> logicalBytesIn{0};     // the f32 bytes they stand for
  std::atomic<uint64_t> compressedBytesOut{0};
  std::atomic<uint64_t> logicalBytesOut{0};

  void observeStaleness(uint64_t s);
  void render(std::ostringstream& os, const std::string& idLabel) const;
};

}  // namespace cofab::aggregator
