// Network-namespace topologies for tests and benches that run DPDK af_packet ports on veths:
// a Linux bridge with N veth pairs (a shared L2 segment), or a single veth pair, made inside a
// namespace the calling process unshares, so that everything goes when the processes exit.
//
// Needs the rights to unshare a network namespace (root) and iproute2 (`ip`); the make*
// functions return the reason text when they cannot, for the caller's skip.
// Who calls what (every caller is a forked child, never the test process itself):
//   - the hub process: makeBridgeNetns / makeVethPairNetns (unshares, builds the links), forks its
//     peers, then moveToNetnsOf(iface, peer pid) for each peer's veth end;
//   - each peer process: unshareNetns() first thing, then bringUp(its iface), which waits until
//     the hub has moved the iface in, brings it up and waits for carrier.
// Why one namespace per af_packet process: DPDK 22.11's af_packet port joins a PACKET_FANOUT
// group numbered (pid ^ ifindex) & 0xffff, and fanout groups are per namespace, so two ports in
// one namespace collide about every other run and the second port fails to probe (docs/DPDK.md).
// IPv6 is off in these namespaces, so the ports see only the test's own frames.
#pragma once

#include <sys/types.h>

#include <string>

#include "core/status.h"

namespace cofab::testing {

// The bridge-side veth end of pair i ("cfd<i>"); its peer "cfb<i>" is enslaved to bridge cfbr0.
std::string bridgeVeth(int i);

// In the calling process: unshares a new network namespace and turns IPv6 off there for
// interfaces made or moved in later. "" or the reason ("unshare(CLONE_NEWNET): <errno text>").
std::string unshareNetns();

// In the calling (forked) process: unshareNetns(), lo up, bridge cfbr0 up, `pairs` veth pairs
// cfd<i>/cfb<i> with cfb<i> enslaved and up, and cfd0 up (the hub's own end). "" or the reason.
std::string makeBridgeNetns(int pairs);

// In the calling (forked) process: unshareNetns() and one veth pair a/b (both down). "" or the
// reason.
std::string makeVethPairNetns(const std::string& a, const std::string& b);

// Whether `iface` is up with carrier (IFF_UP and IFF_RUNNING) within `ms`. Asked with ioctl in
// this process's namespace: /sys/class/net shows the namespace sysfs was mounted in.
bool linkUp(const std::string& iface, int ms);

// In the hub: waits (up to `ms`) until process `pid` is in a network namespace other than this
// one (it called unshareNetns), then moves `iface` into it.
[[nodiscard]] Status moveToNetnsOf(const std::string& iface, pid_t pid, int ms);

// In the receiving process (or the hub, for its own end): waits up to `ms` for `iface` to be in
// this namespace, turns IPv6 off on it, sets it up and waits up to `ms` more for carrier.
[[nodiscard]] Status bringUp(const std::string& iface, int ms);

}  // namespace cofab::testing
