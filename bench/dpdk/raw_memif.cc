#include "bench/dpdk/raw_memif.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

namespace cofab::bench {
namespace {

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

RawResult runRawMemif(const std::string& ealArgs, bool sender, int frameBytes, double seconds) {
  RawResult r;
  std::vector<std::string> words = {"raw"};
  std::istringstream in(ealArgs);
  std::string w;
  while (in >> w) words.push_back(w);
  std::vector<char*> argv;
  for (auto& s : words) argv.push_back(s.data());
  if (rte_eal_init(static_cast<int>(argv.size()), argv.data()) < 0) {
    r.error = std::string("rte_eal_init: ") + rte_strerror(rte_errno);
    return r;
  }
  rte_mempool* pool =
      rte_pktmbuf_pool_create("raw", 8191, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
  if (pool == nullptr || rte_eth_dev_count_avail() == 0) {
    r.error = "no pool or no port";
    return r;
  }
  rte_eth_conf conf;
  std::memset(&conf, 0, sizeof(conf));
  if (rte_eth_dev_configure(0, 1, 1, &conf) != 0 ||
      rte_eth_rx_queue_setup(0, 0, 1024, SOCKET_ID_ANY, nullptr, pool) != 0 ||
      rte_eth_tx_queue_setup(0, 0, 1024, SOCKET_ID_ANY, nullptr) != 0 ||
      rte_eth_dev_start(0) != 0) {
    r.error = "port setup failed";
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  rte_eth_link link;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    rte_eth_link_get_nowait(0, &link);
  } while (link.link_status == 0 && secondsSince(start) < 10);
  if (link.link_status == 0) {
    r.error = "memif link did not come up";
    return r;
  }
  rte_mbuf* pkts[32];
  if (sender) {
    const auto t0 = std::chrono::steady_clock::now();
    while (secondsSince(t0) < seconds + 1.0) {  // outlasts the receiver's window
      if (rte_pktmbuf_alloc_bulk(pool, pkts, 32) != 0) continue;
      for (auto* m : pkts) rte_pktmbuf_append(m, static_cast<uint16_t>(frameBytes));
      const uint16_t n = rte_eth_tx_burst(0, 0, pkts, 32);
      if (n < 32) rte_pktmbuf_free_bulk(pkts + n, 32u - n);
    }
    r.ok = true;
    return r;
  }
  uint64_t bytes = 0, frames = 0;
  std::chrono::steady_clock::time_point t0;
  bool started = false;
  const auto giveUp = std::chrono::steady_clock::now();
  while (true) {
    const uint16_t n = rte_eth_rx_burst(0, 0, pkts, 32);
    if (n > 0 && !started) {
      started = true;
      t0 = std::chrono::steady_clock::now();
    }
    for (uint16_t i = 0; i < n; ++i) bytes += rte_pktmbuf_pkt_len(pkts[i]);
    frames += n;
    if (n > 0) rte_pktmbuf_free_bulk(pkts, n);
    if (started && secondsSince(t0) >= seconds) break;
    if (!started && secondsSince(giveUp) > 10) {
      r.error = "no frames arrived";
      return r;
    }
  }
  const double s = secondsSince(t0);
  r.ok = true;
  r.gbps = static_cast<double>(bytes) * 8 / s / 1e9;
  r.mpps = static_cast<double>(frames) / s / 1e6;
  return r;
}

}  // namespace cofab::bench
