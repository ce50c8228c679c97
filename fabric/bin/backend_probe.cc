#include "fabric/bin/backend_probe.h"

#include "core/config.h"
#include "fabric/transport/registry.h"
#include "gpu/device.h"
#if COFAB_HAVE_RDMA
#include "fabric/transport/rdma/verbs_api.h"
#endif

namespace cofab {
namespace {

// RDMA is probed through the rdma transport's own verbs function table (dlopen of
// libibverbs.so.1), so the report is what the transport itself will see. ibv_get_device_list
// may return NULL (errno 38 on kernels without RDMA support) as well as an empty list.
BackendReport probeRdma() {
  BackendReport r{"rdma", COFAB_HAVE_RDMA != 0, false, ""};
#if COFAB_HAVE_RDMA
  auto verbs = transport::rdma::loadRealVerbs();
  if (!verbs.ok()) {
    r.detail = verbs.status().message();
    return r;
  }
  auto devices = transport::rdma::listDevices(**verbs);
  if (!devices.ok()) {
    r.detail = devices.status().message();
    return r;
  }
  r.usable = true;
  r.detail = std::to_string(devices->names.size()) + " device(s):";
  for (const auto& n : devices->names) r.detail += " " + n;
  r.detail += " (select with COFAB_IB_DEVICE, COFAB_IB_PORT, COFAB_IB_GID_INDEX)";
#else
  r.detail = "built without RDMA support (COFAB_WITH_RDMA=OFF or infiniband/verbs.h not found)";
#endif
  return r;
}

}  // namespace

std::vector<BackendReport> probeBackends() {
  std::vector<BackendReport> out;
  out.push_back({"isal", COFAB_HAVE_ISAL != 0, COFAB_HAVE_ISAL != 0,
                 COFAB_HAVE_ISAL ? "Intel ISA-L linked" : "built without ISA-L: portable codec"});
#if COFAB_HAVE_DPDK
  // Probed for real: starting EAL is what a job would do first, and cofab-info is a short-lived
  // process of its own, so taking EAL here costs nothing later.
  {
    auto ctx = transport::Registry::create("dpdk", {});
    std::string detail = std::string("DPDK ") + COFAB_DPDK_VERSION + ": ";
    if (ctx.ok()) {
      detail += "EAL started (COFAB_DPDK_EAL_ARGS / COFAB_DPDK_VDEV)";
      (*ctx)->join();
    } else {
      detail += ctx.status().message();
    }
    out.push_back({"dpdk", true, ctx.ok(), detail});
  }
#else
  out.push_back({"dpdk", false, false, "built without DPDK (COFAB_WITH_DPDK=OFF or not found)"});
#endif
  out.push_back(probeRdma());
  auto gpus = gpu::deviceCount();
  out.push_back({"cuda", COFAB_HAVE_CUDA != 0, gpus.ok(), gpu::describeDevices()});
  return out;
}

}  // namespace cofab
