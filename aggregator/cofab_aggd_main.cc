// cofab-aggd: the aggregator daemon. Workers push gradient chunks to it and get sums back
// (fabric/ps/push_pull.h); docs/AGGREGATOR.md has the protocol, flags and deployment.
//
//   cofab-run -n 4 --role agg:2:cofab-aggd -- ./my_trainer
//
// Started by cofab-run it reads COFAB_ROLE_RANK/SIZE, COFAB_WORLD_SIZE and COFAB_STORE, registers
// its address under <store-prefix>/server/<id>, serves until SIGTERM/SIGINT, then drains and
// exits 0. Exit 1 on a configuration or startup error (printed on stderr).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "aggregator/aggregator_server.h"
#include "aggregator/daemon_config.h"
#include "aggregator/http_endpoint.h"
#include "core/heap.h"
#include "core/log.h"
#include "core/stop_signals.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/store.h"

using namespace cofab;
using namespace cofab::aggregator;

namespace {

void logLine(const std::string& text) {
  const std::string line = wallTimestamp() + " cofab-aggd " + text + "\n";
  (void)!write(2, line.data(), line.size());
}

// Publishes this daemon and wires replication. A stop request during its waits, or before the
// worker-facing keys go out, ends it early with *stopped set: nothing worker-facing published.
Status registerAndReplicate(AggregatorServer& server, const DaemonConfig& c, Store* store,
                            const std::string& httpAddress, int* stopped) {
  const ServerOptions& o = server.options();
  const Deadline deadline = Deadline::afterMs(c.connectTimeoutMs);
  const int backup = (o.id + 1) % o.numServers;
  // In slices, like the waits: a connect to a backup not up yet retries until the deadline
  // (--connect-timeout-ms), and a SIGTERM meanwhile waited all of it and then exited 1. Slices
  // of 2 s, as tcp's per-address connect slice: each is a whole attempt, and one that needs
  // longer (rdma's set-up registering large slot rings) must not be cut short every time.
  auto connectBackup = [&](const std::string& address) -> Status {
    auto r = untilStopped<bool>(
        [&](Deadline d) -> StatusOr<bool> {
          COFAB_RETURN_IF_ERROR(server.connectBackup(address, d));
          return true;
        },
        deadline, stopped, /*sliceMs=*/2000);
    return *stopped != 0 ? OkStatus() : r.status();
  };
  if (store) {
    // Every daemon of the job must say the same --servers: workers read one count, while each
    // daemon places chunks and backups by its own. The first one's stays; another count is
    // refused before anything of this daemon is published (it used to overwrite the key).
    const std::string countKey = ps::serverCountKey(c.storePrefix);
    const Bytes count = toBytes(std::to_string(o.numServers));
    COFAB_ASSIGN_OR_RETURN(Bytes agreed, store->compareSet(countKey, {}, count));
    if (agreed != count) {
      return InvalidArgument("daemon " + std::to_string(o.id) + " says --servers " +
                             std::to_string(o.numServers) + ", but " + store->describe() +
                             " holds " + toString(agreed) + " under '" + countKey +
                             "' from another daemon of this job (or an earlier job: use a "
                             "fresh store or --store-prefix per job)");
    }
    // Daemon-to-daemon address first; the worker-facing key only once replication is wired,
    // so no worker can push before this daemon forwards.
    const std::string listenKey = c.storePrefix + "/listen/" + std::to_string(o.id);
    COFAB_RETURN_IF_ERROR(store->set(listenKey, toBytes(server.address())));
    if (o.replication) {
      const std::string backupKey = c.storePrefix + "/listen/" + std::to_string(backup);
      auto addr = untilStopped<Bytes>([&](Deadline d) { return store->get(backupKey, d); },
                                      deadline, stopped);
      if (*stopped != 0) return OkStatus();
      COFAB_RETURN_IF_ERROR(addr.status());
      COFAB_RETURN_IF_ERROR(connectBackup(toString(*addr)));
      if (*stopped != 0) return OkStatus();
    }
    if ((*stopped = StopSignals::pending()) != 0) return OkStatus();
    if (!httpAddress.empty()) {
      COFAB_RETURN_IF_ERROR(
          store->set(c.storePrefix + "/http/" + std::to_string(o.id), toBytes(httpAddress)));
    }
    COFAB_RETURN_IF_ERROR(store->set(ps::serverMaxChunkKey(c.storePrefix, o.id),
                                     toBytes(std::to_string(o.maxChunkBytes))));
    COFAB_RETURN_IF_ERROR(
        store->set(ps::serverAddressKey(c.storePrefix, o.id), toBytes(server.address())));
  } else if (o.replication) {
    COFAB_RETURN_IF_ERROR(connectBackup(c.peers[static_cast<size_t>(backup)]));
    if (*stopped != 0) return OkStatus();
    // Nothing is published in --peers mode: a stop request now is still before serving.
    *stopped = StopSignals::pending();
  }
  return OkStatus();
}

int run(const std::vector<std::string>& args) {
  auto parsed = parseDaemonArgs(args);
  if (!parsed.ok()) {
    std::cerr << "cofab-aggd: " << parsed.status().message() << "\n";
    return 1;
  }
  DaemonConfig c = std::move(parsed).value();
  if (c.help) {
    std::cout << daemonUsage();
    return 0;
  }
  // Every request's payload is a buffer of a chunk's size: keep them in the heap (core/heap.h).
  if (auto heap = keepLargeBlocksInHeap(); !heap.ok()) {
    std::cerr << "cofab-aggd: " << heap.status().message() << "\n";
    return 1;
  }
  // SIGTERM/SIGINT reach the main thread through StopSignals (core/stop_signals.h) whichever
  // thread the kernel picks; the threads started below block them, so none is interrupted.
  StopSignals::install();
  signal(SIGPIPE, SIG_IGN);

  // A stop request while starting: exit 0 before advertising anything (workers must not read
  // the address of a daemon that is about to go).
  int stopped = 0;
  auto stoppedBeforeServing = [&] {
    logLine("event=stopped_before_serving signal=" + std::to_string(stopped));
    return 0;
  };
  std::unique_ptr<Store> store;
  if (c.peers.empty()) {
    auto s = untilStopped<std::unique_ptr<Store>>(
        [&](Deadline d) { return openStore(c.storeUrl, d); }, Deadline::afterMs(c.connectTimeoutMs),
        &stopped, kStoreConnectSliceMs);
    if (stopped != 0) return stoppedBeforeServing();
    if (!s.ok()) {
      std::cerr << "cofab-aggd: " << s.status().toString() << "\n";
      return 1;
    }
    store = std::move(s).value();
  }
  auto server = AggregatorServer::create(c.server);
  if (!server.ok()) {
    std::cerr << "cofab-aggd: " << server.status().toString() << "\n";
    return 1;
  }
  std::unique_ptr<HttpEndpoint> http;
  std::string httpAddress;
  if (c.http != "off") {
    HttpEndpointOptions ho;
    const auto colon = c.http.rfind(':');
    ho.host = colon == std::string::npos ? c.http : c.http.substr(0, colon);
    ho.port = colon == std::string::npos ? 0 : std::atoi(c.http.c_str() + colon + 1);
    AggregatorServer* srv = server->get();
    ho.metrics = [srv] { return srv->renderMetrics(); };
    ho.healthy = [srv] { return !srv->draining(); };
    auto h = HttpEndpoint::start(ho);
    if (!h.ok()) {
      std::cerr << "cofab-aggd: " << h.status().toString() << "\n";
      return 1;
    }
    http = std::move(h).value();
    httpAddress = ho.host + ":" + std::to_string(http->port());
  }
  Status reg = registerAndReplicate(**server, c, store.get(), httpAddress, &stopped);
  if (stopped != 0) {
    (*server)->shutdown(stopped == SIGTERM ? "SIGTERM" : "SIGINT");
    if (http) http->stop();
    return stoppedBeforeServing();
  }
  if (!reg.ok()) {
    std::cerr << "cofab-aggd: " << reg.toString() << "\n";
    return 1;
  }
  const ServerOptions& o = (*server)->options();
  logLine("event=serving id=" + std::to_string(o.id) + " servers=" + std::to_string(o.numServers) +
          " workers=" + std::to_string(o.numWorkers) + " transport=" + o.transport + " address=" +
          (*server)->address() + " http=" + (httpAddress.empty() ? "off" : httpAddress) +
          " engines=" + std::to_string(o.engineThreads) +
          " replication=" + (o.replication ? "on" : "off"));
  const int sig = StopSignals::wait();
  logLine("event=draining signal=" + std::to_string(sig));
  (*server)->shutdown(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  const Metrics& m = (*server)->metrics();
  logLine("event=stopped rounds=" + std::to_string(m.roundsCompleted.load()) + " rounds_failed=" +
          std::to_string(m.roundsFailed.load()) + " bytes_in=" + std::to_string(m.bytesIn.load()) +
          " bytes_out=" + std::to_string(m.bytesOut.load()) +
          " rejects=" + std::to_string(m.rejectsTotal()));
  if (http) http->stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
