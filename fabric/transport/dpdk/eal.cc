#include "fabric/transport/dpdk/eal.h"

#include <pthread.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_mbuf.h>

#include <cstring>
#include <sstream>

#include "core/log.h"
#include "core/param.h"
#include "fabric/transport/dpdk/driver_traits.h"

namespace cofab::transport::dpdk {
namespace {

COFAB_PARAM_STRING(kEalArgs, "COFAB_DPDK_EAL_ARGS",
                   "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry",
                   "DPDK EAL arguments (whitespace-separated) used by the first dpdk context");
COFAB_PARAM_STRING(kVdev, "COFAB_DPDK_VDEV", "",
                   "';'-separated --vdev values, e.g. net_memif0,role=server,socket=/tmp/x.sock; "
                   "empty: in-process ring ports");
// At least 4095: data frames stop below 512 free mbufs (acks must always find one), frames past a
// hole are held only above 1024 free, and a port's RX ring and the per-lcore cache (256) take
// theirs first. With the old floor, 1023, every frame past a hole was dropped (loss recovery
// turned go-back-N), and on a port whose RX ring is filled from the pool no data frame was
// ever built.
COFAB_PARAM_INT(kMbufs, "COFAB_DPDK_MBUFS", 8191, 4095, 1 << 20, "mbufs in each port's pool");
COFAB_PARAM_INT(kMtu, "COFAB_DPDK_MTU", 1500, 576, 9000,
                "IP MTU of dpdk frames (capped by what the port allows, and at 2034 by the "
                "2 KiB mbuf)");

constexpr uint16_t kRingSize = 1024;
constexpr uint16_t kQueueDescriptors = 1024;

std::vector<std::string> splitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

}  // namespace

StatusOr<Eal*> Eal::get() {
  // Leaked on purpose: EAL outlives every static destructor that might still free mbufs.
  static Eal* eal = new Eal();
  static Status started = eal->start();
  if (!started.ok()) return started;
  return eal;
}

Status Eal::start() {
  COFAB_ASSIGN_OR_RETURN(std::string args, kEalArgs.get());
  COFAB_ASSIGN_OR_RETURN(std::string vdevs, kVdev.get());
  static std::vector<std::string> words;  // EAL may keep pointers into argv
  words = {"cofab"};
  for (auto& w : splitWords(args)) words.push_back(w);
  std::string v;
  std::istringstream in(vdevs);
  while (std::getline(in, v, ';')) {
    if (!v.empty()) words.push_back("--vdev=" + v);
  }
  static std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  std::string joined;
  for (auto& w : words) joined += (joined.empty() ? "" : " ") + w;

  // rte_eal_init pins the calling thread to the main lcore; this thread is the application's,
  // and threads it creates later inherit its mask, so put the mask back afterwards.
  cpu_set_t saved;
  const bool haveMask = pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
  const int rc = rte_eal_init(static_cast<int>(argv.size()), argv.data());
  const int err = rte_errno;
  if (haveMask) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  if (rc < 0) {
    return dpdkError(StatusCode::kUnavailable, "rte_eal_init(" + joined + ")", err)
        .withContext("dpdk transport unavailable (set COFAB_DPDK_EAL_ARGS; see docs/DPDK.md)");
  }
  rte_log_set_global_level(RTE_LOG_WARNING);
  // EAL goes on when a vdev fails to probe (it only logs it); a context would then silently
  // fall back to in-process ring ports and never see its peer. Refuse instead.
  in.clear();
  in.str(vdevs);
  while (std::getline(in, v, ';')) {
    const std::string name = v.substr(0, v.find(','));
    uint16_t id = 0;
    if (!name.empty() && rte_eth_dev_get_port_by_name(name.c_str(), &id) != 0) {
      // memif's zero-copy client lends its memory by file descriptor, one per segment list: the
      // commonest reason for a refusal, and one EAL's log states only in its own terms.
      const bool zeroCopy = v.find("zero-copy=yes") != std::string::npos;
      const bool singleFile = args.find("--single-file-segments") != std::string::npos;
      return FailedPrecondition(
          "dpdk: vdev '" + v + "' (COFAB_DPDK_VDEV) did not probe; EAL's log above says why" +
          (zeroCopy && !singleFile ? " (memif zero-copy needs --single-file-segments in "
                                     "COFAB_DPDK_EAL_ARGS)"
                                   : ""));
    }
  }

  uint16_t portId;
  RTE_ETH_FOREACH_DEV(portId) {
    char name[RTE_ETH_NAME_MAX_LEN] = {};
    rte_eth_dev_get_name_by_port(portId, name);
    std::string spec;  // this port's --vdev value, if it came from one
    in.clear();
    in.str(vdevs);
    while (std::getline(in, v, ';')) {
      if (v.substr(0, v.find(',')) == name) spec = v;
    }
    auto p = setupPort(portId, nullptr, nullptr, name, spec, nullptr);
    if (!p.ok()) return p.status();
  }
  ringMode_ = ports_.empty();
  COFAB_LOG(kInfo, "dpdk") << "EAL started (" << joined << "), " << ports_.size() << " port(s)"
                           << (ringMode_ ? ", ring mode" : "");
  return OkStatus();
}

StatusOr<Port*> Eal::setupPort(uint16_t portId, rte_ring* ringRx, rte_ring* ringTx,
                               const std::string& name, std::string_view vdevSpec,
                               const MacAddress* macOverride) {
  COFAB_ASSIGN_OR_RETURN(int64_t mbufs, kMbufs.get());
  COFAB_ASSIGN_OR_RETURN(int64_t wantMtu, kMtu.get());
  const std::string poolName = "cofab_pool" + std::to_string(ports_.size());
  rte_mempool* pool = rte_pktmbuf_pool_create(poolName.c_str(), static_cast<unsigned>(mbufs), 256,
                                              0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
  if (pool == nullptr) {
    return dpdkError(StatusCode::kResourceExhausted, "rte_pktmbuf_pool_create(" + poolName + ")",
                     rte_errno);
  }
  rte_eth_dev_info info;
  int rc = rte_eth_dev_info_get(portId, &info);
  if (rc != 0) return dpdkError(StatusCode::kUnavailable, "rte_eth_dev_info_get(" + name + ")", rc);
  rte_eth_conf conf;
  std::memset(&conf, 0, sizeof(conf));
  rc = rte_eth_dev_configure(portId, 1, 1, &conf);
  if (rc != 0)
    return dpdkError(StatusCode::kUnavailable, "rte_eth_dev_configure(" + name + ")", rc);
  uint16_t rxd = kQueueDescriptors, txd = kQueueDescriptors;
  rc = rte_eth_dev_adjust_nb_rx_tx_desc(portId, &rxd, &txd);
  if (rc != 0) {
    return dpdkError(StatusCode::kUnavailable, "rte_eth_dev_adjust_nb_rx_tx_desc(" + name + ")",
                     rc);
  }
  rc = rte_eth_rx_queue_setup(portId, 0, rxd, rte_eth_dev_socket_id(portId), nullptr, pool);
  if (rc != 0)
    return dpdkError(StatusCode::kUnavailable, "rte_eth_rx_queue_setup(" + name + ")", rc);
  rc = rte_eth_tx_queue_setup(portId, 0, txd, rte_eth_dev_socket_id(portId), nullptr);
  if (rc != 0)
    return dpdkError(StatusCode::kUnavailable, "rte_eth_tx_queue_setup(" + name + ")", rc);
  // The MTU is a wish: keep what the port accepts (ring ports take anything).
  uint16_t mtu = static_cast<uint16_t>(wantMtu);
  if (info.max_mtu != 0 && mtu > info.max_mtu) mtu = info.max_mtu;
  if (rte_eth_dev_set_mtu(portId, mtu) != 0) {
    uint16_t cur = 0;
    if (rte_eth_dev_get_mtu(portId, &cur) == 0 && cur >= 576 && cur < mtu) mtu = cur;
  }
  // The mbuf data room bounds the frame too.
  const uint16_t room = RTE_MBUF_DEFAULT_BUF_SIZE - RTE_PKTMBUF_HEADROOM - kEthHeaderSize;
  if (mtu > room) mtu = room;
  rc = rte_eth_dev_start(portId);
  if (rc != 0) return dpdkError(StatusCode::kUnavailable, "rte_eth_dev_start(" + name + ")", rc);
  rte_eth_promiscuous_enable(portId);  // best effort: vdevs without a filter say ENOTSUP
  rte_ether_addr addr;
  MacAddress mac{};
  if (macOverride != nullptr) {
    mac = *macOverride;
  } else if (rte_eth_macaddr_get(portId, &addr) == 0) {
    std::memcpy(mac.data(), addr.addr_bytes, 6);
  }
  const bool cold = rxArrivesCold(info.driver_name != nullptr ? info.driver_name : "", vdevSpec);
  ports_.push_back(
      std::make_unique<Port>(this, portId, name, pool, mac, mtu, ringRx, ringTx, cold));
  return ports_.back().get();
}

StatusOr<Port*> Eal::acquirePort(const std::string& wanted) {
  // Checked for every context, not only where a port's pool is made: a malformed or too small
  // setting is an error whether or not this context gets a port made earlier.
  COFAB_RETURN_IF_ERROR(kMbufs.get().status());
  std::lock_guard<std::mutex> lock(mu_);
  std::string names;
  for (auto& p : ports_) {
    if (!wanted.empty() && p->name() != wanted) continue;
    names += (names.empty() ? "" : ", ") + p->name();
    if (!p->inUse.exchange(true)) return p.get();
  }
  // A port asked for by name is that port or an error, in ring mode too: a fresh ring port in
  // its place connected nowhere (COFAB_DPDK_PORT=net_memif0 with the vdev missing from EAL's
  // arguments), and connect later failed with "no answer".
  if (!ringMode_ || !wanted.empty()) {
    if (names.empty()) {
      return InvalidArgument("no DPDK port named '" + wanted + "' (check COFAB_DPDK_VDEV)");
    }
    return Unavailable("every DPDK port of this process is in use by another context (" + names +
                       "): one context per port; add a --vdev per context (COFAB_DPDK_VDEV)");
  }
  if (ringPortCount_ == kMaxRingPorts) {
    return ResourceExhausted("all " + std::to_string(kMaxRingPorts) +
                             " in-process ring ports are in use by other dpdk contexts");
  }
  // A new in-process ring port with a locally administered MAC.
  const int idx = ringPortCount_;
  const std::string base = "cofab_ring" + std::to_string(idx);
  rte_ring* rx = rte_ring_create((base + "rx").c_str(), kRingSize, SOCKET_ID_ANY, RING_F_SC_DEQ);
  if (rx == nullptr) return dpdkError(StatusCode::kResourceExhausted, "rte_ring_create", rte_errno);
  rte_ring* tx = rte_ring_create((base + "tx").c_str(), kRingSize, SOCKET_ID_ANY,
                                 RING_F_SP_ENQ | RING_F_SC_DEQ);
  if (tx == nullptr) return dpdkError(StatusCode::kResourceExhausted, "rte_ring_create", rte_errno);
  const std::string devName = "net_" + base;
  const int portId = rte_eth_from_rings(devName.c_str(), &rx, 1, &tx, 1, SOCKET_ID_ANY);
  if (portId < 0) {
    return dpdkError(StatusCode::kUnavailable, "rte_eth_from_rings(" + devName + ")", rte_errno);
  }
  // Ring ports get their MAC from us: 02 (locally administered) cf:ab then the index.
  const MacAddress mac{0x02, 0xcf, 0xab, 0x00, 0x00, static_cast<uint8_t>(idx + 1)};
  COFAB_ASSIGN_OR_RETURN(Port * port,
                         setupPort(static_cast<uint16_t>(portId), rx, tx, devName, "", &mac));
  port->inUse = true;
  ringPorts_[idx].store(port, std::memory_order_release);
  ++ringPortCount_;
  return port;
}

void Eal::releasePort(Port* port) {
  rte_mbuf* pkts[32];
  uint16_t n;
  // Bounded: a ring port's RX ring holds at most kRingSize frames; PMD queues are finite.
  for (int i = 0; i < 1024 && (n = port->rxBurst(pkts, 32)) > 0; ++i) {
    rte_pktmbuf_free_bulk(pkts, n);
  }
  std::lock_guard<std::mutex> lock(mu_);
  port->inUse = false;
}

Port* Eal::ringPeer(const MacAddress& mac) {
  // The last byte is the ring index + 1 (see acquirePort); check the whole MAC anyway.
  const int idx = mac[5] - 1;
  if (idx < 0 || idx >= kMaxRingPorts) return nullptr;
  Port* p = ringPorts_[idx].load(std::memory_order_acquire);
  if (p == nullptr || p->mac() != mac || !p->inUse.load(std::memory_order_relaxed)) return nullptr;
  return p;
}

}  // namespace cofab::transport::dpdk
