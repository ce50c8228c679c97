// DaemonCluster: real cofab-aggd processes for tests, meeting their workers through a FileStore
// in a fresh temp dir. start() spawns M daemons (fork + exec of the binary built by this tree,
// killed with the test process through PR_SET_PDEATHSIG) and waits until each has registered; the
// destructor SIGKILLs and reaps whatever still runs. Spawning creates no threads here, so tests may
// fork workers (ProcessGroup) afterwards. Used from the test's main thread only.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/store.h"
#include "tests/support/temp_dir.h"

namespace cofab::testing {

class DaemonCluster {
 public:
  DaemonCluster(int servers, int workers, std::vector<std::string> extraArgs = {});
  ~DaemonCluster();
  DaemonCluster(const DaemonCluster&) = delete;
  DaemonCluster& operator=(const DaemonCluster&) = delete;

  Status start(Deadline deadline = Deadline::afterMs(30000));

  Store& store() { return *store_; }
  const std::string& storeUrl() const { return storeUrl_; }
  int servers() const { return servers_; }
  int workers() const { return workers_; }
  const std::string& address(int i) const { return addresses_.at(static_cast<size_t>(i)); }
  const std::string& httpAddress(int i) const { return http_.at(static_cast<size_t>(i)); }

  void signal(int i, int sig);
  // Waits for daemon i; its exit code, 128+signal when killed, -1 at the deadline.
  int wait(int i, Deadline deadline);
  // GET http://<httpAddress(i)><path>: body, or the error.
  StatusOr<std::string> httpGet(int i, const std::string& path);
  // Value of the first sample of `metric` whose labels contain `labelPart` ("" for any).
  StatusOr<double> metric(int i, const std::string& metric, const std::string& labelPart = "");
  // Polls metric() until it equals `want` (a condition on the daemon's state, not a time):
  // what a daemon counts after answering a peer may be read before it did. DeadlineExceeded
  // with the last value after 15 s.
  Status waitMetric(int i, const std::string& metric, double want);

  // A client for worker `rank` with these options on top of the cluster's store.
  StatusOr<std::unique_ptr<ps::PushPullClient>> connect(int rank, ps::ClientOptions options = {});

 private:
  int servers_;
  int workers_;
  std::vector<std::string> extra_;
  TempDir dir_;
  std::string storeUrl_;
  std::unique_ptr<Store> store_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::vector<std::string> addresses_;
  std::vector<std::string> http_;
};

}  // namespace cofab::testing
