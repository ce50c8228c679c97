// cofab-sched: the central scheduler of MLfabric's central mode (fabric/transfer/
// central_scheduler.h, docs/TRANSFER.md). Registers its address under "<store-prefix>/address"
// in the job's Store (like cofab-aggd), grants workers' units per destination daemon (least
// loaded first, at most --dest-bytes undelivered, paced at --rate bytes/s), serves until
// SIGTERM/SIGINT and exits 0. Exit 1 on a configuration or startup error (printed on stderr).
//
//   cofab-sched --store tcp://host:port --destinations 2 --dest-bytes 4194304
//   (workers: TransferOptions::scheduler = SchedClient::connect(store, rank))
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/param.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transfer/central_scheduler.h"

using namespace cofab;

namespace {

constexpr const char* kUsage =
    "usage: cofab-sched [options]\n"
    "  --store URL          register in this store (default COFAB_STORE)\n"
    "  --store-prefix P     register as P/address (default cofab/sched)\n"
    "  --destinations N     number of aggregator daemons (default: <agg-prefix>/count from the "
    "store)\n"
    "  --agg-prefix P       the daemons' store prefix (default cofab/agg)\n"
    "  --dest-bytes B       bytes granted and not delivered per daemon (COFAB_SCHED_DEST_BYTES)\n"
    "  --rate B             pacing per daemon in bytes/s, 0 = unpaced (COFAB_SCHED_RATE)\n"
    "  --listen ADDR        listen address (default: the transport's, kernel-chosen port)\n"
    "  --transport NAME     (default tcp)\n";

void logLine(const std::string& text) {
  const std::string line = wallTimestamp() + " cofab-sched " + text + "\n";
  (void)!write(2, line.data(), line.size());
}

bool parseU64(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtoull(s.c_str(), &end, 10);
  return end && *end == '\0';
}

int fail(const std::string& why) {
  std::cerr << "cofab-sched: " << why << "\n";
  return 1;
}

int run(const std::vector<std::string>& args) {
  transfer::SchedulerOptions o;
  o.numDestinations = 0;
  std::string storeUrl, prefix = "cofab/sched", aggPrefix = "cofab/agg";
  (void)rawParamValue("COFAB_STORE", &storeUrl);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (i + 1 >= args.size()) return fail("unknown option or missing value: " + a + "\n" + kUsage);
    const std::string& v = args[++i];
    uint64_t n = 0;
    if (a == "--store") {
      storeUrl = v;
    } else if (a == "--store-prefix") {
      prefix = v;
    } else if (a == "--agg-prefix") {
      aggPrefix = v;
    } else if (a == "--listen") {
      o.listenAddress = v;
    } else if (a == "--transport") {
      o.transport = v;
    } else if (a == "--destinations" && parseU64(v, &n) && n >= 1 && n <= 4096) {
      o.numDestinations = static_cast<int>(n);
    } else if (a == "--dest-bytes" && parseU64(v, &n) && n >= 1) {
      o.destBytes = n;
    } else if (a == "--rate" && parseU64(v, &n)) {
      o.rateBytesPerSec = n;
    } else {
      return fail("bad option " + a + " " + v + "\n" + kUsage);
    }
  }
  if (storeUrl.empty()) return fail("needs --store URL (or COFAB_STORE)\n" + std::string(kUsage));
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGTERM);
  sigaddset(&stopSignals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto store = openStore(storeUrl, Deadline::afterMs(60000));
  if (!store.ok()) return fail(store.status().toString());
  if (o.numDestinations == 0) {
    auto count = (*store)->get(ps::serverCountKey(aggPrefix), Deadline::afterMs(60000));
    if (!count.ok()) {
      return fail("no --destinations and the daemons' count is not in the store: " +
                  count.status().toString());
    }
    uint64_t n = 0;
    if (!parseU64(std::string(count->begin(), count->end()), &n) || n < 1) {
      return fail("bad daemon count in the store");
    }
    o.numDestinations = static_cast<int>(n);
  }
  auto sched = transfer::CentralScheduler::create(o);
  if (!sched.ok()) return fail(sched.status().toString());
  const std::string& addr = (*sched)->address();
  Status reg =
      (*store)->set(transfer::schedulerAddressKey(prefix), Bytes(addr.begin(), addr.end()));
  if (!reg.ok()) return fail(reg.toString());
  const auto st = (*sched)->stats();
  logLine("event=serving address=" + addr + " destinations=" + std::to_string(o.numDestinations) +
          " dest_bytes=" + std::to_string(st.destBytes));
  int sig = 0;
  sigwait(&stopSignals, &sig);
  (*sched)->shutdown();
  uint64_t granted = 0, delivered = 0;
  for (const auto& d : (*sched)->stats().destinations) {
    granted += d.granted;
    delivered += d.delivered;
  }
  logLine("event=stopped granted=" + std::to_string(granted) +
          " delivered=" + std::to_string(delivered));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
