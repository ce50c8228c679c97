// What the poller assumes of a driver (fabric/transport/dpdk/driver_traits.h): pure, no EAL needed.
#include <gtest/gtest.h>

#include "fabric/transport/dpdk/driver_traits.h"

namespace cofab::transport::dpdk {
namespace {

// The receive prefetch pays where the polling core is the first to touch a frame's bytes and
// costs where the driver just copied them on this core (bench/RESULTS.md, session 15).
TEST(DpdkDriverTraitsTest, ReceivedBytesAreColdUnlessTheDriverCopiedThemOnThisCore) {
  EXPECT_FALSE(rxArrivesCold("net_af_packet", "net_af_packet0,iface=veth0"));
  EXPECT_FALSE(rxArrivesCold("net_memif", "net_memif0,role=server,socket=/tmp/m.sock"));
  EXPECT_FALSE(rxArrivesCold("net_memif", ""));
  EXPECT_TRUE(
      rxArrivesCold("net_memif", "net_memif0,role=client,socket=/tmp/m.sock,zero-copy=yes"));
  EXPECT_TRUE(rxArrivesCold("net_ring", ""));  // the sending context's poller wrote them
  EXPECT_TRUE(rxArrivesCold("net_ice", ""));   // a NIC's DMA
}

}  // namespace
}  // namespace cofab::transport::dpdk
