// The dpdk transport: Ethernet/IPv4/UDP frames sent and received from user space through DPDK,
// with its own reliability (sequence numbers, cumulative + selective acks, retransmission with
// backoff, a flow-control window, drain before close). The only header of fabric/transport/dpdk/
// meant for use outside it. docs/DPDK.md explains running over vdevs or real ports.
//
// EAL starts once per process, at the first context (COFAB_DPDK_EAL_ARGS, COFAB_DPDK_VDEV);
// when it cannot, createContext() returns Unavailable with the reason. Each context borrows one
// DPDK port for its lifetime and runs one poller thread, which runs all of its callbacks. With
// no vdev and no PCI port, contexts of one process talk through in-process ring ports.
//
// Addresses are "<mac>/<ipv4>:<udp port>", e.g. "02:cf:ab:00:00:01/10.0.0.1:47001": what a
// listener's address() returns and what peers exchange through the Store (no ARP).
//
// Parameters (environment, see `cofab-info`): COFAB_DPDK_EAL_ARGS, COFAB_DPDK_VDEV,
// COFAB_DPDK_PORT, COFAB_DPDK_IP, COFAB_DPDK_UDP_PORT, COFAB_DPDK_MTU, COFAB_DPDK_MBUFS,
// COFAB_DPDK_PEER_TIMEOUT_MS, COFAB_DPDK_DROP_RATE, COFAB_DPDK_DROP_SEED, COFAB_DPDK_IDLE_SPIN_US,
// COFAB_DPDK_IDLE_NAP_US. Fields set in
// DpdkOptions win over them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "fabric/transport/context.h"

namespace cofab::transport::dpdk {

struct DpdkOptions {
  std::string port;       // DPDK port name (e.g. "net_memif0"); empty: COFAB_DPDK_PORT
  std::string ip;         // dotted IPv4; empty: COFAB_DPDK_IP, else derived from the MAC
  int udpPort = 0;        // 0: COFAB_DPDK_UDP_PORT
  double dropRate = -1;   // < 0: COFAB_DPDK_DROP_RATE (received frames dropped, seeded)
  int64_t dropSeed = -1;  // < 0: COFAB_DPDK_DROP_SEED
  // For tests: the fraction of received frames, in [0, 0.5], replaced by a copy with one bit
  // flipped anywhere in it, past the UDP header in Syn/SynAck (seeded with the drop seed); half of
  // the time the intact frame is received first, so the corrupted one arrives as its duplicate.
  // Corrupted frames then meet every receive path (most flips land in a payload); the checks must
  // catch them all, and a flip in the bytes nothing checks (Ethernet header, UDP ports) must do no
  // harm.
  double corruptRate = 0;
  // For tests: the fraction of received Data frames, in [0, 1], dropped while acks, keepalives
  // and control frames pass (seeded with the drop seed). 1 is a link that loses full-size frames
  // only, as one with a smaller MTU than COFAB_DPDK_MTU would.
  double dropDataRate = 0;
  int64_t peerTimeoutMs = 0;  // 0: COFAB_DPDK_PEER_TIMEOUT_MS
  // Idle policy of the poller: spin this long without work, then nap (PMD ports: idleNapUs; ring
  // ports sleep until their peer wakes them). -1: busy-poll forever (latency-sensitive users
  // with a core to spare); < -1: COFAB_DPDK_IDLE_SPIN_US (default 50).
  int64_t idleSpinUs = -2;
  int64_t idleNapUs = 0;  // 0: COFAB_DPDK_IDLE_NAP_US (default 100)
  // Frames a connection keeps in the pipe: sent past the newest one the peer has (cumulatively
  // or selectively) acknowledged, 1..1024. 0: COFAB_DPDK_PIPE_FRAMES (default 128). The window
  // (1024 frames from the oldest unacknowledged one) still bounds the sequence range; this bounds
  // what queues in the rings between the two pollers, so a retransmission does not wait behind a
  // full ring (docs/DPDK.md, "Pipe limit").
  int64_t pipeFrames = 0;
};

StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const DpdkOptions& dpdk = {});

// What a context's poller counted. Malformed or foreign frames are counted and dropped, never
// logged per frame.
struct DpdkStats {
  uint64_t rxFrames = 0;
  uint64_t txFrames = 0;
  uint64_t rxForeign = 0;            // not IPv4/UDP/cofab, or not for this context's IP/port
  uint64_t rxBadLength = 0;          // IP/UDP/frame lengths inconsistent
  uint64_t rxBadChecksum = 0;        // IPv4 header checksum or frame CRC32C wrong
  uint64_t rxBadHeader = 0;          // cofab frame with another version or an unknown kind
  uint64_t rxUnknownConnection = 0;  // well-formed, but for no connection or listener here
  uint64_t rxInjectedDrops = 0;      // dropped by COFAB_DPDK_DROP_RATE or dropDataRate
  uint64_t rxDuplicates = 0;
  uint64_t rxOutOfWindow = 0;
  uint64_t retransmits = 0;
  uint64_t timeouts = 0;  // retransmission timeouts (each backs off the RTO)
  uint64_t txDrops = 0;   // frames the port refused
  // For cost and loss-efficiency figures (bench/dpdk): Data frames built (first transmissions;
  // retransmissions are `retransmits`), Data frames delivered in order to the application side,
  // and the CPU time the poller thread has used so far (CLOCK_THREAD_CPUTIME_ID; its total once
  // it has stopped).
  uint64_t txDataFrames = 0;
  uint64_t rxDataDelivered = 0;
  uint64_t pollerCpuNs = 0;
  // Wall time of the poller's loop iterations that did work (idle spins and naps excluded, and
  // iterations over 200 us: those were preempted by another process).
  uint64_t pollerBusyNs = 0;
  // Why a connection with data to send stopped building frames (counted once per poller step):
  // the in-flight window was full (waiting on the oldest unacked frame: a hole being repaired),
  // the pipe limit (waiting on acks of frames already on their way), or the receiver's
  // advertised window (waiting on its application), the pool's reserve (mbufs held elsewhere),
  // or a TX backlog the port has not taken yet (the peer not draining its ring).
  uint64_t txStallInFlight = 0;
  uint64_t txStallPeerWindow = 0;
  uint64_t txStallPool = 0;
  uint64_t txStallPipe = 0;            // the pipe limit (DpdkOptions::pipeFrames) was reached
  uint64_t rxInjectedCorruptions = 0;  // bits flipped by DpdkOptions::corruptRate
  // Data frames whose payload went straight into the posted receive while their CRC was
  // checked (one pass over the bytes; docs/DPDK.md, "Frame format").
  uint64_t rxDataPlaced = 0;
  uint64_t txStallBacklog = 0;  // (with the other txStall* above)
};

// InvalidArgument if `context` is not a dpdk context.
StatusOr<DpdkStats> stats(const Context& context);

// For tests: hands `frame` (a whole Ethernet frame) to the context's poller as if its port had
// received it. ResourceExhausted when the injection queue or the pool is full.
Status injectFrame(Context& context, std::span<const uint8_t> frame);

// For tests: a dpdk connection's own id and its peer's, as its frames carry them (dstConn and
// srcConn of what the peer sends). InvalidArgument if `connection` is not a dpdk connection.
struct ConnectionIds {
  uint32_t local = 0;
  uint32_t peer = 0;
};
StatusOr<ConnectionIds> connectionIds(const Connection& connection);

// The address a context's connections send from ("<mac>/<ip>:<udp port>").
StatusOr<std::string> localAddress(const Context& context);

}  // namespace cofab::transport::dpdk
