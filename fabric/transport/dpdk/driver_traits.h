// What a DPDK driver does with the frames it receives, as far as the poller cares: pure
// functions of the driver's name and the port's --vdev value, so no EAL is needed to test them.
// Internal to fabric/transport/dpdk.
#pragma once

#include <string_view>

namespace cofab::transport::dpdk {

// Whether a port's received bytes were last written by another core or by a device rather than
// copied in by the driver on the polling core: true for NICs (DMA), ring ports (the sending
// context's poller wrote them) and memif's zero-copy client (the server's core copied them into
// our mbufs); false for drivers that copy each frame on receive (af_packet, memif in copy mode),
// where the bytes are already in cache and a prefetch only costs (measured: bench/RESULTS.md,
// session 15). `driver` is rte_eth_dev_info's driver_name, `vdevSpec` the port's --vdev value
// ("" for none).
bool rxArrivesCold(std::string_view driver, std::string_view vdevSpec);

}  // namespace cofab::transport::dpdk
