// Per-transfer records kept by the TransferManager and their export as a Chrome trace-event
// JSON timeline (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU,
// opens in Perfetto and chrome://tracing). Pure data and functions; any thread.
//
// Timeline layout: one process per worker (pid = rank), one track per destination daemon
// (tid = daemon index), and per transfer unit three async slices on that track:
//   "queued"   enqueue -> handed to the transport (time spent waiting for its turn),
//   "sent"     handed to the transport -> acknowledged by the daemon (wire + credit + apply),
//   "reduce"   acknowledged -> result delivered (waiting for the other workers + the result).
// Timestamps are CLOCK_MONOTONIC microseconds, so traces of workers on one host line up when
// their "traceEvents" arrays are concatenated.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cofab::transfer {

struct TransferRecord {
  std::string name;            // "key=7 chunk=2/4", "bucket keys=3,4,5"
  std::vector<uint64_t> keys;  // the update key(s) the unit carries
  uint32_t chunk = 0;          // chunk index (0 for a bucket)
  uint32_t chunks = 1;         // chunks of its update (1 for a bucket)
  bool fused = false;          // a bucket of small updates
  int priority = 0;
  uint64_t iteration = 0;  // model version of its (first) update
  int destination = 0;     // daemon index: by placement, where it went once sent
  uint64_t bytes = 0;
  uint64_t sendIndex = ~0ull;   // position in this manager's send order; ~0: never sent
  uint64_t sendsAtEnqueue = 0;  // units handed to the transport before this one was queued
  int64_t queuedNs = 0;         // nowNs() stamps; 0 = did not happen
  int64_t sentNs = 0;
  int64_t ackedNs = 0;
  int64_t doneNs = 0;
  std::string outcome;  // "" while pending, "ok", or the failure ("cancelled", a Status text)
};

// The trace-event JSON object {"traceEvents":[...],"displayTimeUnit":"ms"} for `records` of
// worker `pid` (named `processName` in the viewer).
std::string chromeTraceJson(const std::vector<TransferRecord>& records, int pid,
                            std::string_view processName);

// Writes chromeTraceJson(...) to `path`: IoError naming the path on failure.
Status writeChromeTrace(const std::string& path, const std::vector<TransferRecord>& records,
                        int pid, std::string_view processName);

}  // namespace cofab::transfer
