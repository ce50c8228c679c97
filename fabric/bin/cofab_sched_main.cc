// cofab-sched: the central scheduler of MLfabric's central mode (fabric/transfer/
// central_scheduler.h, docs/TRANSFER.md). Registers its address under "<store-prefix>/address"
// in the job's Store (like cofab-aggd), grants workers' units per destination daemon (least
// loaded first, at most --dest-bytes undelivered, paced at --rate bytes/s; a request for more
// than 1 GiB, transfer::kMaxRequestBytes, is refused with the reason), serves until
// SIGTERM/SIGINT and exits 0. Exit 1 on a configuration or startup error (printed on stderr):
// an unknown option, a malformed or out-of-range number ("-1" included). A SIGTERM/SIGINT that
// arrives during startup (connecting to the store, waiting for the daemons' count) stops it
// there, exit 0, without publishing its address.
//
//   cofab-sched --store tcp://host:port --destinations 2 --dest-bytes 4194304
//   (workers: TransferOptions::scheduler = SchedClient::connect(store, rank))
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/param.h"
#include "core/stop_signals.h"
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

int fail(const std::string& why) {
  std::cerr << "cofab-sched: " << why << "\n";
  return 1;
}

// Stopped before serving: the address was not published, so no worker connects to a scheduler
// that is about to exit.
int stoppedBeforeServing(int sig) {
  logLine("event=stopped_before_serving signal=" + std::to_string(sig));
  return 0;
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
    // Byte counts and rates: parseIntIn, so "-1" is an error (strtoull wrapped it to 2^64-1).
    auto integer = [&](int64_t min, int64_t max) { return parseIntIn(v, a, min, max); };
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
    } else if (a == "--destinations" || a == "--dest-bytes" || a == "--rate") {
      // The byte flags take their variables' ranges (transfer::parseDestBytes / parseRate).
      auto n = a == "--destinations" ? integer(1, 4096)
               : a == "--dest-bytes" ? transfer::parseDestBytes(v, a)
                                     : transfer::parseRate(v, a);
      if (!n.ok()) return fail(n.status().message() + "\n" + kUsage);
      if (a == "--destinations") {
        o.numDestinations = static_cast<int>(*n);
      } else if (a == "--dest-bytes") {
        o.destBytes = static_cast<uint64_t>(*n);
      } else {
        o.rateBytesPerSec = static_cast<uint64_t>(*n);
      }
    } else {
      return fail("unknown option " + a + "\n" + kUsage);
    }
  }
  if (storeUrl.empty()) return fail("needs --store URL (or COFAB_STORE)\n" + std::string(kUsage));
  StopSignals::install();
  signal(SIGPIPE, SIG_IGN);

  // SIGTERM / SIGINT are taken by StopSignals from here on (core/stop_signals.h). A stop request
  // that arrives during startup must not let this process publish its address and exit right after:
  // workers would read a dead scheduler's address. So every startup wait is sliced, and a
  // pending stop ends the process before it publishes anything.
  int sig = 0;
  auto store =
      untilStopped<std::unique_ptr<Store>>([&](Deadline d) { return openStore(storeUrl, d); },
                                           Deadline::afterMs(60000), &sig, kStoreConnectSliceMs);
  if (sig != 0) return stoppedBeforeServing(sig);
  if (!store.ok()) return fail(store.status().toString());
  if (o.numDestinations == 0) {
    const std::string countKey = ps::serverCountKey(aggPrefix);
    auto count = untilStopped<Bytes>([&](Deadline d) { return (*store)->get(countKey, d); },
                                     Deadline::afterMs(60000), &sig);
    if (sig != 0) return stoppedBeforeServing(sig);
    if (!count.ok()) {
      return fail("no --destinations and the daemons' count is not in the store: " +
                  count.status().toString());
    }
    auto n = parseIntIn(std::string(count->begin(), count->end()),
                        "the daemons' count (" + countKey + " in the store)", 1, 4096);
    if (!n.ok()) return fail(n.status().message());
    o.numDestinations = static_cast<int>(*n);
  }
  auto sched = transfer::CentralScheduler::create(o);
  if (!sched.ok()) return fail(sched.status().toString());
  // The last look before publishing: from here on a stop request is taken by the wait below.
  if ((sig = StopSignals::pending()) != 0) {
    (*sched)->shutdown();
    return stoppedBeforeServing(sig);
  }
  const std::string& addr = (*sched)->address();
  Status reg =
      (*store)->set(transfer::schedulerAddressKey(prefix), Bytes(addr.begin(), addr.end()));
  if (!reg.ok()) return fail(reg.toString());
  const auto st = (*sched)->stats();
  logLine("event=serving address=" + addr + " destinations=" + std::to_string(o.numDestinations) +
          " dest_bytes=" + std::to_string(st.destBytes));
  StopSignals::wait();
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
