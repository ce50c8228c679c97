#include "tests/support/veth_netns.h"

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/clock.h"

namespace cofab::testing {
namespace {

void disableIpv6(const std::string& conf) {
  std::ofstream("/proc/sys/net/ipv6/conf/" + conf + "/disable_ipv6") << "1";
}

std::string netnsOf(const std::string& pid) {
  char buf[64] = {};
  const ssize_t n = ::readlink(("/proc/" + pid + "/ns/net").c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

void pause10ms() { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }

}  // namespace

std::string bridgeVeth(int i) { return "cfd" + std::to_string(i); }

std::string unshareNetns() {
  if (::unshare(CLONE_NEWNET) != 0) {
    return std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
  }
  disableIpv6("default");
  return "";
}

std::string makeBridgeNetns(int pairs) {
  if (std::string why = unshareNetns(); !why.empty()) return why;
  const std::string cmd =
      "ip link set lo up && ip link add cfbr0 type bridge && ip link set cfbr0 up && "
      "i=0; while [ $i -lt " +
      std::to_string(pairs) +
      " ]; do ip link add cfd$i type veth peer name cfb$i && "
      "ip link set cfb$i master cfbr0 && ip link set cfb$i up || exit 1; i=$((i+1)); done && "
      "ip link set cfd0 up";
  if (std::system(cmd.c_str()) != 0) {
    return "cannot make a bridge with veth pairs in a new network namespace";
  }
  return "";
}

std::string makeVethPairNetns(const std::string& a, const std::string& b) {
  if (std::string why = unshareNetns(); !why.empty()) return why;
  if (std::system(("ip link add " + a + " type veth peer name " + b).c_str()) != 0) {
    return "cannot create a veth pair in a new network namespace (ip link add type veth)";
  }
  return "";
}

bool linkUp(const std::string& iface, int ms) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  const Deadline deadline = Deadline::afterMs(ms);
  bool up = false;
  for (;;) {
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", iface.c_str());
    up = ::ioctl(fd, SIOCGIFFLAGS, &req) == 0 && (req.ifr_flags & IFF_UP) &&
         (req.ifr_flags & IFF_RUNNING);
    if (up || deadline.expired()) break;
    pause10ms();
  }
  ::close(fd);
  return up;
}

Status moveToNetnsOf(const std::string& iface, pid_t pid, int ms) {
  // Moving before the peer has unshared would leave the iface in this namespace (the peer's
  // current one), so wait until its namespace differs from ours.
  const std::string self = netnsOf("self");
  const std::string peer = std::to_string(pid);
  const Deadline deadline = Deadline::afterMs(ms);
  for (;;) {
    const std::string ns = netnsOf(peer);
    if (!ns.empty() && ns != self) break;
    if (deadline.expired()) {
      return DeadlineExceeded("process " + peer + " did not unshare its network namespace within " +
                              std::to_string(ms) + " ms (" + iface + " not moved)");
    }
    pause10ms();
  }
  if (std::system(("ip link set " + iface + " netns " + peer).c_str()) != 0) {
    return Internal("ip link set " + iface + " netns " + peer + " failed");
  }
  return OkStatus();
}

Status bringUp(const std::string& iface, int ms) {
  const Deadline moved = Deadline::afterMs(ms);
  while (::if_nametoindex(iface.c_str()) == 0) {
    if (moved.expired()) return DeadlineExceeded(iface + " was not moved into this namespace");
    pause10ms();
  }
  disableIpv6(iface);
  if (std::system(("ip link set " + iface + " up").c_str()) != 0) {
    return Internal("ip link set " + iface + " up failed");
  }
  if (!linkUp(iface, ms)) return DeadlineExceeded(iface + " has no carrier");
  return OkStatus();
}

}  // namespace cofab::testing
