// What cofab-info says about each optional backend: whether it was built, and whether it can be
// used on this machine right now (with the reason when not).
#pragma once

#include <string>
#include <vector>

namespace cofab {

struct BackendReport {
  std::string name;    // "isal", "dpdk", "rdma", "cuda"
  bool built = false;
  bool usable = false;
  std::string detail;  // version, devices found, or why it cannot be used
};

std::vector<BackendReport> probeBackends();

}  // namespace cofab
