// SchedClient: a worker's connection to the central scheduler (cofab-sched,
// fabric/transfer/central_scheduler.h). TransferManager (TransferOptions::scheduler) calls
// acquire() before sending each unit and delivered() once the unit's daemon acknowledged it.
//
//   auto sched = transfer::SchedClient::connect(*store, rank, {});   // reads "<prefix>/address"
//   transfer::TransferOptions o; o.scheduler = sched->get();
//
// Errors: a scheduler that is gone (connection closed or broken) fails every pending and later
// acquire() at once with Unavailable naming "cofab-sched at <address>"; a grant that does not
// come before the deadline is DeadlineExceeded naming the scheduler, the destination and how
// many requests are waiting. Never hangs.
//
// Ownership and threads: the caller owns the client (it must outlive the managers using it).
// acquire() blocks its caller (the manager's dispatcher); delivered() never blocks and may be
// called from any thread, including another transport's I/O thread. Grants arrive on this
// client's own transport I/O thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/rendezvous/store.h"

namespace cofab::transfer {

struct SchedClientOptions {
  std::string transport = "tcp";
  std::string storePrefix = "cofab/sched";
  std::string address;  // the scheduler's address instead of the store
  int64_t connectTimeoutMs = 60000;
};

struct SchedGrant {
  uint64_t id = 0;  // the request id, echoed in delivered()
  int destination = 0;
  int64_t delayUs = 0;  // pacing: start sending this long after the grant arrived
};

struct SchedClientStats {
  uint64_t requests = 0;
  uint64_t grants = 0;
  uint64_t delivered = 0;
  int64_t pacedUs = 0;  // total delay imposed by grants
  // Grants that came after their acquire() had given up, given straight back.
  uint64_t lateGrantsReturned = 0;
};

class SchedClient {
 public:
  static StatusOr<std::unique_ptr<SchedClient>> connect(Store& store, int rank,
                                                        const SchedClientOptions& options = {});
  // options.address must be set.
  static StatusOr<std::unique_ptr<SchedClient>> connect(int rank,
                                                        const SchedClientOptions& options);
  ~SchedClient();
  SchedClient(const SchedClient&) = delete;
  SchedClient& operator=(const SchedClient&) = delete;

  // Requests a grant to send `bytes` to one of `candidates` (destination ids; the scheduler picks
  // the least loaded that has room, SchedGrant::destination) and waits for it until `deadline`;
  // then waits out the grant's pacing delay. A grant whose pacing ends after the deadline is
  // given back at once and DeadlineExceeded; Deadline::never() is InvalidArgument.
  StatusOr<SchedGrant> acquire(const std::vector<int>& candidates, uint64_t bytes,
                               Deadline deadline);
  StatusOr<SchedGrant> acquire(int destination, uint64_t bytes, Deadline deadline) {
    return acquire(std::vector<int>{destination}, bytes, deadline);
  }
  // Reports a granted unit as delivered (acknowledged by its daemon): frees its bytes.
  void delivered(const SchedGrant& grant);
  // Gives a grant back unused (its unit was dropped meanwhile): frees its bytes and its pacing
  // slot, so refused grants do not push the destination's pacing clock ahead of real time.
  void giveBack(const SchedGrant& grant);
  // delivered() as a function that stays safe to call after this client is destroyed (it then
  // does nothing): for completion callbacks that may run after their owner is gone.
  std::function<void(const SchedGrant&)> deliveryReporter() const;

  const std::string& address() const;
  SchedClientStats stats() const;
  Status status() const;  // OK, or why the scheduler is unusable

  struct Impl;

 private:
  explicit SchedClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace cofab::transfer
