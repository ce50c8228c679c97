#include "aggregator/metrics.h"

#include <algorithm>
#include <sstream>
#include <vector>

namespace cofab::aggregator {

Metrics::Metrics(int workers, int engines)
    : workerIteration(new std::atomic<uint64_t>[static_cast<size_t>(workers)]),
      engineQueueDepth(new std::atomic<uint64_t>[static_cast<size_t>(engines)]),
      numWorkers(workers),
      numEngines(engines) {
  for (auto& r : rejects) r.store(0);
  for (int i = 0; i < workers; ++i) workerIteration[static_cast<size_t>(i)].store(0);
  for (int i = 0; i < engines; ++i) engineQueueDepth[static_cast<size_t>(i)].store(0);
}

void Metrics::noteWorkerIteration(int rank, uint64_t iteration) {
  auto& slot = workerIteration[static_cast<size_t>(rank)];
  uint64_t seen = slot.load(std::memory_order_relaxed);
  while (iteration + 1 > seen &&
         !slot.compare_exchange_weak(seen, iteration + 1, std::memory_order_relaxed)) {
  }
}

namespace {
void raiseTo(std::atomic<uint64_t>& max, uint64_t v) {
  uint64_t seen = max.load(std::memory_order_relaxed);
  while (v > seen && !max.compare_exchange_weak(seen, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

bool Metrics::noteReceived(std::atomic<uint64_t>& senderUsed, uint64_t bytes, bool granted) {
  raiseTo(backlogMaxBytes, backlogBytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raiseTo(backlogMaxChunks, backlogChunks.fetch_add(1, std::memory_order_relaxed) + 1);
  const uint64_t before = senderUsed.fetch_add(bytes, std::memory_order_relaxed);
  if (!granted) return false;
  raiseTo(creditOutstandingMax, before + bytes);
  // Same rule as the client: one chunk may always go when nothing is outstanding.
  const bool violation = creditWindow > 0 && before > 0 && before + bytes > creditWindow;
  if (violation) creditViolations.fetch_add(1, std::memory_order_relaxed);
  return violation;
}

void Metrics::noteConsumed(std::atomic<uint64_t>* senderUsed, uint64_t bytes) {
  backlogBytes.fetch_sub(bytes, std::memory_order_relaxed);
  backlogChunks.fetch_sub(1, std::memory_order_relaxed);
  if (senderUsed) senderUsed->fetch_sub(bytes, std::memory_order_relaxed);
}

uint64_t Metrics::rejectsTotal() const {
  uint64_t n = 0;
  for (const auto& r : rejects) n += r.load(std::memory_order_relaxed);
  return n;
}

namespace {
void counter(std::ostringstream& os, const char* name, const char* help, uint64_t v,
             const std::string& labels) {
  os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n"
     << name << '{' << labels << "} " << v << '\n';
}
}  // namespace

std::string Metrics::render(int serverId, bool draining) const {
  std::ostringstream os;
  const std::string id = "aggregator=\"" + std::to_string(serverId) + "\"";
  os << "# HELP cofab_agg_up 1 while the daemon serves, 0 while it drains\n"
        "# TYPE cofab_agg_up gauge\ncofab_agg_up{"
     << id << "} " << (draining ? 0 : 1) << '\n';
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  counter(os, "cofab_agg_rounds_completed_total", "rounds reduced and answered",
          ld(roundsCompleted), id);
  counter(os, "cofab_agg_rounds_failed_total", "rounds released without a result", ld(roundsFailed),
          id);
  counter(os, "cofab_agg_rounds_skipped_total",
          "rounds nobody contributed to, passed over by a push for a later one", ld(roundsSkipped),
          id);
  counter(os, "cofab_agg_bytes_in_total", "chunk payload bytes received", ld(bytesIn), id);
  counter(os, "cofab_agg_bytes_out_total", "result payload bytes sent", ld(bytesOut), id);
  counter(os, "cofab_agg_chunks_applied_total", "contributions applied", ld(chunksApplied), id);
  counter(os, "cofab_agg_chunks_duplicate_total",
          "retransmitted contributions answered, not applied", ld(chunksDuplicate), id);
  counter(os, "cofab_agg_chunks_forwarded_total", "contributions replicated to the backup",
          ld(chunksForwarded), id);
  counter(os, "cofab_agg_forwarded_applied_total", "contributions received as a backup",
          ld(forwardedApplied), id);
  counter(os, "cofab_agg_backup_lost_total",
          "times replication ended: the backup's link broke or it refused a forwarded chunk",
          ld(backupLost), id);
  counter(os, "cofab_agg_connections_accepted_total", "connections accepted",
          ld(connectionsAccepted), id);
  counter(os, "cofab_agg_connections_broken_total", "connections that failed",
          ld(connectionsBroken), id);
  counter(os, "cofab_agg_workers_lost_total", "workers whose connection broke without goodbye",
          ld(workersLost), id);
  os << "# HELP cofab_agg_rejects_total chunks rejected, by reason\n"
        "# TYPE cofab_agg_rejects_total counter\n";
  for (uint8_t r = 1; r <= ps::kMaxRejectReason; ++r) {
    if (ps::rejectReasonName(static_cast<ps::RejectReason>(r)) == "unknown") continue;  // unused
    os << "cofab_agg_rejects_total{" << id << ",reason=\""
       << ps::rejectReasonName(static_cast<ps::RejectReason>(r)) << "\"} " << ld(rejects[r])
       << '\n';
  }
  counter(os, "cofab_agg_credit_violations_total",
          "pushes that arrived beyond the sender's credit window", ld(creditViolations), id);
  os << "# HELP cofab_agg_credit_window_bytes credit window granted per worker (0: off)\n"
        "# TYPE cofab_agg_credit_window_bytes gauge\ncofab_agg_credit_window_bytes{"
     << id << "} " << creditWindow << '\n';
  os << "# HELP cofab_agg_credit_outstanding_max_bytes most unconsumed bytes one connection had\n"
        "# TYPE cofab_agg_credit_outstanding_max_bytes gauge\n"
        "cofab_agg_credit_outstanding_max_bytes{"
     << id << "} " << ld(creditOutstandingMax) << '\n';
  os << "# HELP cofab_agg_backlog_bytes received payload bytes not yet consumed by an engine\n"
        "# TYPE cofab_agg_backlog_bytes gauge\ncofab_agg_backlog_bytes{"
     << id << "} " << ld(backlogBytes) << '\n';
  os << "# HELP cofab_agg_backlog_max_bytes maximum of cofab_agg_backlog_bytes\n"
        "# TYPE cofab_agg_backlog_max_bytes gauge\ncofab_agg_backlog_max_bytes{"
     << id << "} " << ld(backlogMaxBytes) << '\n';
  os << "# HELP cofab_agg_backlog_max_chunks maximum number of received, unconsumed chunks\n"
        "# TYPE cofab_agg_backlog_max_chunks gauge\ncofab_agg_backlog_max_chunks{"
     << id << "} " << ld(backlogMaxChunks) << '\n';
  os << "# HELP cofab_agg_open_rounds rounds with contributions waiting for the rest\n"
        "# TYPE cofab_agg_open_rounds gauge\ncofab_agg_open_rounds{"
     << id << "} " << ld(openRounds) << '\n';
  os << "# HELP cofab_agg_slots (key, chunk) slots held, each with its last result\n"
        "# TYPE cofab_agg_slots gauge\ncofab_agg_slots{"
     << id << "} " << ld(slots) << '\n';
  counter(os, "cofab_agg_fanout_released_total", "fan-out slots freed by their uploader",
          ld(fanOutReleased), id);
  os << "# HELP cofab_agg_engine_queue_depth events queued per engine thread\n"
        "# TYPE cofab_agg_engine_queue_depth gauge\n";
  for (int e = 0; e < numEngines; ++e) {
    os << "cofab_agg_engine_queue_depth{" << id << ",engine=\"" << e << "\"} "
       << ld(engineQueueDepth[static_cast<size_t>(e)]) << '\n';
  }
  // One read of each worker's iteration: engines keep storing them, and a second read could be
  // newer than the maximum taken from the first (the unsigned lag then wrapped to ~1.8e19).
  std::vector<uint64_t> iteration(static_cast<size_t>(numWorkers));
  for (size_t w = 0; w < iteration.size(); ++w) iteration[w] = ld(workerIteration[w]);
  const uint64_t newest =
      iteration.empty() ? 0 : *std::max_element(iteration.begin(), iteration.end());
  os << "# HELP cofab_agg_worker_lag_iterations newest iteration pushed by any worker minus this "
        "worker's\n# TYPE cofab_agg_worker_lag_iterations gauge\n";
  for (size_t w = 0; w < iteration.size(); ++w) {
    os << "cofab_agg_worker_lag_iterations{" << id << ",worker=\"" << w << "\"} "
       << newest - iteration[w] << '\n';
  }
  sync.render(os, id);
  return os.str();
}

}  // namespace cofab::aggregator
