#include "fabric/transport/dpdk/port.h"

#include <rte_errno.h>
#include <rte_ethdev.h>

#include <cstring>

#include "fabric/transport/dpdk/eal.h"

namespace cofab::transport::dpdk {

Status dpdkError(StatusCode code, std::string_view call, int err) {
  return Status(code, std::string(call) + " failed: " + rte_strerror(err < 0 ? -err : err) +
                          " (rte_errno " + std::to_string(err < 0 ? -err : err) + ")");
}

uint16_t Port::rxBurst(rte_mbuf** pkts, uint16_t n) {
  return rte_eth_rx_burst(portId_, 0, pkts, n);
}

uint16_t Port::txBurst(rte_mbuf** pkts, uint16_t n) {
  const uint16_t sent = rte_eth_tx_burst(portId_, 0, pkts, n);
  if (ringTx_ == nullptr || sent == 0) return sent;
  // The software switch: move what the ring PMD just queued to the destination's RX ring. One
  // peer lookup per run of frames to the same MAC (a burst usually goes to one peer).
  rte_mbuf* batch[64];
  unsigned got;
  while ((got = rte_ring_sc_dequeue_burst(ringTx_, reinterpret_cast<void**>(batch), 64, nullptr)) >
         0) {
    unsigned i = 0;
    while (i < got) {
      const auto* eth = rte_pktmbuf_mtod(batch[i], const uint8_t*);
      MacAddress dst;
      std::memcpy(dst.data(), eth, 6);
      unsigned j = i + 1;
      while (j < got && std::memcmp(rte_pktmbuf_mtod(batch[j], const uint8_t*), dst.data(), 6) == 0)
        ++j;
      Port* peer = eal_->ringPeer(dst);
      unsigned put = 0;
      if (peer != nullptr) {
        put = rte_ring_mp_enqueue_burst(peer->ringRx_, reinterpret_cast<void**>(batch + i), j - i,
                                        nullptr);
        if (put > 0) peer->waker().wake();
      }
      // Unknown MAC or a full RX ring: the frame is lost, as on a wire; reliability resends it.
      for (unsigned k = i + put; k < j; ++k) rte_pktmbuf_free(batch[k]);
      i = j;
    }
  }
  return sent;
}

}  // namespace cofab::transport::dpdk
