#include "tests/aggregator/daemon_cluster.h"

#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/file_store.h"

namespace cofab::testing {

DaemonCluster::DaemonCluster(int servers, int workers, std::vector<std::string> extraArgs)
    : servers_(servers), workers_(workers), extra_(std::move(extraArgs)) {
  storeUrl_ = "file://" + dir_.path() + "/store";
}

DaemonCluster::~DaemonCluster() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    ::kill(pids_[i], SIGKILL);
    int st = 0;
    ::waitpid(pids_[i], &st, 0);
  }
}

Status DaemonCluster::start(Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(store_, openStore(storeUrl_, deadline));
  for (int i = 0; i < servers_; ++i) {
    std::vector<std::string> args = {COFAB_AGGD_PATH,
                                     "--store",
                                     storeUrl_,
                                     "--workers",
                                     std::to_string(workers_),
                                     "--id",
                                     std::to_string(i),
                                     "--servers",
                                     std::to_string(servers_),
                                     "--http",
                                     "127.0.0.1:0",
                                     "--listen",
                                     "127.0.0.1:0"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return errnoStatus(StatusCode::kIoError, "fork(cofab-aggd)", errno);
    if (pid == 0) {
      // Dies with the test process, even when the test is killed before its destructors run.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::execv(COFAB_AGGD_PATH, argv.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    reaped_.push_back(false);
  }
  const std::string prefix = "cofab/agg";
  for (int i = 0; i < servers_; ++i) {
    auto addr = store_->get(ps::serverAddressKey(prefix, i), deadline);
    if (!addr.ok()) return addr.status().withContext("daemon " + std::to_string(i));
    addresses_.push_back(toString(addr.value()));
    COFAB_ASSIGN_OR_RETURN(Bytes http,
                           store_->get(prefix + "/http/" + std::to_string(i), deadline));
    http_.push_back(toString(http));
  }
  return OkStatus();
}

void DaemonCluster::signal(int i, int sig) { ::kill(pids_.at(static_cast<size_t>(i)), sig); }

int DaemonCluster::wait(int i, Deadline deadline) {
  const auto idx = static_cast<size_t>(i);
  if (reaped_[idx]) return -1;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pids_[idx], &st, WNOHANG);
    if (r == pids_[idx]) {
      reaped_[idx] = true;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (deadline.expired()) return -1;
    std::this_thread::sleep_for(Millis(5));
  }
}

StatusOr<std::string> DaemonCluster::httpGet(int i, const std::string& path) {
  const std::string& hp = httpAddress(i);
  const auto colon = hp.rfind(':');
  httplib::Client cli(hp.substr(0, colon), std::atoi(hp.c_str() + colon + 1));
  cli.set_connection_timeout(5);
  cli.set_read_timeout(5);
  auto res = cli.Get(path.c_str());
  if (!res) return Unavailable("GET " + path + " from daemon " + std::to_string(i) + " failed");
  if (res->status != 200) {
    return Unavailable("GET " + path + ": HTTP " + std::to_string(res->status) + ": " + res->body);
  }
  return res->body;
}

StatusOr<double> DaemonCluster::metric(int i, const std::string& name,
                                       const std::string& labelPart) {
  COFAB_ASSIGN_OR_RETURN(std::string body, httpGet(i, "/metrics"));
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    if (!labelPart.empty() && line.find(labelPart) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return InvalidArgument("metric " + name + "{" + labelPart + "} not found in:\n" + body);
}

Status DaemonCluster::waitMetric(int i, const std::string& name, double want) {
  const Deadline d = Deadline::afterMs(15000);
  double last = -1;
  while (!d.expired()) {
    auto v = metric(i, name);
    if (v.ok()) {
      last = *v;
      if (last == want) return OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return DeadlineExceeded(name + " stayed at " + std::to_string(last) + ", want " +
                          std::to_string(want));
}

StatusOr<std::unique_ptr<ps::PushPullClient>> DaemonCluster::connect(int rank,
                                                                     ps::ClientOptions options) {
  return ps::PushPullClient::connect(*store_, rank, workers_, options);
}

}  // namespace cofab::testing
