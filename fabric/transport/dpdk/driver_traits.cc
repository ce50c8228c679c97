#include "fabric/transport/dpdk/driver_traits.h"

namespace cofab::transport::dpdk {

bool rxArrivesCold(std::string_view driver, std::string_view vdevSpec) {
  if (driver == "net_af_packet") return false;
  if (driver == "net_memif") return vdevSpec.find("zero-copy=yes") != std::string_view::npos;
  return true;
}

}  // namespace cofab::transport::dpdk
