#include "aggregator/sync_metrics.h"

namespace cofab::aggregator {

void SyncMetrics::observeStaleness(uint64_t s) {
  size_t b = 0;
  while (b < kStalenessBounds.size() && s > kStalenessBounds[b]) ++b;
  stalenessBuckets[b].fetch_add(1, std::memory_order_relaxed);
  stalenessSum.fetch_add(s, std::memory_order_relaxed);
  uint64_t seen = stalenessMax.load(std::memory_order_relaxed);
  while (s > seen && !stalenessMax.compare_exchange_weak(seen, s, std::memory_order_relaxed)) {
  }
}

void SyncMetrics::render(std::ostringstream& os, const std::string& id) const {
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  auto line = [&](const char* name, const char* type, const char* help, uint64_t v) {
    os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
       << name << '{' << id << "} " << v << '\n';
  };
  line("cofab_agg_model_inits_total", "counter", "model store keys initialised (first writer)",
       ld(modelInits));
  line("cofab_agg_model_pulls_total", "counter",
       "model store values answered (pulls, and the value part of apply-and-pull)", ld(modelPulls));
  line("cofab_agg_model_applied_total", "counter", "model store updates applied", ld(modelApplied));
  line("cofab_agg_model_deferred_total", "counter",
       "model store updates held at least once: before being applied (their worker ran more "
       "than the bound ahead) or after, their answer waiting for SSP's read bound",
       ld(modelDeferred));
  line("cofab_agg_model_dropped_total", "counter",
       "model store updates dropped as more stale than the bound", ld(modelDropped));
  line("cofab_agg_model_elastic_total", "counter", "EASGD elastic steps", ld(modelElastic));
  line("cofab_agg_model_deferred_now", "gauge", "model store updates held right now",
       ld(modelDeferredNow));
  line("cofab_agg_model_staleness_max", "gauge",
       "largest staleness of an applied update (clocks or versions)", ld(stalenessMax));
  os << "# HELP cofab_agg_model_staleness staleness of applied updates (clocks or versions)\n"
        "# TYPE cofab_agg_model_staleness histogram\n";
  uint64_t cum = 0;
  for (size_t b = 0; b <= kStalenessBounds.size(); ++b) {
    cum += ld(stalenessBuckets[b]);
    os << "cofab_agg_model_staleness_bucket{" << id << ",le=\"";
    if (b < kStalenessBounds.size()) {
      os << kStalenessBounds[b];
    } else {
      os << "+Inf";
    }
    os << "\"} " << cum << '\n';
  }
  os << "cofab_agg_model_staleness_sum{" << id << "} " << ld(stalenessSum) << '\n'
     << "cofab_agg_model_staleness_count{" << id << "} " << cum << '\n';
  line("cofab_agg_compressed_chunks_in_total", "counter", "compressed contributions received",
       ld(compressedChunksIn));
  line("cofab_agg_compressed_bytes_in_total", "counter",
       "compressed contribution bytes received (on the wire)", ld(compressedBytesIn));
  line("cofab_agg_compressed_logical_bytes_in_total", "counter",
       "f32 bytes the compressed contributions stand for", ld(logicalBytesIn));
  line("cofab_agg_compressed_bytes_out_total", "counter", "compressed result bytes sent",
       ld(compressedBytesOut));
  line("cofab_agg_compressed_logical_bytes_out_total", "counter",
       "f32 bytes the compressed results stand for", ld(logicalBytesOut));
}

}  // namespace cofab::aggregator
